"""Resumable streams (docs/streams.md), measured from outside: raw bytes on sockets through
nginx, the simulator's own counts of upstream calls, Memcached read directly.

The drops are real: the caller's socket is closed after it has read a given number of
events, and the resume is a new connection (to nginx, or straight to another instance).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from app.resume.record import ENDED, decode_chunk
from llmgate_wire import sse
from tests.conftest import require_binary
from tests.support.keys_file import keys_toml
from tests.support.memcached import memcached_get, memcached_keys
from tests.support.sse_reader import drop, read_data, text_of
from tests.support.stack import StackHandle, StackPool
from tests.support.waiting import wait_for

WINDOW_S = 6
RESUME_ENV = {"LLMGATE_RESUME_WINDOW_S": str(WINDOW_S)}
# Bounded reads: a resume that never ends fails its test instead of hanging it.
http = urllib3.PoolManager(maxsize=16, retries=False, timeout=urllib3.Timeout(connect=5, read=20))


# The simulator's chat stream of 47 words is 50 events: the role chunk, a chunk per word, the
# finish chunk, [DONE] (counted again in the first test).
WORDS, EVENTS = 47, 50


def chat_body(prompt: str, words: int = WORDS) -> dict:
    return {
        "model": "sim-small",
        "stream": True,
        "max_tokens": words,
        "messages": [{"role": "user", "content": prompt}],
    }


def open_stream(base: str, body: dict, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
    return http.request(
        "POST",
        base + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        preload_content=False,
    )


def read_n(resp: urllib3.BaseHTTPResponse, n: int | None) -> list[sse.Event]:
    """Data events (pings skipped) until ``n`` of them, or the end."""
    return read_data(resp, n, cut=True)  # what came beyond n is as if never read


def resume(base: str, path: str, last: str, headers: dict[str, str] | None = None):
    """A reconnect: the same POST with Last-Event-ID, or GET /v1/streams/{id}."""
    headers = {"Last-Event-ID": last, **(headers or {})}
    if path.startswith("/v1/streams/"):
        return http.request("GET", base + path, headers=headers, preload_content=False)
    body = json.dumps(chat_body("ignored: a resume's body is not sent anywhere")).encode()
    headers["Content-Type"] = "application/json"
    return http.request("POST", base + path, body=body, headers=headers, preload_content=False)


@pytest.fixture(scope="module")
def make_stack(runs_dir: Path) -> Iterator[StackPool]:
    """This module's stacks (tests/integration/conftest.py's make_stack, by the same rule),
    killed when the module is done: the variants here serve no other module, and every
    stack a session keeps holds a dozen descriptors in the test process."""
    pool = StackPool(runs_dir, require_binary)
    yield pool
    pool.kill_all()


@pytest.fixture
def cluster(make_stack) -> StackHandle:
    """Two instances of two workers behind nginx, one Memcached, resuming on."""
    gw = make_stack(env=RESUME_ENV, instances=2, workers=2)
    gw.sim_reset()
    return gw


def whole_stream(gw: StackHandle, prompt: str) -> list[sse.Event]:
    resp = open_stream(gw.url, chat_body(prompt), {})
    assert resp.status == 200
    return read_n(resp, None)


# -- the drop and the resume on another instance ---------------------------------------------
@pytest.mark.parametrize("door", ["/v1/chat/completions", "/v1/streams/{sid}"])
def test_a_dropped_stream_resumes_on_another_instance_exactly_once(cluster, door) -> None:
    gw = cluster
    landed_elsewhere = False
    for attempt in range(6):
        prompt = f"resume {door} {attempt} {uuid.uuid4().hex}"
        calls = gw.sim_stats()["requests"]
        started = gw.per_instance("llmgate_resumable_streams_total", result="yes")
        # 40 tokens a second: ~1.2 s of stream, live when the caller drops and comes back.
        resp = open_stream(gw.url, chat_body(prompt), {"X-LLMGate-Resumable": "true",
                                                        "x-sim-tps": "40"})  # fmt: skip
        assert resp.status == 200
        assert resp.headers["X-LLMGate-Resumable"] == f"yes; window={WINDOW_S}"
        sid = resp.headers["X-LLMGate-Stream-ID"]
        first = read_n(resp, 10)
        drop(resp)
        origin = [a - b for a, b in zip(gw.per_instance("llmgate_resumable_streams_total",
                                                  result="yes"), started, strict=True)]  # fmt: skip
        resumed = gw.per_instance("llmgate_resumes_total", outcome="resumed")
        again = resume(gw.url, door.format(sid=sid), f"{sid}:10")
        assert again.status == 200, again.data
        assert again.headers["X-LLMGate-Stream-ID"] == sid
        rest = read_n(again, None)
        where = [a - b for a, b in zip(gw.per_instance("llmgate_resumes_total", outcome="resumed"),
                                       resumed, strict=True)]  # fmt: skip
        # Events 11..50 and the end, each once, numbered on from where the caller was.
        assert [e.id for e in first] == [f"{sid}:{n}" for n in range(1, 11)]
        assert [e.id for e in rest] == [f"{sid}:{n}" for n in range(11, EVENTS + 1)]
        assert rest[-1].data == "[DONE]"
        assert gw.sim_stats()["requests"] - calls == 1  # the upstream was asked once
        reference = whole_stream(gw, prompt)
        assert len(reference) == EVENTS
        assert text_of(first + rest) == text_of(reference)
        assert _same_but_ids(first + rest, reference)
        assert sorted(origin) == [0, 1] and sorted(where) == [0, 1]
        if origin != where:
            landed_elsewhere = True
            break
    assert landed_elsewhere, "nginx sent every resume to the instance of its stream"


def _same_but_ids(got: list[sse.Event], want: list[sse.Event]) -> bool:
    """The same events but for the completion's id and created (two calls of one prompt)."""

    def bare(event: sse.Event) -> object:
        if event.data is None or not event.data.startswith("{"):
            return event.data
        doc = json.loads(event.data)
        doc.pop("id", None), doc.pop("created", None)
        return doc

    return [bare(e) for e in got] == [bare(e) for e in want]


