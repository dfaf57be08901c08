"""A key's budgets and stream slots settle the same way on every door, over every kind of
upstream, whether the stream is resumable or not: counted from outside.

What the upstream generated is the simulator's own count (``tokens`` in /sim/stats: the
prompt and the completion of every answer it made); what the key was charged is
``/admin/usage``. A caller leaves by closing its socket after a few events. The rule
(docs/security.md): a stream whose caller left keeps its reservation until the upstream's
own end, then settles on the upstream's usage (a resumable stream, read to its end for a
resume) or keeps the reservation (a stream whose upstream call stopped with its caller);
its stream slot is held as long as the upstream runs; an upstream that reports no usage
leaves the reservation standing.
"""

from __future__ import annotations

import json
import time

import anthropic
import pytest
import urllib3

from llmgate_wire import sse
from tests.support.keys_file import keys_toml
from tests.support.kinds import kinds_toml
from tests.support.sim import sim_stats
from tests.support.sse_reader import drop, read_data
from tests.support.stack import NOWHERE, file_stack
from tests.support.waiting import wait_for

WINDOW_S = 30
KINDS = ("openai", "anthropic")
KEYS = {
    **{f"day3000-{kind}": "tokens_per_day = 3000" for kind in KINDS},
    **{f"two-{kind}": "max_streams = 2" for kind in KINDS},
    **{
        f"meter-{door}-{kind}": "tokens_per_day = 100000000"
        for door in ("chat", "messages")
        for kind in KINDS
    },
    "meter-no-usage": "tokens_per_day = 100000000",
}
http = urllib3.PoolManager(maxsize=32, retries=False, timeout=urllib3.Timeout(connect=5, read=30))


def secret(name: str) -> str:
    return f"llmg-{name}-settle-secret"


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    """This module's simulator answers at its own pace (its defaults): callers leave mid-stream."""
    return ()


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, upstream_sim):
    return file_stack(
        make_stack, tmp_path_factory.mktemp("settle-config"), kinds_toml(upstream_sim),
        keys=keys_toml(KEYS.items(), secret), env={"LLMGATE_RESUME_WINDOW_S": str(WINDOW_S)},
        instances=2, workers=2, upstream_url=NOWHERE,
    )  # fmt: skip


def body(door: str, kind: str, tokens: int, prompt: str) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"model": f"m-{kind}", "max_tokens": tokens, "stream": True, "messages": messages}


def open_stream(
    gw,
    door: str,
    kind: str,
    key: str,
    *,
    tokens: int,
    tps: int,
    resumable: bool,
    prompt: str = "settle me",
    **extra: str,
) -> urllib3.BaseHTTPResponse:
    path = "/v1/messages" if door == "messages" else "/v1/chat/completions"
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {secret(key)}",
        "x-sim-tps": str(tps),
        "x-sim-tokens": str(tokens),
        **extra,
    }
    if door == "messages":
        headers["anthropic-version"] = "2023-06-01"
    if resumable:
        headers["X-LLMGate-Resumable"] = "true"
    return http.request(
        "POST",
        gw.url + path,
        body=json.dumps(body(door, kind, tokens, prompt)),
        headers=headers,
        preload_content=False,
    )


def read_events(resp: urllib3.BaseHTTPResponse, n: int | None) -> list[sse.Event]:
    """Events (pings and comments skipped) until ``n`` of them, or the end."""
    return read_data(resp, n, skip={'{"type":"ping"}'})


def usage(gw, key: str) -> dict:
    resp = http.request("GET", gw.url + "/admin/usage")
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}[key]


def sim_tokens(sim: str) -> int:
    return int(sim_stats(sim)["tokens"])


def settled(gw, sim: str, key: str, *, before: int) -> tuple[int, int]:
    """(tokens the key was charged, tokens the simulator generated since ``before``), once
    the key's streams are all settled (none open, and the charge stops moving)."""
    last: list[int] = []

    def still() -> bool:
        row = usage(gw, key)
        last.append(row["tokens_today"] or 0)
        return (row["streams_open"] or 0) == 0 and len(last) > 3 and len(set(last[-3:])) == 1

    assert wait_for(still, timeout=40, every=0.3), last[-5:]
    return last[-1], sim_tokens(sim) - before


