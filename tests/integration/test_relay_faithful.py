"""What the caller receives through nginx, checked against what a scripted upstream sent.

The upstream here is tests/support/scripted_server.py: it sends exact bytes in awkward chunks.
The caller side reads the raw HTTP response from a socket and undoes the chunked framing
itself, so no SSE or HTTP library of the gateway's sits between the two byte strings compared.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.calls import raw_chat_request
from tests.support.scripted_server import Exchange, LoopbackServer, Request
from tests.support.server_timing import relay_of
from tests.support.waiting import wait_for

# A stream that uses the whole grammar: CRLF and LF (and a CRLF split across writes), a
# comment, multi-line data, id/retry/event fields, a non-ASCII "digit" in retry, odd
# spacing, an unknown field, a BOM-less start, a long line, then [DONE].
LONG = "y" * 60_000  # under the stack's LLMGATE_MAX_EVENT_BYTES (80,000)
FIXTURE_CHUNKS = [
    b": hello from upstream\r\n\r\n",
    b'data: {"choices":[{"delta":{"content":"a"}}]}\r',
    b"\n\r\n",
    b"event: message\nid: 7\nretry: 1500\ndata:no-space\ndata:  two-spaces\n\n",
    "retry: \u00b2\ndata: after-superscript-retry\n\n".encode(),
    b"unknown: field\ndata: x\r\ndata: y\r\n\r\n",
    b"data: " + LONG.encode() + b"\n\n",
    b":ping\n\n",
    b"data: [DONE]\n\n",
]
FIXTURE = b"".join(FIXTURE_CHUNKS)
# Four chunks of several events each: each a read of its own at the gateway.
SEVERAL = [b"".join(b'data: {"n":%d}\n\n' % (k * 5 + i) for i in range(5)) for k in range(4)] + [
    b"data: [DONE]\n\n"
]
MiB = 1024 * 1024
MSGS = [{"role": "user", "content": "hi"}]
BIG_EVENT = b"data: " + b"z" * (64 * 1024 - 8) + b"\n\n"  # 64 KiB per event
BIG_COUNT = 1600  # 100 MiB


def _upstream(request: Request, exchange: Exchange) -> None:
    script = json.loads(request.body or b"{}").get("model", "")
    if script == "bytes":
        exchange.start_stream()
        for chunk in FIXTURE_CHUNKS:
            exchange.send(chunk)
            time.sleep(0.002)  # separate reads at the gateway, so the splits are real
        exchange.finish()
    elif script == "several":  # reads of several events each
        exchange.start_stream()
        for chunk in SEVERAL:
            exchange.send(chunk)
            time.sleep(0.01)
        exchange.finish()
    elif script == "big":
        exchange.start_stream()
        for _ in range(BIG_COUNT):
            if not exchange.send(BIG_EVENT):
                return
        exchange.send(b"data: [DONE]\n\n")
        exchange.finish()
    elif script == "big10":  # 10 MiB, as fast as the gateway takes it
        exchange.start_stream()
        for _ in range(160):
            if not exchange.send(BIG_EVENT):
                return
        exchange.send(b"data: [DONE]\n\n")
        exchange.finish()
    elif script == "oversize-first":
        exchange.start_stream()
        exchange.send(b"data: " + b"o" * 100_000 + b"\n\n")
        exchange.finish()
    elif script == "oversize-later":
        exchange.start_stream()
        exchange.send(b"data: first\n\n")
        time.sleep(0.05)
        exchange.send(b"data: " + b"o" * 100_000 + b"\n\n")
        exchange.finish()
    elif script == "error-event":
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        exchange.send(b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n')
        exchange.send(b"data: [DONE]\n\n")
        exchange.finish()
    elif script == "leftover":  # an unterminated event after [DONE]
        exchange.start_stream()
        exchange.send(b"data: [DONE]\n\ndata: trailing")
        exchange.finish()
    elif script == "no-done":
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        exchange.finish()
    elif script == "reset-mid":
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        time.sleep(0.05)
        exchange.reset()
    elif script == "abandoned":
        exchange.start_stream()
        while exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'):
            time.sleep(0.01)
    elif script in ("http500", "http429"):
        status = int(script[4:])
        exchange.respond(status, {"error": {"message": script, "type": "x", "param": None}},
                         {"retry-after-ms": "1"})  # fmt: skip
    elif script == "gzip":  # a compressed event stream: urllib3 decodes it
        packed = gzip.compress(FIXTURE)
        exchange.start_stream(headers={"content-encoding": "gzip"})
        exchange.send(packed[:40])
        time.sleep(0.01)
        exchange.send(packed[40:])
        exchange.finish()
    elif script == "cut-in-chunk":  # the connection drops inside a chunk
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        time.sleep(0.05)
        exchange.sock.sendall(b'64\r\ndata: {"choi')  # 100 bytes announced, 15 sent
        time.sleep(0.05)
        exchange.reset()
    elif script == "short-body":  # a JSON answer cut short of its Content-Length
        body = json.dumps({"id": "c", "choices": [], "pad": "p" * 200}).encode()
        head = f"HTTP/1.1 200 X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        exchange.sock.sendall(head.encode() + b"\r\n\r\n" + body[:50])
        time.sleep(0.05)
        exchange.reset()
    elif script == "held":  # one event, then open until the caller leaves
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        exchange.wait_gone(30)
    elif script == "ok":
        exchange.start_stream()
        exchange.send(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        exchange.send(b"data: [DONE]\n\n")
        exchange.finish()
    else:
        exchange.respond(404, {"error": {"message": script, "type": "x", "param": None}})


@pytest.fixture(scope="module")
def upstream() -> Iterator[LoopbackServer]:
    with LoopbackServer(_upstream) as server:
        yield server


@pytest.fixture(scope="module")
def gw1(make_stack, upstream: LoopbackServer):
    """One worker (so its memory can be measured), the scripted upstream, nginx in front."""
    return make_stack(
        env={"LLMGATE_MAX_EVENT_BYTES": "80000"},
        workers=1,
        upstream_url=upstream.url + "/v1",
    )


def send_chat(url: str, body: dict, timeout: float = 60) -> socket.socket:
    """A chat completion request written to a plain socket, the connection closing after."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(raw_chat_request(host, body, {"Connection": "close"}))
    return sock