def resume_stack(make_stack, **env: str) -> StackHandle:
    gw = make_stack(env={**RESUME_ENV, **env})
    gw.sim_reset()
    return gw


def memcached_port(gw: StackHandle) -> int:
    return int(gw.stack.memcached_addrs[0].rsplit(":", 1)[1])


# A chunk's key: the meta's (a SHA-256 in hex) and ``:c<n>`` (app/resume/ids.py). Not just
# ":c" in the key: the meta's own key holds it too when its digest starts with "c".
CHUNK_KEY = re.compile(r"llmgate:rs:[0-9a-f]{64}:c[0-9]+")


def log_items(gw: StackHandle) -> dict[str, bytes | None]:
    """Every resumable log item Memcached holds now, read directly."""
    port = memcached_port(gw)
    return {key: memcached_get(port, key) for key in memcached_keys(port, "llmgate:rs:")}


def items_from_now_on(gw: StackHandle) -> Callable[[], dict[str, bytes | None]]:
    """What ``log_items`` will hold that it does not hold now: the stack is shared, and an
    earlier test's log may still be in its window."""
    earlier = set(log_items(gw))
    return lambda: {k: v for k, v in log_items(gw).items() if k not in earlier}


def started_and_dropped(
    gw: StackHandle,
    prompt: str,
    *,
    after: int,
    tps: str,
    words: int = WORDS,
    headers: dict[str, str] | None = None,
) -> str:
    asked = {"X-LLMGate-Resumable": "true", "x-sim-tps": tps, **(headers or {})}
    resp = open_stream(gw.url, chat_body(prompt, words), asked)
    assert resp.status == 200
    sid = resp.headers["X-LLMGate-Stream-ID"]
    assert len(read_n(resp, after)) == after
    drop(resp)
    return sid


