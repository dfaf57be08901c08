"""A stream cut inside a tool call's arguments: with the upstream's ``hold_tool_calls`` the
caller never sees part of a call, and the continuation's calls arrive whole; without it the
stream ends with its error event, as a cut tool call always did (docs/streams.md).

Two simulators answer the ``tools`` script (text ``Let me check.``, then two tool calls, their
arguments in fragments: docs/simulator.md). ``first`` is cut (its connection reset) inside a
call's arguments, once (its ``fail_times``); ``second`` continues the text handed back (the
simulator answers a scripted chat whose prefix turn is the script's leading text with the
script without it: simulator/continuing.py). The models name the settings: ``held`` is read
from ``first`` with ``hold_tool_calls``, ``bare`` from ``first`` without it; ``flaky`` is
cut on every call. The simulators' own counts and request logs are the independent source,
the arguments are compared with the script's own (simulator/scripts.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import urllib3

from llmgate_wire import sse
from simulator.scripts import TIME_ARGS, WEATHER_ARGS
from tests.support.sim import sim_requests, sim_stats, start_simulator
from tests.support.sse_reader import chat_stream
from tests.support.stack import NOWHERE, file_stack

http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30))
# The tools script's slots: 4 text pieces, get_weather's 19 fragments, get_time's 16.
IN_WEATHER, IN_TIME = 10, 30
CALLS = [
    ("call_sim_weather", "get_weather", json.dumps(WEATHER_ARGS, separators=(",", ":"))),
    ("call_sim_time", "get_time", json.dumps(TIME_ARGS, separators=(",", ":"))),
]
ENV = {"LLMGATE_BREAKER_COOLDOWN_S": "0.001", "LLMGATE_BREAKER_COOLDOWN_MAX_S": "0.001"}


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("hold-sims")
    procs = {
        name: start_simulator(logs, "--ttft-ms", "0", "--tps", "1000")
        for name in ("first", "second")
    }
    yield {name: url for name, (_, url) in procs.items()}
    for proc, _ in procs.values():
        proc.stop()


def upstream(name: str, url: str, models: str, hold: bool, fails: int, priority: int) -> str:
    return f"""
