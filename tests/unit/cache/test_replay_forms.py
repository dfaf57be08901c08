"""A stored answer is converted and read once per entry, not once per hit.

The store keeps its hottest entries decoded (app/cache/store.py), and each form a hit needs
(the events a stream caller gets, the body a non-stream caller gets, the answer's usage and
service tier for the log line) is made the first time and served from the entry after
(app/cache/entry.py ``made``, app/cache/replay.py). Each conversion is counted here by
wrapping the real function, and what the later hit gets is compared with a fresh conversion.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from app.cache import chunks, replay, shapes
from app.cache.entry import Entry
from app.cache.replay import reply_from_entry
from app.core.config import Settings
from app.edge.finish import finish
from app.observe.unobserved import UNOBSERVED
from app.request import routes
from app.request.call import Call, Reply
from app.request.usage import Usage, answer_facts

USAGE = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "service_tier": "flex",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi there"},
            "finish_reason": "stop",
        }
    ],
    "usage": USAGE,
}


def _counted(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Wrap ``owner.name`` so its calls are counted; the count, as a one-item list."""
    real: Callable[..., Any] = getattr(owner, name)
    calls = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def _hit(entry: Entry, *, stream: bool, include_usage: bool = True) -> Reply:
    reply = reply_from_entry(entry, route=routes.CHAT, stream=stream, include_usage=include_usage,
                             status="HIT; level=l1", age=0)  # fmt: skip
    assert reply is not None
    return reply


def _events(reply: Reply) -> list[bytes]:
    assert not isinstance(reply.body, bytes)
    (batch,) = list(reply.body)
    return batch


def test_a_stored_completion_is_made_into_events_once_per_shape(monkeypatch) -> None:
    conversions = _counted(monkeypatch, chunks, "chat_to_events")
    entry = Entry(1.0, 0.1, 60, 200, "application/json", body=json.dumps(COMPLETION).encode())
    first = _events(_hit(entry, stream=True))
    first.append(b"data: changed by whoever sent it\n\n")  # each reply has its own batch
    again = _events(_hit(entry, stream=True))
    assert conversions[0] == 1
    fresh = chunks.chat_to_events(COMPLETION, include_usage=True)
    assert again == fresh and again[-2].startswith(b'data: {"id"') and b'"usage"' in again[-2]
    # Without the usage chunk: another shape, made once too.
    without = _events(_hit(entry, stream=True, include_usage=False))
    assert _events(_hit(entry, stream=True, include_usage=False)) == without
    assert conversions[0] == 1 + 1 + 1  # the fresh one above, and this shape's
    assert not any(b'"usage":{' in event for event in without)


def test_a_stored_stream_is_assembled_into_a_body_once(monkeypatch) -> None:
    events = tuple(chunks.chat_to_events(COMPLETION, include_usage=True))
    assemblies = _counted(monkeypatch, shapes, "assemble_chat")
    entry = Entry(1.0, 0.1, 60, 200, "text/event-stream", events=events)
    bodies = [_hit(entry, stream=False).body for _ in range(3)]
    assert assemblies[0] == 1
    assert isinstance(bodies[0], bytes) and bodies[0] == bodies[2]
    assert json.loads(bodies[0])["choices"][0]["message"]["content"] == "Hi there"


def test_a_replayed_answers_usage_and_tier_are_read_once_and_are_its_own(monkeypatch) -> None:
    reads = _counted(monkeypatch, replay, "answer_facts")
    entry = Entry(1.0, 0.1, 60, 200, "application/json", body=json.dumps(COMPLETION).encode())
    replies = [_hit(entry, stream=False) for _ in range(3)]
    assert reads[0] == 1
    assert all(r.facts == (Usage(USAGE), "flex") for r in replies)
    assert replies[0].facts == answer_facts(replies[0].body, routes.CHAT)  # type: ignore[arg-type]


def test_the_log_line_takes_a_replys_known_facts_over_reading_its_body(caplog) -> None:
    """finish() reads a whole body's usage only when the reply does not say it already."""
    known = (Usage({"prompt_tokens": 7, "completion_tokens": 1}), "scale")
    told = Reply(200, [], json.dumps(COMPLETION).encode(), known, cache="HIT; level=l1")
    untold = Reply(200, [], json.dumps(COMPLETION).encode(), cache="HIT; level=l1")
    with caplog.at_level(logging.INFO, logger="llmgate.access"):
        for reply in (told, untold):
            call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
            finish(call, reply, Settings(), UNOBSERVED)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmgate.access"]
    assert [(x["tokens_in"], x["tokens_out"], x["service_tier"]) for x in lines] == [
        (7, 1, "scale"),
        (4, 2, "flex"),
    ]


def test_a_form_larger_than_the_bound_is_made_again_rather_than_kept(monkeypatch) -> None:
    """What an entry keeps is bounded (app/cache/store.py says how much a worker holds)."""
    conversions = _counted(monkeypatch, chunks, "chat_to_events")
    entry = Entry(1.0, 0.1, 60, 200, "application/json", body=json.dumps(COMPLETION).encode())
    size = sum(map(len, _events(_hit(entry, stream=True, include_usage=False))))
    monkeypatch.setattr(replay, "FORM_MAX_BYTES", size)
    _hit(entry, stream=True, include_usage=False)
    assert conversions[0] == 1  # kept: at the bound
    monkeypatch.setattr(replay, "FORM_MAX_BYTES", size - 1)
    for _ in range(2):
        _events(_hit(entry, stream=True, include_usage=True))  # larger: made each time
    assert conversions[0] == 3