# -- one 404 for every id that is not the caller's kept stream ------------------------------
@pytest.mark.slow  # waits out the window
def test_an_expired_foreign_made_up_or_malformed_id_gets_the_same_404(make_stack) -> None:
    gw = resume_stack(make_stack)
    mine = {"Authorization": "Bearer sk-mine"}
    sid = started_and_dropped(gw, f"404 {uuid.uuid4().hex}", after=5, tps="400", headers=mine)
    assert wait_for(lambda: gw.sim_stats()["streams_completed"] >= 1, timeout=10)
    ok = resume(gw.url, f"/v1/streams/{sid}", f"{sid}:5", mine)
    assert ok.status == 200 and read_n(ok, None)[-1].data == "[DONE]"  # it is there, for me
    made_up = "A" * 24
    answers = [
        resume(gw.url, f"/v1/streams/{sid}", f"{sid}:5", {"Authorization": "Bearer sk-other"}),
        resume(gw.url, "/v1/chat/completions", f"{sid}:5", {"Authorization": "Bearer sk-other"}),
        resume(gw.url, f"/v1/streams/{made_up}", f"{made_up}:5", mine),
        resume(gw.url, "/v1/chat/completions", f"{made_up}:5", mine),
        resume(gw.url, "/v1/chat/completions", "not-an-id", mine),
        resume(gw.url, f"/v1/streams/{sid}", f"{made_up}:5", mine),  # another stream's id
        resume(gw.url, "/v1/streams/short", "short:5", mine),
    ]
    time.sleep(WINDOW_S + 1.5)
    answers.append(resume(gw.url, f"/v1/streams/{sid}", f"{sid}:5", mine))  # expired
    bodies = {(a.status, a.headers["Content-Type"], a.data) for a in answers}
    assert bodies == {
        (
            404,
            "application/json",
            json.dumps(
                {
                    "error": {
                        "message": "No resumable stream has this id (it may have expired).",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "stream_not_found",
                    }
                }
            ).encode(),
        )
    }
    assert gw.metric("llmgate_resumes_total", outcome="not_found") >= len(answers)


def test_the_messages_door_resumes_in_its_own_dialect(make_stack) -> None:
    gw = resume_stack(make_stack)
    body = {"model": "sim-small", "max_tokens": 30, "stream": True,
            "messages": [{"role": "user", "content": f"door {uuid.uuid4().hex}"}]}  # fmt: skip
    headers = {"Content-Type": "application/json", "X-LLMGate-Resumable": "true",
               "x-sim-tps": "40", "anthropic-version": "2023-06-01"}  # fmt: skip
    resp = http.request("POST", gw.url + "/v1/messages", body=json.dumps(body).encode(),
                        headers=headers, preload_content=False)  # fmt: skip
    sid = resp.headers["X-LLMGate-Stream-ID"]
    first = read_n(resp, 4)
    drop(resp)
    headers["Last-Event-ID"] = f"{sid}:4"
    again = http.request("POST", gw.url + "/v1/messages", body=json.dumps(body).encode(),
                         headers=headers, preload_content=False)  # fmt: skip
    rest = read_n(again, None)
    kinds = [e.event for e in first + rest]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [e.id for e in first + rest] == [f"{sid}:{n}" for n in range(1, len(kinds) + 1)]
    assert gw.sim_stats()["requests"] == 1
    gone = http.request("POST", gw.url + "/v1/messages", body=json.dumps(body).encode(),
                        headers={**headers, "Last-Event-ID": "B" * 24 + ":1"})  # fmt: skip
    assert gone.status == 404
    assert json.loads(gone.data) == {"type": "error", "error": {
        "type": "not_found_error",
        "message": "No resumable stream has this id (it may have expired)."}}  # fmt: skip


