"""An agent loop's calls, as the prompt cache section drives them (bench/load/prompt_cache.py).

Each session is one agent: a system prompt every session shares, a task of its own with a
long context (a file it was given), then turns, each a streamed chat call through the
gateway whose answer and a tool result of its own are added to the conversation before the
next (its tool taking ``tool_s`` to run): a prefix of several thousand words that grows every
turn. Its cache breakpoints are
the gateway's (the upstream's ``prompt_cache = "auto"``), or with ``own_marks`` its own, on
its system prompt and its newest message. The sessions run at once,
each one turn after another, as agents wait for their answers. Per call: the time to its
first token (its first content delta: the role chunk of a translated stream comes before
the provider's prefill), and its errors.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3


@dataclass(frozen=True)
class Workload:
    sessions: int
    turns: int
    system_words: int  # shared by every session
    context_words: int  # each session's own task
    result_words: int  # a tool result's, each turn
    answer_tokens: int
    # The agent places its own cache breakpoints (a ``cache_control`` part, kept through the
    # translation) on its system prompt and its newest message, as Anthropic's guide shows;
    # False: none, the upstream's ``prompt_cache = "auto"`` places the gateway's.
    own_marks: bool = False
    # Seconds the agent's tool runs between an answer and the next turn.
    tool_s: float = 0.0


@dataclass
class Calls:
    """What the sessions' calls gave: first-token times (s) and errors."""

    first_token: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def run(url: str, model: str, w: Workload) -> Calls:
    """Every session's turns through the gateway at ``url``, the sessions at once."""
    calls = Calls()
    http = urllib3.PoolManager(
        maxsize=w.sessions, retries=False, timeout=urllib3.Timeout(connect=10, read=120)
    )
    threads = [
        threading.Thread(target=_session, args=(http, url, model, w, i, calls), daemon=True)
        for i in range(w.sessions)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return calls


def _session(
    http: urllib3.PoolManager, url: str, model: str, w: Workload, n: int, calls: Calls
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": words(w.system_words, "shared")},
        {"role": "user", "content": words(w.context_words, f"s{n}c")},
    ]
    for turn in range(w.turns):
        sent = _marked(messages) if w.own_marks else messages
        body = {"model": model, "stream": True, "max_tokens": w.answer_tokens, "messages": sent}
        try:
            first, answer = _stream(http, url, body)
        except Exception as exc:  # counted, and the session goes on as an agent would
            with calls.lock:
                calls.errors.append(f"session {n} turn {turn}: {exc}")
            answer = ""
        else:
            with calls.lock:
                calls.first_token.append(first)
        time.sleep(w.tool_s)
        messages = [
            *messages,
            {"role": "assistant", "content": answer or "(no answer)"},
            {"role": "user", "content": words(w.result_words, f"s{n}t{turn}r")},
        ]


def _marked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with the agent's own breakpoints: its system prompt and its newest
    message each one text part marked ``cache_control``."""
    mark = {"type": "ephemeral"}

    def one(message: dict[str, Any]) -> dict[str, Any]:
        part = {"type": "text", "text": message["content"], "cache_control": mark}
        return {**message, "content": [part]}

    return [one(messages[0]), *messages[1:-1], one(messages[-1])]


def _stream(http: urllib3.PoolManager, url: str, body: dict[str, Any]) -> tuple[float, str]:
    """One streamed call: the seconds to its first content delta, and its text."""
    started = time.monotonic()
    resp = http.request(
        "POST",
        url + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        preload_content=False,
    )
    try:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        first: float | None = None
        text: list[str] = []
        pending = b""
        while chunk := resp.read1(65536):
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                delta = _delta(event)
                if delta and first is None:
                    first = time.monotonic() - started
                text.append(delta)
        if first is None:
            raise RuntimeError("a stream without content")
        return first, "".join(text)
    finally:
        resp.release_conn()


def _delta(event: bytes) -> str:
    """The content a chat chunk adds ("" for any other event)."""
    if not event.startswith(b"data: {"):
        return ""
    choices = json.loads(event[6:]).get("choices") or [{}]
    content = (choices[0].get("delta") or {}).get("content")
    return content if isinstance(content, str) else ""