[[upstreams]]
name = "{name}"
base_url = "{url}/v1"
models = [{models}]
priority = {priority}
continuation = "prefix"
hold_tool_calls = {"true" if hold else "false"}
headers = {{ "x-sim-fail-times" = "{fails}" }}
"""


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, sims):
    first, second = sims["first"], sims["second"]
    plan = (
        upstream("first", first, '"held"', True, 1, 0)
        + upstream("bare", first, '"bare"', False, 1, 0)
        + upstream("flaky", first, '"flaky"', True, 99, 0)
        + upstream("second", second, '"held", "bare"', True, 0, 1)
    )
    folder = tmp_path_factory.mktemp("hold-config")
    return file_stack(make_stack, folder, plan, env=ENV, workers=1, upstream_url=NOWHERE)


def reset(sims: dict[str, str]) -> None:
    for url in sims.values():
        http.request("POST", url + "/sim/reset")


def stream(gw, model: str, **sim: str) -> list[sse.Event]:
    """Every event of one chat stream of the tools script (comments too), as bytes decode."""
    body = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "weather and time?"}],
        "tools": [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
            for _, n, _ in CALLS
        ],
    }
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-caller"}
    headers["x-sim-script"] = "tools"
    headers.update({f"x-sim-{k}": v for k, v in sim.items()})
    return chat_stream(http, gw.url, body, headers)


def cut(slot: int) -> dict[str, str]:
    """A reset at ``slot``, which ``first`` makes once for this key."""
    return {"fault": "reset", "reset-after": str(slot), "fail-key": uuid.uuid4().hex}


def chunks(events: list[sse.Event]) -> list[dict]:
    return [json.loads(e.data) for e in events if e.data and e.data != sse.DONE]


def deltas(events: list[sse.Event]) -> list[dict]:
    return [c["delta"] for chunk in chunks(events) for c in chunk.get("choices", [])]


def calls(events: list[sse.Event]) -> list[tuple[str, str, str]]:
    """The tool calls as a caller accumulates them: (id, name, joined arguments) by index."""
    got: dict[int, list[str]] = {}
    for delta in deltas(events):
        for part in delta.get("tool_calls") or ():
            entry = got.setdefault(part["index"], ["", "", ""])
            entry[0] += part.get("id") or ""
            entry[1] += part.get("function", {}).get("name") or ""
            entry[2] += part.get("function", {}).get("arguments") or ""
    return [(i, n, a) for i, n, a in (got[k] for k in sorted(got))]


def text(events: list[sse.Event]) -> str:
    return "".join(d.get("content") or "" for d in deltas(events))


def asked(sims: dict[str, str]) -> dict[str, int]:
    return {name: sim_stats(url)["requests"] for name, url in sims.items()}


@pytest.mark.parametrize("slot", [IN_WEATHER, IN_TIME])
def test_with_hold_tool_calls_a_cut_call_arrives_whole_from_the_continuation(
    gw, sims, slot
) -> None:
    reset(sims)
    events = stream(gw, "held", **cut(slot))
    assert asked(sims) == {"first": 1, "second": 1}
    # The caller was shown no part of a call before the continuation took over.
    note = next(i for i, e in enumerate(events) if e.is_comment and e.comments != ("ping",))
    assert events[note].comments[0].startswith("llmgate: continued; upstream=second;")
    assert calls(events[:note]) == [] and text(events[:note]) == "Let me check."
    # The continuation was handed the text before the calls, and wrote them again, whole.
    turn = sim_requests(sims["second"])[0]["body"]["messages"][-1]
    assert turn == {"role": "assistant", "content": "Let me check.", "prefix": True}
    assert calls(events) == CALLS and text(events) == "Let me check."
    finishes = [c["finish_reason"] for ch in chunks(events) for c in ch["choices"]]
    assert [f for f in finishes if f] == ["tool_calls"]
    assert [e.data for e in events].count(sse.DONE) == 1 and events[-1].data == sse.DONE
    assert [e for e in events if e.comments == ("ping",)] == []  # a held read is no ping


def test_with_hold_tool_calls_an_uncut_stream_is_the_upstream_s(gw, sims) -> None:
    """Held and released at the finish, the calls are the script's, in its order."""
    reset(sims)
    events = stream(gw, "held")
    assert asked(sims) == {"first": 1, "second": 0}
    assert calls(events) == CALLS and text(events) == "Let me check."
    assert [e for e in events if e.is_comment] == []  # no note, and a held read is no ping


def test_without_hold_tool_calls_a_cut_call_ends_the_stream_with_its_error(gw, sims) -> None:
    reset(sims)
    events = stream(gw, "bare", **cut(IN_WEATHER))
    assert asked(sims) == {"first": 1, "second": 0}  # a shown call is never continued
    assert sse.DONE not in [e.data for e in events]
    assert "error" in chunks(events)[-1], chunks(events)[-1]
    ((call_id, name, arguments),) = calls(events)  # the part of a call the caller had
    assert (call_id, name) == CALLS[0][:2]
    assert CALLS[0][2].startswith(arguments) and arguments != CALLS[0][2]


def test_with_hold_tool_calls_a_call_never_continued_is_never_shown(gw, sims) -> None:
    """``flaky`` is cut on every call: when the continuations are used up, the stream ends
    with its error, and the caller had no part of a call."""
    reset(sims)
    events = stream(gw, "flaky", **cut(IN_WEATHER))
    assert asked(sims)["first"] > 1 and asked(sims)["second"] == 0
    assert sse.DONE not in [e.data for e in events]
    assert "error" in chunks(events)[-1], chunks(events)[-1]
    assert calls(events) == [] and text(events) == "Let me check."