# -- a caller who never comes back ----------------------------------------------------------
@pytest.mark.slow  # waits out the window
def test_a_caller_who_leaves_is_billed_once_and_its_log_is_gone_after_the_window(
    make_stack,
) -> None:
    gw = resume_stack(make_stack)
    own = items_from_now_on(gw)  # this test's log items only
    sid = started_and_dropped(gw, f"leave {uuid.uuid4().hex}", after=10, tps="40")
    # The upstream is read to its end though nobody reads it: called once, never cut.
    assert wait_for(lambda: gw.sim_stats()["streams_completed"] == 1, timeout=10)
    stats = gw.sim_stats()
    assert stats["requests"] == 1 and stats["streams_abandoned"] == 0
    # Memcached holds the whole answer: its meta and a chunk of 50 events and the end.
    assert wait_for(lambda: len(own()) >= 2, timeout=5)
    items = own()
    chunks = [decode_chunk(v) for k, v in items.items() if CHUNK_KEY.fullmatch(k) and v is not None]
    assert len(chunks) == 1 and chunks[0] is not None
    assert len(chunks[0].events) == EVENTS and chunks[0].state == ENDED
    assert chunks[0].events[-1] == b"data: [DONE]\n\n"
    time.sleep(WINDOW_S + 1.5)
    port = memcached_port(gw)
    assert {key: memcached_get(port, key) for key in items} == dict.fromkeys(items)
    assert gw.metric("llmgate_resume_logs_total", how="complete") >= 1
    gone = resume(gw.url, f"/v1/streams/{sid}", f"{sid}:10")
    assert gone.status == 404


@pytest.mark.slow  # waits out the window
def test_a_stream_nobody_comes_back_to_is_stopped_after_the_window(make_stack) -> None:
    gw = resume_stack(make_stack)
    own = items_from_now_on(gw)  # this test's log items only
    # 200 words at 5 a second: 40 s of answer; the caller leaves after 3 events.
    sid = started_and_dropped(gw, f"abandon {uuid.uuid4().hex}", after=3, tps="5", words=200)
    assert own(), "the log is written while the stream runs"
    left = time.monotonic()
    assert wait_for(lambda: gw.sim_stats()["streams_abandoned"] == 1, timeout=WINDOW_S + 8)
    assert time.monotonic() - left >= WINDOW_S - 1  # not before the window
    assert gw.sim_stats()["streams_completed"] == 0
    assert wait_for(lambda: not [v for v in own().values() if v is not None], timeout=3)
    assert resume(gw.url, f"/v1/streams/{sid}", f"{sid}:3").status == 404
    assert gw.metric("llmgate_resume_logs_total", how="abandoned") >= 1


@pytest.mark.slow  # waits out the window
def test_a_caller_who_comes_back_keeps_the_stream_going_past_the_window(make_stack) -> None:
    gw = resume_stack(make_stack)
    # 60 words at 5 a second: 12 s, twice the window; back 1 s after leaving, reading to the end.
    sid = started_and_dropped(gw, f"back {uuid.uuid4().hex}", after=3, tps="5", words=60)
    time.sleep(1)
    again = resume(gw.url, f"/v1/streams/{sid}", f"{sid}:3")
    rest = read_n(again, None)
    assert [e.id for e in rest] == [f"{sid}:{n}" for n in range(4, 60 + 4)]
    assert rest[-1].data == "[DONE]"
    stats = gw.sim_stats()
    assert stats["requests"] == 1 and stats["streams_abandoned"] == 0


# -- what did not ask, and what found no room ------------------------------------------------
def test_streams_that_do_not_ask_carry_no_ids_and_a_deployment_that_is_off_says_so(
    make_stack,
) -> None:
    on = resume_stack(make_stack)
    plain = open_stream(on.url, chat_body(f"plain {uuid.uuid4().hex}"), {})
    raw = plain.read()
    assert b"\nid:" not in raw and not raw.startswith(b"id:")
    assert "X-LLMGate-Stream-ID" not in plain.headers
    assert "X-LLMGate-Resumable" not in plain.headers
    off = make_stack()
    asked = open_stream(
        off.url, chat_body(f"off {uuid.uuid4().hex}"), {"X-LLMGate-Resumable": "true"}
    )
    assert asked.headers["X-LLMGate-Resumable"] == "no; reason=disabled"
    assert "X-LLMGate-Stream-ID" not in asked.headers
    raw = asked.read()
    assert raw.endswith(b"data: [DONE]\n\n") and b"id:" not in raw
    # Off, Last-Event-ID means nothing to the gateway: the POST is an ordinary call.
    plain_post = open_stream(off.url, chat_body("x"), {"Last-Event-ID": "A" * 24 + ":3"})
    assert plain_post.status == 200 and plain_post.read().endswith(b"data: [DONE]\n\n")