# -- A: resumable Messages streams hold their reservations and slots ---------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_resumable_messages_streams_whose_callers_left_stay_within_a_daily_budget(
    gw, upstream_sim, kind
):
    """Six resumable 1,000-token Messages streams, each caller gone after two events: only
    as many are admitted as their reservations fit in 3,000 tokens; each admitted one is
    read to its end by a resume and billed its own usage, which equals what the simulator
    generated for it."""
    key, before = f"day3000-{kind}", sim_tokens(upstream_sim)
    ids: list[str] = []
    refused = 0
    for n in range(6):
        resp = open_stream(
            gw, "messages", kind, key, tokens=1000, tps=400, resumable=True, prompt=f"budget {n}"
        )
        if resp.status == 429:
            refused += 1
            resp.read()
            resp.release_conn()
            continue
        assert resp.status == 200, resp.data
        assert resp.headers["X-LLMGate-Resumable"].startswith("yes")
        seen = read_events(resp, 2)
        assert len(seen) >= 2 and b"message_stop" not in seen[-1].raw
        assert seen[-1].id is not None
        ids.append(seen[-1].id)
        drop(resp)
    assert refused >= 3 and len(ids) <= 3, (len(ids), refused)
    for last in ids:  # the rest of each answer, by a resume
        stream_id = last.split(":")[0]
        resumed = http.request(
            "GET",
            gw.url + f"/v1/streams/{stream_id}",
            headers={"Authorization": f"Bearer {secret(key)}", "Last-Event-ID": last},
        )
        assert resumed.status == 200 and b"event: message_stop" in resumed.data
    charged, generated = settled(gw, upstream_sim, key, before=before)
    assert generated <= 3000
    assert charged == generated, (charged, generated)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_resumable_messages_streams_slot_is_held_while_its_upstream_runs(gw, upstream_sim, kind):
    """max_streams = 2: two resumable Messages streams whose callers left after two events
    still run upstream, so a third is refused and /admin/usage says 2 open; once they end,
    the slots are free."""
    key = f"two-{kind}"
    running = []
    for n in range(2):
        resp = open_stream(
            gw, "messages", kind, key, tokens=300, tps=60, resumable=True, prompt=f"slot {n}"
        )
        assert resp.status == 200, resp.data
        assert len(read_events(resp, 2)) >= 2
        drop(resp)
        running.append(resp)
    time.sleep(0.5)  # the drops are seen (the socket watcher) and the callers' ends run
    third = open_stream(gw, "messages", kind, key, tokens=10, tps=1000, resumable=True)
    assert third.status == 429, third.data
    third.read()
    third.release_conn()
    assert usage(gw, key)["streams_open"] == 2
    assert wait_for(lambda: usage(gw, key)["streams_open"] == 0, timeout=20, every=0.3)
    again = open_stream(gw, "messages", kind, key, tokens=10, tps=1000, resumable=True)
    assert again.status == 200
    read_events(again, None)


# -- B: a caller who leaves is charged the reservation on every door ---------------------------
@pytest.mark.parametrize("door", ("chat", "messages"))
@pytest.mark.parametrize("kind", KINDS)
def test_a_caller_who_leaves_mid_stream_keeps_the_reservation(gw, upstream_sim, door, kind):
    """A 300-token stream whose caller leaves after a few events: the upstream call stops
    with it, and the key is charged the call's reservation (its prompt's bound and its
    max_tokens), never less than what the upstream generated for it."""
    key, before = f"meter-{door}-{kind}", sim_tokens(upstream_sim)
    charged_before = usage(gw, key)["tokens_today"] or 0
    resp = open_stream(gw, door, kind, key, tokens=300, tps=50, resumable=False)
    assert resp.status == 200
    assert len(read_events(resp, 4)) >= 4
    drop(resp)
    charged, generated = settled(gw, upstream_sim, key, before=before)
    charged -= charged_before
    assert charged >= 300 and charged >= generated, (charged, generated)


@pytest.mark.parametrize("door", ("chat", "messages"))
@pytest.mark.parametrize("stream", (True, False))
def test_an_upstream_without_usage_leaves_the_reservation_standing(gw, upstream_sim, door, stream):
    """An OpenAI-kind upstream that reports no usage at all (``include_usage`` ignored):
    whatever the door, streamed or not, read to its end, the key is charged the call's
    reservation, not the estimate a translation writes for the caller."""
    key, before = "meter-no-usage", sim_tokens(upstream_sim)
    charged_before = usage(gw, key)["tokens_today"] or 0
    path = "/v1/messages" if door == "messages" else "/v1/chat/completions"
    sent = {**body(door, "openai", 500, "no usage here"), "stream": stream}
    resp = http.request(
        "POST",
        gw.url + path,
        body=json.dumps(sent),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {secret(key)}",
            "anthropic-version": "2023-06-01",
            "x-sim-usage": "none",
            "x-sim-tokens": "400",
            "x-sim-tps": "2000",
        },
    )
    assert resp.status == 200, resp.data
    if stream:
        assert b"[DONE]" in resp.data or b"message_stop" in resp.data
    charged, generated = settled(gw, upstream_sim, key, before=before)
    charged -= charged_before
    assert generated >= 400
    assert charged >= 500 and charged >= generated, (charged, generated)


def test_the_anthropic_sdk_reads_the_settled_usage_of_a_whole_stream(gw, upstream_sim) -> None:
    """The other side of the rule: a Messages stream read to its end over an OpenAI-kind
    upstream that does report usage is billed exactly that usage."""
    key, before = "meter-messages-openai", sim_tokens(upstream_sim)
    charged_before = usage(gw, key)["tokens_today"] or 0
    client = anthropic.Anthropic(base_url=gw.url, api_key=secret(key), max_retries=0)
    with (
        client,
        client.messages.stream(
            model="m-openai",
            max_tokens=50,
            messages=[{"role": "user", "content": "count me"}],
            extra_headers={"x-sim-tokens": "20", "x-sim-tps": "2000"},
        ) as stream,
    ):
        final = stream.get_final_message()
    charged, generated = settled(gw, upstream_sim, key, before=before)
    assert final.usage.output_tokens == 20
    assert charged - charged_before == generated == final.usage.input_tokens + 20
