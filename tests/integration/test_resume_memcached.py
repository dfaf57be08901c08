"""Resumable streams when Memcached is down or restarted, and the resume protocol's edges,
measured from outside: raw bytes through nginx, the simulator's own counts of streams it
completed or saw abandoned, Memcached read directly.

The promise (docs/streams.md): a stream is said resumable only when its log could be
written; a log Memcached loses while its stream runs is written again by its writer, and the
answer is read on meanwhile, so no stream answered resumable is refused at its resume within
its window, and none is abandoned upstream.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import urllib3

from app.request.headers import tenant_of
from app.resume import ids
from llmgate_wire import sse
from runner.procs import Proc
from tests.support.memcached import memcached_get, memcached_keys
from tests.support.sse_reader import drop, read_data, text_of
from tests.support.stack import StackHandle
from tests.support.waiting import wait_for

WINDOW_S = 20
LOG_PREFIX = "llmgate:rs:"  # a resumable stream's log items (app/resume/ids.py)


def log_items(port: int, stream_id: str) -> set[str]:
    """The items of one stream's log Memcached holds now: its meta item and its chunks
    (their keys are the owner's and the stream id's hash: app/resume/ids.py; these calls
    carry no credential, so their owner is the tenant of no credential)."""
    meta = ids.log_key(tenant_of([]), stream_id)
    return {k for k in memcached_keys(port, LOG_PREFIX) if k == meta or k.startswith(meta + ":c")}


http = urllib3.PoolManager(maxsize=16, retries=False, timeout=urllib3.Timeout(connect=5, read=30))


@pytest.fixture(scope="module")
def gw(make_stack) -> StackHandle:
    return make_stack(env={"LLMGATE_RESUME_WINDOW_S": str(WINDOW_S), "LLMGATE_CACHE_MODE": "off"})


def chat(prompt: str, words: int) -> bytes:
    body = {
        "model": "sim-small",
        "stream": True,
        "max_tokens": words,
        "messages": [{"role": "user", "content": prompt}],
    }
    return json.dumps(body).encode()


def open_stream(base: str, prompt: str, words: int, tps: int) -> urllib3.BaseHTTPResponse:
    headers = {
        "Content-Type": "application/json",
        "X-LLMGate-Resumable": "true",
        "x-sim-tps": str(tps),
    }
    return http.request(
        "POST",
        base + "/v1/chat/completions",
        body=chat(prompt, words),
        headers=headers,
        preload_content=False,
    )


def last_id(events: list[sse.Event]) -> str:
    """The id of the last event read (a resumable stream numbers each)."""
    ident = events[-1].id
    assert ident is not None
    return ident


def resume(base: str, last: str) -> urllib3.BaseHTTPResponse:
    stream_id = last.split(":")[0]
    return http.request("GET", base + f"/v1/streams/{stream_id}", headers={"Last-Event-ID": last})


def resume_when_readable(base: str, last: str) -> urllib3.BaseHTTPResponse:
    """A resume as llmgate_client makes one: a 503 (the logs' store could not answer, a
    worker still skipping the node it saw down) is tried again, a second later, for ten
    seconds; a 404 never (the stream is gone)."""
    for _ in range(10):
        resp = resume(base, last)
        if resp.status != 503:
            return resp
        time.sleep(1.0)
    return resp


def memcached_port(gw: StackHandle) -> int:
    return int(gw.stack.memcached_addr.rsplit(":", 1)[1])


def stop_memcached(gw: StackHandle) -> None:
    """Kill the stack's Memcached: everything it held is lost."""
    stack = gw.stack
    (old,) = [p for p in stack.procs if p.name == "memcached"]
    old.kill()
    stack.procs.remove(old)


def start_memcached_again(gw: StackHandle) -> None:
    """A new, empty Memcached on the port the gateway knows."""
    stack, port = gw.stack, memcached_port(gw)
    new = Proc("memcached", stack.memcached_argv(port), log_path=stack._log("memcached-again"))
    stack.procs.append(new)
    new.wait_port(port)