def test_a_worker_out_of_log_memory_says_so_at_the_start(make_stack) -> None:
    # 64 KiB of kept-log memory: less than a resumable stream's events on their way take.
    gw = resume_stack(make_stack, LLMGATE_LOG_MEMORY_BYTES="65536")
    asked = open_stream(gw.url, chat_body(f"memory {uuid.uuid4().hex}"),
                        {"X-LLMGate-Resumable": "true"})  # fmt: skip
    assert asked.headers["X-LLMGate-Resumable"] == "no; reason=log_memory"
    events = read_n(asked, None)
    assert events[-1].data == "[DONE]" and all(e.id is None for e in events)
    assert gw.metric("llmgate_resumable_streams_total", result="log_memory") >= 1


@pytest.mark.slow  # waits out the window
def test_a_worker_out_of_memcached_budget_says_so_at_the_start(make_stack) -> None:
    gw = make_stack(env={**RESUME_ENV, "LLMGATE_RESUME_STREAM_BYTES": "1048576",
                         "LLMGATE_RESUME_MEMCACHED_BYTES": "1048576"}, workers=1)  # fmt: skip
    gw.sim_reset()
    asked = {"X-LLMGate-Resumable": "true"}
    first = open_stream(gw.url, chat_body(f"budget 1 {uuid.uuid4().hex}"), asked)
    assert first.headers["X-LLMGate-Resumable"].startswith("yes")
    assert read_n(first, None)[-1].data == "[DONE]"
    # Its log is kept for the window: the worker's one reservation is held until then.
    second = open_stream(gw.url, chat_body(f"budget 2 {uuid.uuid4().hex}"), asked)
    assert second.headers["X-LLMGate-Resumable"] == "no; reason=budget"
    events = read_n(second, None)
    assert events[-1].data == "[DONE]" and all(e.id is None for e in events)  # served whole
    time.sleep(WINDOW_S + 1)
    third = open_stream(gw.url, chat_body(f"budget 3 {uuid.uuid4().hex}"), asked)
    assert third.headers["X-LLMGate-Resumable"].startswith("yes")
    assert gw.metric("llmgate_resumable_streams_total", result="budget") >= 1
    read_n(third, None)


# -- gateway keys: owned by the key, billed once for the answer's own usage ------------------
def test_a_keyed_stream_is_resumed_only_by_its_key_and_billed_once_for_its_usage(
    make_stack, tmp_path
) -> None:
    secrets = {"owner": "llmg-resume-owner-secret", "other": "llmg-resume-other-secret"}
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_toml([(name, "tokens_per_day = 1000000") for name in secrets],
                              secrets.__getitem__))  # fmt: skip
    gw = make_stack(env={**RESUME_ENV, "LLMGATE_KEYS_FILE": str(keys)}, workers=2)
    gw.sim_reset()
    prompt = f"keyed {uuid.uuid4().hex}"
    owner = {"Authorization": f"Bearer {secrets['owner']}"}
    other = {"Authorization": f"Bearer {secrets['other']}"}
    # The caller did not ask for usage: the gateway asks the upstream for it, to count the
    # key's tokens, and takes the usage chunk out again (resumed or not).
    sid = started_and_dropped(gw, prompt, after=10, tps="40", headers=owner)
    foreign = resume(gw.url, f"/v1/streams/{sid}", f"{sid}:10", other)
    unknown = resume(gw.url, "/v1/streams/" + "C" * 24, "C" * 24 + ":10", owner)
    assert (foreign.status, foreign.data) == (404, unknown.data)  # another key: no oracle
    rest = read_n(resume(gw.url, f"/v1/streams/{sid}", f"{sid}:10", owner), None)
    assert rest[-1].data == "[DONE]"
    assert not [e for e in rest if e.data and '"usage":{' in e.data]
    # What an uninterrupted call of the same prompt uses, by the upstream's own usage chunk.
    counted = {**chat_body(prompt), "stream_options": {"include_usage": True}}
    reference = open_stream(gw.url, counted, other)
    usage = next(json.loads(e.data)["usage"] for e in read_n(reference, None)
                 if e.data and '"usage":{' in e.data)  # fmt: skip

    def tokens(name: str) -> int:
        rows = json.loads(http.request("GET", gw.url + "/admin/usage").data)["keys"]
        return next(row["tokens_today"] for row in rows if row["name"] == name)

    assert wait_for(lambda: tokens("owner") == usage["total_tokens"], timeout=5), tokens("owner")
    assert tokens("other") == usage["total_tokens"]
    assert gw.sim_stats()["requests"] == 2


