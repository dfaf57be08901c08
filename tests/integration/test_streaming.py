"""Streams through nginx → gunicorn (gevent) → simulator arrive event by event."""

from __future__ import annotations

import itertools
import json
import subprocess
import time

import pytest

from tests.conftest import require_binary
from tests.support.bodies import chat
from tests.support.server_timing import relay_of
from tests.support.sse_reader import content_of, data_events, read_events

GAP_S = 0.3  # the simulator emits one token every 300 ms


def test_each_event_arrives_before_the_next_is_emitted(gw) -> None:
    t0 = time.monotonic()
    resp = gw.post(
        "/v1/chat/completions",
        chat(True, max_tokens=6),
        preload_content=False,
        headers={"x-sim-tps": str(1 / GAP_S), "x-sim-ttft-ms": "0"},
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["Cache-Control"] == "no-cache"
    arrivals = data_events(read_events(resp))
    assert arrivals[-1].event.is_done
    tokens = [
        a
        for a in arrivals
        if '"content":"' in (a.event.data or "") and '"content":""' not in (a.event.data or "")
    ]
    assert len(tokens) == 6
    # Token k is emitted at about k * GAP_S; it must reach us before token k+1 is emitted,
    # i.e. well before (k + 1) * GAP_S. Buffering anywhere would bunch them at the end.
    for k, arrival in enumerate(tokens):
        assert arrival.at - t0 < (k + 1) * GAP_S + GAP_S * 0.9 + 0.5, f"token {k} was held back"
    gaps = [b.at - a.at for a, b in itertools.pairwise(tokens)]
    assert min(gaps) > GAP_S / 3, f"events arrived bunched together: {gaps}"
    assert gw.sim_stats()["streams_completed"] == 1


def test_stream_bytes_are_relayed_unchanged(gw) -> None:
    body = chat(True, max_tokens=5, stream_options={"include_usage": True})
    direct = gw.post("/v1/chat/completions", body, base=gw.sim_url).data
    relayed = gw.post("/v1/chat/completions", body).data

    def normalise(raw: bytes) -> list[dict | str]:
        # id and created differ per call; everything else must be byte-identical JSON.
        out = []
        for line in raw.split(b"\n\n"):
            if line.startswith(b"data: {"):
                obj = json.loads(line[6:])
                obj.pop("id"), obj.pop("created")
                out.append(obj)
            elif line:
                out.append(line.decode())
        return out

    # And the gateway's one line of its own, its relay time (Server-Timing's).
    unchanged, relay = relay_of(relayed)
    assert normalise(unchanged) == normalise(direct) and relay is not None
    assert relayed.endswith(b"data: [DONE]\n\n")


def test_curl_prints_events_incrementally(gw) -> None:
    curl = require_binary("curl")
    body = json.dumps(chat(True, max_tokens=4))
    seen = []
    with subprocess.Popen(
        [
            curl,
            "-sN",
            gw.url + "/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-H",
            "x-sim-tps: 3",
            "-H",
            "x-sim-ttft-ms: 0",
            "-d",
            body,
        ],
        stdout=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"data: "):
                seen.append((time.monotonic(), line))
    assert seen[-1][1].strip() == b"data: [DONE]"
    contents = [t for t, line in seen if b'"content":"' in line and b'"content":""' not in line]
    assert len(contents) == 4
    assert contents[-1] - contents[0] > 0.5, "curl got the whole stream at once"


def test_gzip_from_the_upstream_is_decoded_and_still_incremental(gw) -> None:
    resp = gw.post(
        "/v1/chat/completions",
        chat(True, max_tokens=4),
        preload_content=False,
        headers={"x-sim-fault": "gzip", "x-sim-tps": "4", "x-sim-ttft-ms": "0"},
    )
    assert resp.status == 200
    assert "Content-Encoding" not in resp.headers
    arrivals = data_events(read_events(resp))
    assert arrivals[-1].event.is_done
    assert content_of(arrivals)
    tokens = [a for a in arrivals if '"content":"' in (a.event.data or "")][1:]
    assert tokens[-1].at - tokens[0].at > 0.3


@pytest.mark.parametrize("fault", ["reset", "stall-after"])
def test_broken_stream_ends_with_an_error_event_not_silently(make_stack, fault: str) -> None:
    gw = make_stack(env={"LLMGATE_IDLE_TIMEOUT_S": "1"})
    resp = gw.post(
        "/v1/chat/completions",
        chat(True, max_tokens=10),
        preload_content=False,
        headers={"x-sim-fault": fault, "x-sim-ttft-ms": "0"},
    )
    assert resp.status == 200
    events = [a.event for a in data_events(read_events(resp))]
    assert not any(e.is_done for e in events)
    error = events[-1].json()["error"]
    assert error["code"] == ("upstream_reset" if fault == "reset" else "idle_timeout")