@pytest.mark.slow
def test_streams_running_through_a_memcached_restart_are_resumed_whole(gw) -> None:
    """Four resumable streams, their callers gone after five events; Memcached is killed
    and started again (empty) while they run. Each resume, a few seconds on, gets exactly
    the events its caller missed, the simulator completed all four and abandoned none."""
    gw.sim_reset()
    words = 120
    whole = []
    for n in range(4):
        resp = open_stream(gw.url, f"restart {n}", words, tps=40)
        assert resp.status == 200
        assert resp.headers["X-LLMGate-Resumable"].startswith("yes"), resp.headers
        seen = read_data(resp, 5)
        drop(resp)
        whole.append(seen)
    stop_memcached(gw)
    start_memcached_again(gw)
    time.sleep(2.5)  # the writers see the loss at their next write and write the logs again
    for seen in whole:
        resumed = resume_when_readable(gw.url, last_id(seen))
        assert resumed.status == 200, resumed.data
        rest = [e for e in sse.Decoder().feed(resumed.data) if not e.is_comment]
        assert rest[-1].data == "[DONE]"
        text = text_of(seen + rest)
        assert len(text.split()) == words, text
        numbers = [int((e.id or ":").split(":")[1]) for e in seen + rest]
        assert numbers == list(range(1, len(numbers) + 1))
    stats = gw.sim_stats()
    assert stats["streams_completed"] == 4 and stats["streams_abandoned"] == 0, stats


def test_a_stream_started_while_memcached_is_down_is_not_promised_resumable(gw) -> None:
    """Memcached down: the stream says at its start that it is not resumable (``store``),
    and it is served whole as any stream is; a resume meanwhile is a 503 to retry, not the
    404 of a stream that is gone."""
    stop_memcached(gw)
    try:
        resp = open_stream(gw.url, "no store", 20, tps=400)
        assert resp.status == 200
        assert resp.headers["X-LLMGate-Resumable"] == "no; reason=store"
        assert "X-LLMGate-Stream-ID" not in resp.headers
        events = read_data(resp, None)
        assert events[-1].data == "[DONE]" and all(e.id is None for e in events)
        # A resume meanwhile cannot be told "gone": whether its log is there is not known.
        unknown = http.request("GET", gw.url + "/v1/streams/" + "Q" * 24)
        assert unknown.status == 503, unknown.data
        assert json.loads(unknown.data)["error"]["code"] == "resume_unavailable"
        assert unknown.headers["retry-after"] == "1"
    finally:
        start_memcached_again(gw)
    # Back: the next stream is resumable again (the worker's connections found it again).
    assert wait_for(lambda: _resumable_now(gw), timeout=15, every=0.5)


def _resumable_now(gw: StackHandle) -> bool:
    resp = open_stream(gw.url, "store back", 3, tps=400)
    read_data(resp, None)
    return resp.headers.get("X-LLMGate-Resumable", "").startswith("yes")


def test_a_deleted_finished_stream_is_gone_at_once(gw) -> None:
    """DELETE of a stream that has ended: a resume right after is the 404 of an unknown id,
    and its log is gone from Memcached."""
    port = memcached_port(gw)
    resp = open_stream(gw.url, "delete me", 10, tps=400)
    stream_id = resp.headers["X-LLMGate-Stream-ID"]
    read_data(resp, None)
    logged = log_items(port, stream_id)
    assert logged  # the meta item and its chunk
    assert http.request("GET", gw.url + f"/v1/streams/{stream_id}").status == 200
    deleted = http.request("DELETE", gw.url + f"/v1/streams/{stream_id}")
    assert deleted.status == 200 and json.loads(deleted.data)["deleted"] is True
    gone = http.request("GET", gw.url + f"/v1/streams/{stream_id}")
    assert gone.status == 404, gone.data
    assert json.loads(gone.data)["error"]["code"] == "stream_not_found"
    # Its writer may still be writing the end it has read (the caller read it first): what
    # it writes after the DELETE it deletes again as soon as it sees the stream deleted.
    left: list[str] = []

    def nothing_left() -> bool:
        left[:] = [k for k in logged if memcached_get(port, k) is not None]
        return not left

    assert wait_for(nothing_left, timeout=3, every=0.1), left