# -- the SDKs, as users run them ------------------------------------------------------------
def test_the_sdks_read_a_resumable_stream_as_any_other(make_stack) -> None:
    import anthropic
    import openai

    gw = resume_stack(make_stack)
    asked = {"X-LLMGate-Resumable": "true"}
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": f"sdk {uuid.uuid4().hex}"}]
    chunks = client.chat.completions.create(
        model="sim-small", messages=messages, stream=True, max_tokens=20, extra_headers=asked,
        stream_options={"include_usage": True},
    )  # fmt: skip
    assert chunks.response.headers["X-LLMGate-Resumable"].startswith("yes")
    got = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 20
    # The gateway read its own numbered events: the log line has the answer's figures.
    line = gw.logged(chunks.response.headers["X-LLMGate-Request-ID"])
    assert line["tokens_out"] == 20 and line["ttft_ms"] is not None
    plain = client.chat.completions.create(model="sim-small", messages=messages, max_tokens=20)
    assert text == plain.choices[0].message.content
    responses = client.responses.create(model="sim-small", input=messages[0]["content"],
                                        stream=True, extra_headers=asked)  # fmt: skip
    kinds = [event.type for event in responses]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    sdk = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    with sdk.messages.stream(model="sim-small", max_tokens=20, messages=messages,
                             extra_headers=asked) as stream:  # fmt: skip
        final = stream.get_final_message()
    sdk.close()
    assert final.stop_reason in ("end_turn", "max_tokens") and final.content


# -- DELETE: a caller that stopped on purpose stops the stream ------------------------------
def test_a_deleted_stream_stops_at_once_and_only_its_owner_may_delete_it(make_stack) -> None:
    gw = resume_stack(make_stack)
    mine = {"Authorization": "Bearer sk-mine"}
    # 200 words at 5 a second: 40 s of answer; the caller leaves after 3 events.
    sid = started_and_dropped(gw, f"delete {uuid.uuid4().hex}", after=3, tps="5", words=200,
                              headers=mine)  # fmt: skip
    foreign = http.request("DELETE", f"{gw.url}/v1/streams/{sid}",
                           headers={"Authorization": "Bearer sk-other"})  # fmt: skip
    assert foreign.status == 404 and json.loads(foreign.data)["error"]["code"] == "stream_not_found"
    time.sleep(1.5)
    assert gw.sim_stats()["streams_abandoned"] == 0  # the foreign DELETE stopped nothing
    deleted = http.request("DELETE", f"{gw.url}/v1/streams/{sid}", headers=mine)
    assert deleted.status == 200
    assert json.loads(deleted.data) == {"id": sid, "object": "stream", "deleted": True}
    asked = time.monotonic()
    assert wait_for(lambda: gw.sim_stats()["streams_abandoned"] == 1, timeout=WINDOW_S)
    assert time.monotonic() - asked < WINDOW_S - 2  # at once, not at the window's end
    assert resume(gw.url, f"/v1/streams/{sid}", f"{sid}:3", mine).status == 404
    assert gw.metric("llmgate_resume_logs_total", how="deleted") >= 1


