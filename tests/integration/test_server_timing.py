"""Server-Timing through nginx (app/request/stages.py, docs/observability.md): the gateway's
own time by stage on every answer of every door, streamed and not; a stream's relay time in
its last comment; the stages adding up to nginx's own timing of the call; the same figures in
the log line and the metric; none of it with LLMGATE_SERVER_TIMING=false."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from tests.support.bodies import chat_about
from tests.support.keys_file import keys_toml
from tests.support.server_timing import relay_of, stages
from tests.support.stack import StackHandle
from tests.support.waiting import wait_for

# Each door's call, by its path and body (the default stack's simulator answers them all).
DOORS = {
    "chat": ("/v1/chat/completions", lambda tag: chat_about(tag, max_tokens=5)),
    "responses": ("/v1/responses", lambda tag: {"model": "sim-model", "input": tag,
                                                "max_output_tokens": 5}),
    "messages": ("/v1/messages", lambda tag: {"model": "sim-model", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": tag}]}),
}  # fmt: skip
# The first line of each door's end event, which the relay comment comes just before.
END = {"chat": rb"data: \[DONE\]\n\n$", "messages": rb"event: message_stop\n",
       "responses": rb"event: response\.completed\n"}  # fmt: skip
# The stages every answer that went upstream names, in the order the header gives them.
UPSTREAM_STAGES = ["queue", "connect", "upstream", "work", "gateway"]
SECRET = "llmg-server-timing-test-key"


def _call(gw: StackHandle, door: str, stream: bool, **headers: str):
    path, body = DOORS[door]
    rid = f"st-{uuid.uuid4().hex}"
    resp = gw.post(
        path,
        {**body(rid), "stream": stream},
        headers={"X-Request-ID": rid, "anthropic-version": "2023-06-01", **headers},
        preload_content=False,
    )
    data = resp.read()
    resp.release_conn()
    assert resp.status == 200, data[:300]
    return resp, data, rid


def _nginx_line(gw: StackHandle, rid: str) -> dict:
    """nginx's own JSON access line of the call (nginx/llmgate.conf.template), written once
    the call is done: waited for."""
    log = gw.stack.options.run_dir / "nginx" / "logs" / "access.log"

    def lines() -> list[str]:
        return [line for line in log.read_text().splitlines() if rid in line]

    assert wait_for(lines), f"nginx logged no line of {rid}"
    return json.loads(lines()[-1])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("door", sorted(DOORS))
def test_every_door_says_its_stages_through_nginx(gw, door: str, stream: bool) -> None:
    resp, data, rid = _call(gw, door, stream, **{"x-sim-ttft-ms": "120"})
    timing = stages(resp.headers["Server-Timing"])
    assert [name for name in timing if name in UPSTREAM_STAGES] == UPSTREAM_STAGES
    # The simulator's own wait before its first byte (a Responses stream's first event,
    # response.created, comes at once: the wait is before its first output).
    assert timing["upstream"] >= (0 if door == "responses" and stream else 120)
    body, relay = relay_of(data)
    if stream:
        # The last line: the relay's time per event, its median within its longest.
        assert relay is not None and 0 <= relay["relay"] <= relay["relay-max"]
        assert b"server-timing" not in body  # said once, at the end
        # A line at the head of the end event's block, not an event (nor a block) of its own.
        assert re.search(rb"relay-max;dur=[0-9.]+\n" + END[door], data) and data.endswith(b"\n\n")
    else:
        assert relay is None and json.loads(body)
    line = gw.logged(rid)
    assert line["timing_ms"]["upstream"] == pytest.approx(timing["upstream"], abs=0.11)
    assert ("relay" in line["timing_ms"]) is stream


def test_the_stages_add_up_to_nginxs_time_of_the_call(gw) -> None:
    """None overlaps another: ``work``, the rest, is not below 0; together they are the
    time nginx waited for gunicorn ($upstream_response_time, to the millisecond: the
    header is made a moment before the body's last byte leaves, stated margin 25 ms)."""
    for _ in range(3):
        resp, _, rid = _call(gw, "chat", False, **{"x-sim-ttft-ms": "200"})
        timing = stages(resp.headers["Server-Timing"])
        parts = sum(v for k, v in timing.items() if k != "gateway")
        assert timing["work"] >= -0.3  # each figure is rounded to a tenth of a ms
        assert timing["gateway"] == pytest.approx(parts - timing["upstream"], abs=0.3)
        # The simulator times its 200 ms on its loop's clock, read at the loop's turn: by
        # the gateway's clock its wait may end a few milliseconds early.
        assert 200 - 10 <= timing["upstream"] < 200 + 150
        nginx_ms = float(_nginx_line(gw, rid)["upstream_response_time"]) * 1000
        assert nginx_ms - 25 <= parts <= nginx_ms + 2


def test_no_queue_stage_without_nginx(gw) -> None:
    resp = gw.post(
        "/v1/chat/completions", chat_about(uuid.uuid4().hex, max_tokens=3), base=gw.app_url
    )
    timing = stages(resp.headers["Server-Timing"])
    assert "queue" not in timing and "upstream" in timing and "gateway" in timing


def test_a_keyed_call_says_its_auth_and_connect_and_the_metric_has_every_stage(
    make_stack, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_toml([("team", "requests_per_minute = 1000")], lambda _: SECRET))
    gw = make_stack(env={"LLMGATE_KEYS_FILE": str(keys)})
    resp, _, _ = _call(gw, "chat", False, Authorization=f"Bearer {SECRET}")
    timing = stages(resp.headers["Server-Timing"])
    assert list(timing)[:2] == ["queue", "auth"] and timing["auth"] > 0
    # The stack's first call: its worker had no upstream connection yet, and made one.
    assert timing["connect"] > 0
    _call(gw, "chat", True, Authorization=f"Bearer {SECRET}")
    for stage in ("queue", "auth", "connect", "work", "gateway", "relay", "relay_max"):
        assert gw.metric("llmgate_added_seconds_count", route="chat", stage=stage) >= 1, stage
    assert gw.metric("llmgate_added_seconds_count", route="chat", stage="upstream", default=0) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("door", sorted(DOORS))
def test_none_of_it_when_the_setting_says_so(make_stack, door: str, stream: bool) -> None:
    gw = make_stack(env={"LLMGATE_SERVER_TIMING": "false"})
    resp, data, rid = _call(gw, door, stream)
    assert "Server-Timing" not in resp.headers
    assert relay_of(data)[1] is None and b"server-timing" not in data
    assert "timing_ms" not in gw.logged(rid)
