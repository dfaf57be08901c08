"""Calls made the way a caller makes them, each judged against the simulator's own answer.

The simulator's text is a pure function of the prompt and the token count
(``simulator/text.py``), so every answer can be checked against the prompt that was sent:
an answer that reached the wrong caller, or lost or repeated a token, fails the check.

``call`` sends one chat completion (stream or not) and classifies what came back:

- ``ok``: a 200 whose content is exactly the expected text (a stream: ending with ``[DONE]``,
  no error event);
- ``error``: an OpenAI-shaped JSON error (``{"error": {message, type, param, code}}``);
- ``error_event``: a stream that ended with one final ``data: {"error": ...}`` event;
- ``gave_up``: the caller's own timeout ran out first (it closed its connection);
- ``bad``: anything else: wrong content, a silent end, an error of another shape, a
  transport error the caller did not cause. ``detail`` says what.

``raw_chat_request`` is the bytes of one such call, for a raw socket or for the driver of
many raw streams with one thread, tests/support/held.py (``HeldStreams``, ``ManyStreams``;
the latter named here too, where bench/load/cluster.py and memory.py import it from).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import urllib3

from llmgate_wire import sse
from simulator import text
from tests.support.bodies import chat, chat_about
from tests.support.held import ManyStreams as ManyStreams
from tests.support.waiting import wait_for


def expected(prompt: str, max_tokens: int) -> str:
    """What the simulator answers to a one-message chat with this prompt and max_tokens."""
    return "".join(text.words(prompt, max_tokens))


def chat_body(
    prompt: str, max_tokens: int, *, stream: bool, temperature: float | None, **extra: object
) -> dict:
    body = chat_about(prompt, max_tokens=max_tokens, stream=stream, **extra)
    if temperature is not None:
        body["temperature"] = temperature
    return body


def openai_error(doc: object) -> bool:
    """True for ``{"error": {"message": str, "type": str, "param": ..., "code": ...}}``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
        return False
    err = doc["error"]
    return (
        isinstance(err.get("message"), str)
        and bool(err["message"])
        and isinstance(err.get("type"), str)
        and "param" in err
        and "code" in err
    )


@dataclass
class Outcome:
    kind: str  # ok | error | error_event | gave_up | bad
    status: int = 0
    detail: str = ""
    cache: str = ""
    code: str = ""  # the error's code, for errors
    elapsed: float = 0.0
    events: int = 0  # data events received (streams)
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kind}({self.status}, {self.code or self.cache}: {self.detail[:300]})"


