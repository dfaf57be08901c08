"""The translators alone: where a translated stream's extra CPU goes, timed in this process
over streams recorded from the simulator (no gateway, no socket while timing).

For each door and upstream kind the stream the gateway would get is asked of the simulator
once per size, in the upstream's dialect (the request built by app/dialects, as the
transport builds it), and split into its events. Each event is then fed on its own, as a
paced stream reaches a worker one read per event, to:

    decode      a fresh SSE decoder (llmgate_wire.sse): what the gateway's reader does to
                every stream, translated or not
    + parse     the decoder and json.loads of each event's data
    translator  the door's translator from that dialect (app/dialects; Gemini to the Messages
                door is two, chained as app/upstream/translation.py chains them), which decodes,
                parses, builds the caller's event and writes its JSON
    reader     a fresh SSE decoder over what the translator wrote: the reader's decode of
                the translated stream (for a pass-through, of the provider's own events)

CPU time (``time.process_time``) per whole stream, best of ``repeat`` runs of ``number``
streams, then fitted over the sizes as the gateway's calls are: µs per event and fixed µs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import urllib3

from app.dialects import anthropic, gemini
from app.dialects import anthropic_door as messages
from app.upstream.translation import Chained, Translator
from bench.cpu.translation_table import DOORS, Line, fit
from bench.kit.report import Cell
from llmgate_wire import sse

PROMPT = "bench translation"
STEPS = ("decode", "parse", "translator", "reader")


def chat_request(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 1024,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def messages_request(stream: bool) -> dict[str, Any]:
    return {"max_tokens": 1024, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}


def upstream_call(door: str, kind: str, model: str) -> tuple[str, dict[str, Any]]:
    """The path below the simulator's root and the body an upstream of ``kind`` is sent for a
    streamed call at ``door`` (the door's request translated as app/upstream/translation.py
    does)."""
    chat = chat_request(True) if door == "chat" else messages.chat_body(messages_request(True))
    chat["model"] = model
    if kind == "openai":
        return "/v1/chat/completions", chat
    if kind == "anthropic":
        if door == "messages":  # the pass-through: the caller's body as it is
            return "/v1/messages", {**messages_request(True), "model": model}
        return "/v1/messages", anthropic.request_body(chat, default_max_tokens=4096)
    path, query = gemini.target(model, True)
    return f"/v1beta{path}?{query}", gemini.request_body(chat)


def record(
    http: urllib3.PoolManager, sim_url: str, door: str, kind: str, tokens: int
) -> list[bytes]:
    """The simulator's stream for that call, at once (no TTFT, no pacing), event by event."""
    path, body = upstream_call(door, kind, f"m-{kind}")
    headers = {
        "Content-Type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-sim-tokens": str(tokens),
        "x-sim-ttft-ms": "0",
        "x-sim-tps": "1000000",
    }
    resp = http.request("POST", sim_url + path, body=json.dumps(body), headers=headers)
    if resp.status != 200:
        raise RuntimeError(f"simulator {path}: HTTP {resp.status} {resp.data[:200]!r}")
    return [event.raw for event in sse.Decoder().feed(resp.data)]


def translator(door: str, kind: str) -> Translator | None:
    """The stream's translator as the transport makes it; None for the pass-through."""
    chat: Translator | None = None
    if kind == "anthropic":
        chat = anthropic.StreamToChat(True, 0)
    elif kind == "gemini":
        chat = gemini.StreamToChat(include_usage=True, created=0, fallback_id="bench")
    if door == "chat":
        return chat
    if kind == "anthropic":
        return None
    door_writer = messages.ChatToStream(message_id="msg_bench", model="m", input_tokens=4)
    return door_writer if chat is None else Chained(chat, door_writer)


def _decode(events: list[bytes]) -> None:
    decoder = sse.Decoder()
    for raw in events:
        decoder.feed(raw)


def _parse(events: list[bytes]) -> None:
    decoder = sse.Decoder()
    for raw in events:
        for event in decoder.feed(raw):
            if event.data is not None and event.data != sse.DONE:
                json.loads(event.data)


def _translate(door: str, kind: str, events: list[bytes]) -> list[bytes]:
    made = translator(door, kind)
    if made is None:
        return events
    out = [made.feed(raw) for raw in events]
    out.append(made.close())
    return [piece for piece in out if piece]


def best_s(fn: Callable[[], object], number: int, repeat: int) -> float:
    """CPU seconds of one call of ``fn``: the best of ``repeat`` runs of ``number`` calls."""
    runs = []
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(number):
            fn()
        runs.append((time.process_time() - started) / number)
    return min(runs)


def steps_us(
    door: str, kind: str, events: list[bytes], number: int, repeat: int
) -> dict[str, float]:
    """Each step's CPU µs for one whole stream."""
    translated = _translate(door, kind, events)
    timed: dict[str, Callable[[], object]] = {
        "decode": lambda: _decode(events),
        "parse": lambda: _parse(events),
        "translator": lambda: _translate(door, kind, events),
        "reader": lambda: _decode(translated),
    }
    return {step: best_s(fn, number, repeat) * 1e6 for step, fn in timed.items()}


def measure(
    sim_url: str, sizes: tuple[int, ...], number: int, repeat: int
) -> dict[tuple[str, str], dict[str, Line]]:
    """Per door and kind, each step's line over the sizes (CPU per stream against its tokens)."""
    http = urllib3.PoolManager(retries=False)
    out: dict[tuple[str, str], dict[str, Line]] = {}
    for door, kinds in DOORS.items():
        for kind in kinds:
            points: dict[str, list[tuple[float, float]]] = {s: [] for s in STEPS}
            for tokens in sizes:
                events = record(http, sim_url, door, kind, tokens)
                for step, us in steps_us(door, kind, events, number, repeat).items():
                    points[step].append((float(tokens), us / 1000))  # fit() takes ms
            out[(door, kind)] = {s: fit(p) for s, p in points.items()}
    return out


def rows(
    split: dict[tuple[str, str], dict[str, Line]], extra_us: dict[tuple[str, str], float]
) -> list[list[Cell]]:
    """Per door and kind: each step's µs per event; beside a translated one, the gateway's
    extra µs per event over the pass-through's (the measured section) and the translator's
    share of it."""
    out: list[list[Cell]] = []
    for (door, kind), lines in split.items():
        passthrough = kind == DOORS[door][0]
        us = {s: lines[s].per_event_us for s in STEPS}
        extra = extra_us.get((door, kind))
        share = None if passthrough or not extra or extra <= 0 else 100 * us["translator"] / extra
        out.append(
            [
                door,
                kind + (" (pass-through)" if passthrough else ""),
                us["decode"],
                us["parse"],
                None if passthrough else us["translator"],
                None if passthrough else lines["translator"].fixed_ms * 1000,
                us["reader"],
                None if passthrough else extra,
                share,
            ]
        )
    return out


COLUMNS = [
    "door",
    "upstream",
    "SSE decode µs/event",
    "decode + json.loads µs/event",
    "translator µs/event",
    "translator fixed µs/stream",
    "reader's decode of its output µs/event",
    "gateway's extra µs/event",
    "translator % of the extra",
]