def raw_post(url: str, body: dict, *, sink: bool = False) -> tuple[int, dict[str, str], bytes]:
    """POST through a plain socket; the body with the chunked framing undone by hand.
    ``sink``: count the body's bytes instead of keeping them (the 100 MiB test): the count,
    a newline, and the body's last KiB."""
    sock = send_chat(url, body)
    reader = sock.makefile("rb")
    status = int(reader.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    out = bytearray()
    count = 0
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int(reader.readline().split(b";")[0], 16)
            if size == 0:
                break
            part = reader.read(size)
            assert reader.read(2) == b"\r\n"
            count += len(part)
            out += part
            if sink:
                del out[:-1024]
    else:
        part = reader.read(int(headers.get("content-length", "0")))
        count = len(part)
        out += part
    sock.close()
    return status, headers, bytes(out) if not sink else str(count).encode() + b"\n" + out


def test_the_caller_receives_exactly_the_upstreams_bytes(gw1) -> None:
    status, headers, got = raw_post(gw1.url, {"model": "bytes", "messages": MSGS, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    # Byte for byte: line ends, comments, spacing, the long line; and the gateway's one
    # comment line of its own, its relay time (Server-Timing: docs/observability.md).
    body, relay = relay_of(got)
    assert relay is not None
    differ = next((i for i, (a, b) in enumerate(zip(body, FIXTURE, strict=False)) if a != b), None)
    assert body == FIXTURE, (len(body), len(FIXTURE), differ, body[(differ or 0) - 20 :][:60])


@pytest.mark.parametrize("cacheable", [True, False], ids=["flight", "own"])
def test_every_event_of_a_read_of_several_reaches_the_caller(gw1, cacheable: bool) -> None:
    """Each upstream read holds five events: the relay hands them on as a batch, whether
    from a flight (cacheable; not stored, so the store's test below finds only its own) or
    read in the caller's own greenlet (not cacheable, app/streams/alone.py); none is
    dropped or repeated."""
    body = {"model": "several", "messages": MSGS, "stream": True}
    if cacheable:
        body |= {"temperature": 0, "cache": {"no-store": True}}
    status, _, got = raw_post(gw1.url, body)
    relayed, relay = relay_of(got)  # and the gateway's own line, its relay time
    assert status == 200 and relayed == b"".join(SEVERAL) and relay is not None


def test_a_stream_answering_a_call_that_did_not_ask_for_one_is_relayed_as_it_came(gw1) -> None:
    """A whole call of its own begins in its caller's greenlet (app/streams/alone.py); an
    event stream for an answer goes on in a flight from where it is, every byte kept."""
    status, headers, got = raw_post(gw1.url, {"model": "bytes", "messages": MSGS})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    body, relay = relay_of(got)  # and the relay time's line (Server-Timing's)
    assert body == FIXTURE and relay is not None, (len(body), len(FIXTURE))


def test_an_event_over_the_limit_before_the_first_byte_is_a_502(gw1) -> None:
    status, headers, body = raw_post(gw1.url, {"model": "oversize-first", "messages": MSGS,
                                               "stream": True})  # fmt: skip
    assert status == 502 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "upstream_event_too_large"


def test_an_event_over_the_limit_after_the_first_byte_ends_with_an_error_event(gw1) -> None:
    status, _, got = raw_post(gw1.url, {"model": "oversize-later", "messages": MSGS,
                                        "stream": True})  # fmt: skip
    assert status == 200
    body, relay = relay_of(got)  # after the error event: the stream has no end event
    assert relay is not None and got.startswith(body)
    first, last = body.split(b"\n\n")[0], body.split(b"\n\n")[-2]
    assert first == b"data: first"
    assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_event_too_large"
    assert b"[DONE]" not in body


def test_a_compressed_stream_is_relayed_decoded(gw1) -> None:
    status, headers, got = raw_post(gw1.url, {"model": "gzip", "messages": MSGS, "stream": True})
    assert status == 200 and "content-encoding" not in headers
    assert relay_of(got)[0] == FIXTURE and relay_of(got)[1] is not None


def test_a_stream_cut_inside_a_chunk_ends_with_an_upstream_reset_event(gw1) -> None:
    status, _, got = raw_post(gw1.url, {"model": "cut-in-chunk", "messages": MSGS,
                                        "stream": True})  # fmt: skip
    assert status == 200
    body, relay = relay_of(got)  # after the error event: the stream has no end event
    assert relay is not None and got.startswith(body)
    events = body.split(b"\n\n")
    assert events[0] == b'data: {"choices":[{"delta":{"content":"a"}}]}'
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "upstream_reset"
    assert b"choi" not in events[-2]  # the partial event never reaches the caller


def test_an_answer_cut_short_of_its_length_is_a_502_not_a_short_200(gw1) -> None:
    status, headers, body = raw_post(gw1.url, {"model": "short-body", "messages": MSGS})
    assert status == 502 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "upstream_reset"


def _worker_rss_kb(gw) -> int:
    master = gw.stack.proc("gunicorn").popen.pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    status = Path(f"/proc/{children[0]}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])


def test_a_100_mib_stream_nobody_else_needs_holds_little_memory(gw1) -> None:
    """Not cacheable (temperature 1), one caller: the gateway must not keep the stream."""
    body = {"model": "big", "messages": MSGS, "stream": True, "temperature": 1}
    raw_post(gw1.url, {"model": "bytes", "messages": MSGS, "stream": True})  # warm the worker
    before = _worker_rss_kb(gw1)
    status, _, sunk = raw_post(gw1.url, body, sink=True)
    after = _worker_rss_kb(gw1)
    assert status == 200
    count, _, tail = sunk.partition(b"\n")
    ended, relay = relay_of(tail)  # the relay time's line, the gateway's own
    assert relay is not None and ended.endswith(b"data: [DONE]\n\n")
    said = len(tail) - len(ended)
    assert int(count) - said == BIG_COUNT * len(BIG_EVENT) + len(b"data: [DONE]\n\n")
    grown_mib = (after - before) / 1024
    print(f"\nworker RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB over a 100 MiB stream")
    if os.environ.get("LLMGATE_TEST_REPORT"):
        Path(os.environ["LLMGATE_TEST_REPORT"]).write_text(f"{before} {after}\n")
    assert grown_mib < 10, f"worker RSS grew {grown_mib:.1f} MiB"


def test_a_held_stream_does_not_keep_its_callers_prompt(gw1) -> None:
    """40 streams held open, each asked with a 256 KiB prompt: 10 MiB of prompts that the
    worker needs only until the upstream has the request. A held stream costs ~60 KB."""
    raw_post(gw1.url, {"model": "bytes", "messages": MSGS, "stream": True})  # warm the worker
    before = _worker_rss_kb(gw1)
    held = []
    try:
        for i in range(40):
            prompt = [{"role": "user", "content": f"{i} " + "p" * 256 * 1024}]
            sock = send_chat(gw1.url, {"model": "held", "messages": prompt, "stream": True})
            got = b""
            while b"data: " not in got:
                chunk = sock.recv(65536)
                assert chunk, got
                got += chunk
            held.append(sock)
        grown_mib = (_worker_rss_kb(gw1) - before) / 1024
    finally:
        for sock in held:
            sock.close()
    print(f"\nworker RSS grew {grown_mib:.1f} MiB with 40 streams of 256 KiB prompts held")
    assert grown_mib < 6, f"worker RSS grew {grown_mib:.1f} MiB: prompts are kept"


# -- nothing partial or failed is ever stored ----------------------------------------------
def memcached_keys(addr: str) -> list[str]:
    """Every key in the stack's Memcached, read with its own crawler (not through our code)."""
    host, port = addr.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"lru_crawler metadump all\r\n")
    data = b""
    while not data.endswith(b"END\r\n"):
        chunk = sock.recv(65536)
        assert chunk, data[-200:]
        data += chunk
    sock.close()
    return [
        unquote(field.removeprefix("key="))
        for line in data.decode().splitlines()
        for field in line.split()[:1]
        if field.startswith("key=")
    ]


def _cacheable(script: str, stream: bool = True) -> dict:
    return {"model": script, "messages": MSGS, "stream": stream, "temperature": 0}


def _abandon(url: str, body: dict) -> None:
    """Read the first event (a stream) or wait a moment (not a stream), then hang up."""
    sock = send_chat(url, body, timeout=10)
    if body["stream"]:
        got = b""
        while b"data: " not in got:
            got += sock.recv(65536)
    else:
        time.sleep(0.2)  # the upstream is streaming into the gateway's buffer
    sock.close()


FAILING = ["error-event", "no-done", "leftover", "reset-mid", "abandoned", "http500", "http429"]


def test_no_partial_or_failed_answer_reaches_the_store(gw1, upstream: LoopbackServer) -> None:
    # A control first: a good answer is stored, so the store read below can see entries.
    assert raw_post(gw1.url, _cacheable("ok"))[0] == 200
    assert wait_for(lambda: len(_entries(gw1)) == 1), memcached_keys(gw1.stack.memcached_addr)
    for script in FAILING:
        if script == "abandoned":
            _abandon(gw1.url, _cacheable(script))
            _abandon(gw1.url, _cacheable(script, stream=False))
            time.sleep(0.3)  # the gateway notices the caller left and closes the upstream
        else:
            raw_post(gw1.url, _cacheable(script))
            raw_post(gw1.url, _cacheable(script, stream=False))
    time.sleep(0.3)
    assert len(_entries(gw1)) == 1  # only the control's entry
    # Nothing in L1 either: the same calls reach the upstream again.
    for script in FAILING:
        if script == "abandoned":
            continue
        before = upstream.stats.requests
        raw_post(gw1.url, _cacheable(script))
        assert upstream.stats.requests > before, script


def _entries(gw) -> list[str]:
    return [
        k
        for k in memcached_keys(gw.stack.memcached_addr)
        if k.startswith("llmgate:") and not k.endswith(":lease")
    ]


@pytest.mark.slow
def test_a_caller_reading_1_kb_a_second_holds_the_buffer_not_the_stream(gw1) -> None:
    """A 10 MiB stream and a caller taking 1 KB a second: the gateway stops reading the
    upstream once LLMGATE_STREAM_BUFFER_BYTES (512 KiB) wait for the caller, so the worker
    grows by about that, not by the stream."""
    raw_post(gw1.url, {"model": "bytes", "messages": MSGS, "stream": True})  # warm the worker
    before = _worker_rss_kb(gw1)
    host, port = gw1.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # little kernel buffering here
    sock.settimeout(30)
    sock.connect((host, int(port)))
    body = {"model": "big10", "messages": MSGS, "stream": True, "temperature": 1}
    sock.sendall(raw_chat_request(host, body))
    got = 0
    for _ in range(5):
        got += len(sock.recv(1024))
        time.sleep(1)
    grown_mib = (_worker_rss_kb(gw1) - before) / 1024
    sock.close()
    print(f"\nworker RSS grew {grown_mib:.1f} MiB while a caller read {got} bytes of 10 MiB")
    assert got > 0
    assert grown_mib < 0.5 + 5, f"worker RSS grew {grown_mib:.1f} MiB"