def call(
    http: urllib3.PoolManager,
    url: str,
    prompt: str,
    max_tokens: int,
    *,
    stream: bool,
    temperature: float | None = None,
    headers: dict[str, str] | None = None,
    give_up_s: float | None = None,
    timeout_s: float = 30.0,
) -> Outcome:
    """One chat completion through ``url``, judged. ``give_up_s``: the caller's own total
    timeout (it closes its connection then); without it a ``timeout_s`` silence is ``bad``."""
    body = json.dumps(chat_body(prompt, max_tokens, stream=stream, temperature=temperature))
    want = expected(prompt, max_tokens)
    limit = give_up_s if give_up_s is not None else timeout_s
    started = time.monotonic()

    def late() -> bool:
        return give_up_s is not None and time.monotonic() - started >= give_up_s * 0.95

    resp = None
    whole = False
    try:
        resp = http.request(
            "POST",
            url + "/v1/chat/completions",
            body=body.encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=limit),
            retries=False,
        )
        cache = resp.headers.get("X-LLMGate-Cache", "")
        ctype = resp.headers.get("Content-Type", "")
        if resp.status != 200 or not stream:
            raw = resp.read()
            out = _judge_whole(resp.status, raw, want, stream)
        else:
            if not ctype.startswith("text/event-stream"):
                return Outcome("bad", 200, f"stream with content-type {ctype!r}", cache)
            out = _judge_stream(resp, want, started, give_up_s, timeout_s)
        whole = resp.status != 200 or not stream or out.kind in ("ok", "error_event", "bad")
        out.cache, out.elapsed = cache, time.monotonic() - started
        return out
    except (urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        if late():
            return Outcome("gave_up", detail=repr(exc), elapsed=time.monotonic() - started)
        return Outcome("bad", detail=f"timed out: {exc!r}", elapsed=time.monotonic() - started)
    except urllib3.exceptions.HTTPError as exc:  # connection broken, incomplete body...
        return Outcome("bad", detail=f"transport: {exc!r}", elapsed=time.monotonic() - started)
    finally:
        if resp is not None:
            if not whole:  # never hand a half-read connection back to the pool
                resp.close()
            resp.release_conn()


def _judge_whole(status: int, raw: bytes, want: str, stream: bool) -> Outcome:
    try:
        doc = json.loads(raw)
    except ValueError:
        return Outcome("bad", status, f"not JSON: {raw[:200]!r}")
    if status == 200 and not stream:
        try:
            content = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return Outcome("bad", status, f"no content: {raw[:200]!r}")
        if content != want:
            return Outcome("bad", status, f"wrong content {content!r}, want {want!r}")
        return Outcome("ok", status)
    if status >= 400 and openai_error(doc):
        return Outcome("error", status, doc["error"]["message"], code=str(doc["error"]["code"]))
    return Outcome("bad", status, f"unexpected answer: {raw[:200]!r}")


def _judge_stream(
    resp: urllib3.BaseHTTPResponse,
    want: str,
    started: float,
    give_up_s: float | None,
    timeout_s: float,
) -> Outcome:
    decoder = sse.Decoder()
    events: list[sse.Event] = []
    while True:
        waited = time.monotonic() - started
        if give_up_s is not None and waited >= give_up_s:
            resp.close()  # the caller leaves: its connection is closed, not drained
            return Outcome("gave_up", 200, f"after {len(events)} events", events=len(events))
        if waited >= timeout_s:  # heartbeats keep a hung stream "alive": bound it in total
            return Outcome(
                "bad", 200, f"no end after {waited:.1f} s, {len(events)} events", events=len(events)
            )
        chunk = resp.read1(65536)
        if not chunk:
            break
        events += [e for e in decoder.feed(chunk) if not e.is_comment]
    return judge_events(events, want)


def judge_events(events: list[sse.Event], want: str) -> Outcome:
    """A finished stream's data events: [DONE] with the right text, or one final error."""
    n = len(events)
    if not events:
        return Outcome("bad", 200, "stream ended with no event (silent end)")
    for i, event in enumerate(events):
        if event.data and event.data.startswith('{"error"'):
            doc = json.loads(event.data)
            if i != n - 1:
                return Outcome("bad", 200, f"events after the error event: {events[i + 1 :]}")
            if not openai_error(doc):
                return Outcome("bad", 200, f"error event of the wrong shape: {event.data}")
            return Outcome(
                "error_event",
                200,
                doc["error"]["message"],
                code=str(doc["error"]["code"]),
                events=n,
            )
    if not events[-1].is_done:
        return Outcome("bad", 200, f"silent end after {n} events: {events[-1].data!r}", events=n)
    content = []
    for event in events[:-1]:
        for choice in json.loads(event.data or "{}").get("choices", []):
            content.append(choice.get("delta", {}).get("content") or "")
    got = "".join(content)
    if got != want:
        return Outcome("bad", 200, f"wrong content {got!r}, want {want!r}", events=n)
    return Outcome("ok", 200, events=n)


# -- many raw streams, one thread -------------------------------------------------------------
def raw_chat_request(host: str, body: dict, headers: dict[str, str] | None = None) -> bytes:
    data = json.dumps(body).encode()
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def round_of_streams(gw, http: urllib3.PoolManager, callers: int) -> list[int]:
    """``callers`` streams at once through ``gw`` (a StackHandle), each held 1 s before its
    first token; each one's status, negative when it did not end with [DONE]."""

    def one(_: int) -> int:
        resp = http.request("POST", gw.url + "/v1/chat/completions",
                            body=json.dumps(chat(True, max_tokens=3)).encode(),
                            headers={"Content-Type": "application/json",
                                     "x-sim-ttft-ms": "1000"})  # fmt: skip
        return resp.status if resp.data.endswith(b"data: [DONE]\n\n") else -resp.status

    # Each round starts once the last one's connections are back in the pool (a caller has
    # its [DONE] a moment before the worker reads the response's end and releases it).
    assert wait_for(
        lambda: gw.metric("llmgate_upstream_pool_connections", state="in_use", default=0) == 0
    )
    with ThreadPoolExecutor(callers) as pool:
        return list(pool.map(one, range(callers)))