def test_the_client_stopping_early_stops_the_generation(make_stack) -> None:
    from llmgate_client import Client

    gw = resume_stack(make_stack)
    with Client(gw.url, "sk-test", model="sim-small") as llm:
        stream = llm.chat_stream(f"client stops {uuid.uuid4().hex}", max_tokens=200,
                                 extra_headers={"x-sim-tps": "5"})  # fmt: skip
        with stream:
            next(iter(stream))
            assert stream.stream_id is not None
    stopped = time.monotonic()
    assert wait_for(lambda: gw.sim_stats()["streams_abandoned"] == 1, timeout=WINDOW_S)
    assert time.monotonic() - stopped < WINDOW_S - 2


# -- with the cache: coalesced, stored, replayed ---------------------------------------------
def test_resumable_streams_coalesce_store_and_replay_as_any_other(make_stack) -> None:
    gw = resume_stack(make_stack)
    body = {**chat_body(f"cached {uuid.uuid4().hex}"), "temperature": 0}  # cacheable
    asked = {"X-LLMGate-Resumable": "true", "x-sim-tps": "40", "x-sim-ttft-ms": "300"}
    post = json.dumps(body).encode()
    conn = urllib3.HTTPConnectionPool("127.0.0.1", int(gw.url.rsplit(":", 1)[1]), maxsize=2)
    # Two identical calls: through nginx they may land on either worker, where the second
    # follows the first's flight or waits on its Memcached lease (COALESCED either way).
    leader = conn.urlopen("POST", "/v1/chat/completions", body=post, preload_content=False,
                          headers={"Content-Type": "application/json", **asked})  # fmt: skip
    follower = conn.urlopen("POST", "/v1/chat/completions", body=post, preload_content=False,
                            headers={"Content-Type": "application/json", **asked})  # fmt: skip
    assert leader.headers["X-LLMGate-Cache"] == "MISS"
    assert follower.headers["X-LLMGate-Cache"] == "COALESCED"
    ids_ = {leader.headers["X-LLMGate-Stream-ID"], follower.headers["X-LLMGate-Stream-ID"]}
    assert len(ids_) == 2  # each caller its own stream, its own log
    sid = leader.headers["X-LLMGate-Stream-ID"]
    first = read_n(leader, 10)
    drop(leader)  # the leader's caller goes; the answer goes on for the follower and the log
    followed = read_n(follower, None)
    rest = read_n(resume(gw.url, f"/v1/streams/{sid}", f"{sid}:10"), None)
    assert text_of(first + rest) == text_of(followed) and rest[-1].data == "[DONE]"
    assert gw.sim_stats()["requests"] == 1
    # Stored whole: the same call again is a hit, not resumable (asking again costs as little).
    hit = open_stream(gw.url, body, asked)
    assert hit.headers["X-LLMGate-Cache"].startswith("HIT")
    assert hit.headers["X-LLMGate-Resumable"] == "no; reason=cached"
    assert text_of(read_n(hit, None)) == text_of(followed)
    assert gw.sim_stats()["requests"] == 1