def test_last_event_id_of_another_stream_is_not_found(gw) -> None:
    """GET /v1/streams/A with a Last-Event-ID naming the caller's other stream B: 404, not
    B's events (nor A's)."""
    a = open_stream(gw.url, "stream a", 5, tps=400)
    b = open_stream(gw.url, "stream b", 5, tps=400)
    a_id, b_id = a.headers["X-LLMGate-Stream-ID"], b.headers["X-LLMGate-Stream-ID"]
    read_data(a, None)
    read_data(b, None)
    crossed = http.request(
        "GET", gw.url + f"/v1/streams/{a_id}", headers={"Last-Event-ID": f"{b_id}:2"}
    )
    assert crossed.status == 404, crossed.data
    assert (
        http.request(
            "GET", gw.url + f"/v1/streams/{a_id}", headers={"Last-Event-ID": f"{a_id}:2"}
        ).status
        == 200
    )


def test_a_logs_items_all_expire_with_the_window_after_its_end(gw) -> None:
    """A stream long enough for several chunks of its log (32 KiB each), read to its end:
    every item of its log (the meta, each chunk) expires within the window, none lives on
    with the stream's running lifetime (the deadline plus the window)."""
    port = memcached_port(gw)
    resp = open_stream(gw.url, "long " * 4, 6000, tps=20000)
    stream_id = resp.headers["X-LLMGate-Stream-ID"]
    events = read_data(resp, None)
    assert events[-1].data == "[DONE]"
    ttls: dict[str, int] = {}

    def expiring() -> bool:  # the writer may still be writing when the caller has it all
        keys = log_items(port, stream_id)
        ttls.clear()
        ttls.update({key.rsplit(":", 1)[-1]: _ttl(port, key) for key in keys})
        chunks = [name for name in ttls if name.startswith("c")]
        return len(chunks) >= 3 and all(0 < ttl <= WINDOW_S for ttl in ttls.values())

    assert wait_for(expiring, timeout=10, every=0.2), ttls


def _ttl(port: int, key: str) -> int:
    """The seconds ``key`` has left, by memcached's own meta command (``mg <key> t``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"mg {key} t\r\n".encode())
        reply = conn.recv(4096).decode()
    assert reply.startswith("HD"), reply
    return int(reply.split()[1][1:])


@pytest.fixture(scope="module")
def one_slot(make_stack) -> StackHandle:
    env = {
        "LLMGATE_RESUME_WINDOW_S": str(WINDOW_S),
        "LLMGATE_CACHE_MODE": "off",
        "LLMGATE_MAX_STREAMS_PER_WORKER": "1",
    }
    return make_stack(env=env, workers=1)


def test_a_resume_takes_a_worker_stream_slot(one_slot) -> None:
    """One worker that holds one stream at most: while a live stream holds it, a resume is
    refused with the worker's own 429 (it would hold a stream too); once it is free, the
    resume is served."""
    gw = one_slot
    first = open_stream(gw.url, "finished first", 5, tps=400)
    last = last_id(read_data(first, None))
    holder = open_stream(gw.url, "holding the slot", 200, tps=20)
    assert holder.status == 200
    read_data(holder, 2)
    refused = resume(gw.url, last)
    assert refused.status == 429, refused.data
    assert json.loads(refused.data)["error"]["code"] == "gateway_overloaded"
    drop(holder)
    assert wait_for(lambda: resume(gw.url, last).status == 200, timeout=10, every=0.3)
