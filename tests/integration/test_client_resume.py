"""The sync client resumes a stream the network cut, through the whole stack (docs/streams.md).

nginx -> gunicorn (2 gevent workers) -> gateway -> simulator, with Memcached and resumable
streams allowed (``LLMGATE_RESUME_WINDOW_S=30``); the client talks to the gateway through a
TCP fault proxy (tests/support/faultproxy.py) that resets a connection once a set number of
bytes has reached the client. The answer must arrive whole and once, with one resume, from
one upstream call: the simulator's own counters say how many calls and tokens it served.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest

from llmgate_client import Client, ResumePolicy, Timeout
from llmgate_wire.sse import Decoder
from tests.support.faultproxy import FaultProxy
from tests.support.stack import StackHandle
from tests.support.waiting import wait_for

MODEL = "sim/tokens=200"
PROMPT = "Tell me a long story"
KEY = "sk-resume-owner"
SPEC = Timeout(connect=2, read=10, total=60)


@pytest.fixture(scope="module")
def stack(make_stack) -> StackHandle:
    return make_stack(
        env={"LLMGATE_RESUME_WINDOW_S": "30", "LLMGATE_RETRIES": "0"},
        simulator_args=["--ttft-ms", "0", "--tps", "2000"],
    )


class _Recorded:
    """A socket stand-in that hands http.client the bytes already read off the wire."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.raw)


def whole_answer(url: str) -> tuple[int, list[str]]:
    """The uncut answer: how many bytes its response is on the wire (status line, headers,
    chunk framing: what the proxy counts) and its content deltas, in order."""
    parts = urlsplit(url)
    body = json.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"X-LLMGate-Resumable: true\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    raw = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head + body)
        while data := sock.recv(65536):
            raw += data
    response = http.client.HTTPResponse(_Recorded(raw))  # type: ignore[arg-type]
    response.begin()
    assert response.status == 200 and response.getheader("x-llmgate-resumable", "").startswith(
        "yes"
    ), (response.status, response.getheaders())
    events = Decoder().feed(response.read())
    deltas = [_content(json.loads(e.data)) for e in events if e.data and e.data != "[DONE]"]
    return len(raw), [d for d in deltas if d]


def _content(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content")


def test_a_stream_cut_once_by_the_network_arrives_whole_and_once(stack: StackHandle) -> None:
    wire_bytes, expected = whole_answer(stack.url)
    assert len("".join(expected).split()) == 200
    stack.sim_reset()
    target = urlsplit(stack.url)
    with FaultProxy(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        # Reset each connection after 60 % of the answer's bytes: the first one mid-answer;
        # the resume carries the other 40 % (and its own headers), so it is never cut.
        proxy.reset_after(wire_bytes * 6 // 10, "to_client")
        client = Client(
            f"http://127.0.0.1:{proxy.port}",
            KEY,
            timeout=SPEC,
            resume=ResumePolicy(attempts=4, backoff_initial=0.1),
        )
        with (
            client,
            client.chat_stream(
                PROMPT,
                model=MODEL,
                # 2 s of generation: the cut (at about 1.2 s) comes while the upstream is
                # still answering, so the resume reads the log, then follows the live rest.
                extra_headers={"x-sim-tps": "100"},
            ) as stream,
        ):
            got = list(stream.text_deltas())
        assert proxy.accepted == 2  # the cut answer's connection and the resume's
    assert got == expected  # every piece once, in order
    assert stream.completed and stream.resumes == 1 and stream.stream_id
    assert wait_for(lambda: stack.sim_stats()["streams_completed"] == 1, timeout=10)
    stats = stack.sim_stats()
    assert stats["requests"] == 1 and stats["streams_abandoned"] == 0, stats
    # The simulator counts the prompt's words and the answer's: the answer was made once.
    assert stats["tokens"] - len(PROMPT.split()) == len("".join(got).split()) == 200, stats