# -- the docs' example, run as written ------------------------------------------------------
def test_the_curl_example_of_docs_streams_runs_as_written(make_stack, tmp_path) -> None:
    import subprocess

    from tests.conftest import ROOT, require_binary
    from tests.support.doc_examples import parse

    require_binary("curl")
    gw = resume_stack(make_stack)
    (block,) = [b for b in parse((ROOT / "docs/streams.md").read_text(), "streams").blocks
                if b.runs]  # fmt: skip
    # The simulator's speed of `make run` (100 words a second): the first curl hangs up
    # mid-answer, after a second.
    text = block.text.replace("http://127.0.0.1:8080", gw.url).replace(
        "-H 'X-LLMGate-Resumable: true'", "-H 'X-LLMGate-Resumable: true' -H 'x-sim-tps: 100'"
    )
    done = subprocess.run(["bash", "-e", "-c", text], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = sse.Decoder().feed((tmp_path / "first.txt").read_bytes())
    rest = [e for e in sse.Decoder().feed(done.stdout.split("\n", 1)[1].encode()) if e.id]
    sid = first[0].id.split(":")[0] if first[0].id else ""
    assert done.stdout.startswith(f"stream {sid}: read up to event {sid}:{len(first)}")
    assert 0 < len(first) < 150 and rest[-1].data == "[DONE]"
    assert [e.id for e in first + rest] == [f"{sid}:{n}" for n in range(1, len(first + rest) + 1)]
    assert gw.sim_stats()["requests"] == 1


# -- every door that streams ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "done"),
    [
        ("/v1/completions", {"prompt": "once upon", "max_tokens": 30}, "[DONE]"),
        ("/v1/responses", {"input": "once upon", "max_output_tokens": 30}, None),
    ],
)
def test_completions_and_responses_streams_resume_too(make_stack, path, body, done) -> None:
    gw = resume_stack(make_stack)
    fields = {"model": "sim-small", "stream": True, **body}
    headers = {"Content-Type": "application/json", "X-LLMGate-Resumable": "true",
               "x-sim-tps": "40"}  # fmt: skip
    resp = http.request("POST", gw.url + path, body=json.dumps(fields).encode(),
                        headers=headers, preload_content=False)  # fmt: skip
    sid = resp.headers["X-LLMGate-Stream-ID"]
    first = read_n(resp, 5)
    drop(resp)
    headers["Last-Event-ID"] = f"{sid}:5"
    again = http.request("POST", gw.url + path, body=json.dumps(fields).encode(),
                         headers=headers, preload_content=False)  # fmt: skip
    rest = read_n(again, None)
    events = first + rest
    assert [e.id for e in events] == [f"{sid}:{n}" for n in range(1, len(events) + 1)]
    if done is not None:
        assert rest[-1].data == done
    else:  # Responses: typed events, its own end
        assert events[0].event == "response.created" and rest[-1].event == "response.completed"
    assert gw.sim_stats()["requests"] == 1


def test_the_after_query_names_the_events_the_caller_has(make_stack) -> None:
    gw = resume_stack(make_stack)
    resp = open_stream(gw.url, chat_body(f"after {uuid.uuid4().hex}"),
                       {"X-LLMGate-Resumable": "true", "x-sim-tps": "400"})  # fmt: skip
    sid = resp.headers["X-LLMGate-Stream-ID"]
    whole = read_n(resp, None)
    assert len(whole) == EVENTS

    def ids_after(query: str) -> list[str | None]:
        got = http.request("GET", f"{gw.url}/v1/streams/{sid}{query}", preload_content=False)
        assert got.status == 200, got.data
        return [e.id for e in read_n(got, None)]

    assert ids_after("?after=5") == [e.id for e in whole[5:]]
    assert ids_after("?after=") == ids_after("") == [e.id for e in whole]
    bad = http.request("GET", f"{gw.url}/v1/streams/{sid}?after=x")
    assert bad.status == 404 and json.loads(bad.data)["error"]["code"] == "stream_not_found"


def test_many_callers_at_once_over_instances_each_resume_their_own_stream_once(cluster) -> None:
    from concurrent.futures import ThreadPoolExecutor

    gw = cluster
    calls = gw.sim_stats()["requests"]
    tag = uuid.uuid4().hex

    def drop_and_resume(k: int) -> tuple[str, str]:
        prompt = f"many {tag} {k}"
        sid = started_and_dropped(gw, prompt, after=5 + k % 20, tps="40")
        rest = read_n(resume(gw.url, f"/v1/streams/{sid}", f"{sid}:{5 + k % 20}"), None)
        seen = [e.id for e in rest]
        assert seen == [f"{sid}:{n}" for n in range(6 + k % 20, EVENTS + 1)], (k, seen)
        return prompt, sid

    with ThreadPoolExecutor(12) as pool:
        done = list(pool.map(drop_and_resume, range(12)))
    assert len({sid for _, sid in done}) == 12  # each caller its own stream
    stats = gw.sim_stats()
    assert stats["requests"] - calls == 12  # one upstream call each, none repeated
    assert stats["streams_abandoned"] == 0  # every answer was read to its end
    # Both instances took part, for the streams and for the resumes.
    assert all(n > 0 for n in gw.per_instance("llmgate_resumes_total", outcome="resumed"))
