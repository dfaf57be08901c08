"""A listener's bytes to the caller: ``relay``, a stream's body from its head to its end.

``relay`` is a listener's body: each event's own bytes at once and, when nothing came for
``heartbeat`` seconds, a ``: ping`` comment instead, so heartbeats fall only between
events; a stream never ends silently (app/streams/reply.py makes the reply around it; a
resume's stored stream, app/resume/reader.py, is read by it too).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Protocol

from app.core.doors import ANTHROPIC, OPENAI
from app.core.errors import GatewayError, UpstreamReset, anthropic_body, wrap_upstream_body
from app.observe import tracing
from app.request.events import StreamEnd, is_error_event, typed
from app.streams.answer import ClientGone, Finished, Head
from llmgate_wire import sse


class Listening(Protocol):
    """What ``relay`` reads: a flight's listener (app/streams/listener.py), a call of the
    caller's own (app/streams/alone.py), or a resume's stored stream read back
    (app/resume/reader.py). ``position``: the number of events read. ``next_batch``: every
    event in and not yet read (at least one), or the end once every event is read; None
    when nothing came within ``timeout``."""

    position: int

    def wait_head(self, timeout: float | None) -> Head | None: ...

    def next_batch(
        self, timeout: float | None
    ) -> list[sse.Event] | Finished | GatewayError | None: ...


def relay(
    listener: Listening,
    *,
    heartbeat: float,
    end: StreamEnd | None,
    on_ping: Callable[[], None] = lambda: None,
    on_error: Callable[[str], None] = lambda _: None,
    on_end: Callable[[], None] = lambda: None,
    on_complete: Callable[[bool], None] = lambda _: None,
    ping_first: bool = False,
    door: str = OPENAI,
    stream_id: str | None = None,
    after: int = 0,
    withdrawn: Callable[[], str | None] | None = None,
) -> Iterator[list[bytes]]:
    """A listener's body: events as they arrive, pings between them, one error event at worst.

    Each item is a batch (app/request/call.py, Reply): the events in when the caller's turn came,
    written together. Alone a stream's events go one by one, as they arrive; when several
    arrived in one upstream read, or piled up while the worker was busy, they leave in one
    write instead of one each, so a loaded worker spends less per event, not more.

    Used only after the 200 is decided, so the head may still be pending (we are already
    sending pings while the upstream has not answered). A stream that ends without its
    route's end (``end``: [DONE], or a Responses terminal event; app/request/events.py) and without
    an error event gets an error event: a stream never ends silently. ``on_error`` hears the
    error type of a stream that ends in an error event (its own or the upstream's) or in a
    Responses ``response.failed``, once. ``on_end`` runs once the body is done with, ended,
    failed or closed (not when it is closed before it started). ``on_complete`` hears that
    the stream reached its route's end without an error, before its last bytes leave, with
    whether its usage is an estimate (``Finished``): only such a stream's usage is what the
    upstream billed for the whole answer (app/edge/finish.py). ``ping_first``: the 200 was
    committed because a heartbeat interval passed with nothing to send, so a ping leaves with
    the headers: the caller's line is never silent for more than one interval. ``door``: the
    dialect the call came in by, whose shape the gateway's own error event takes
    (``error_event``). ``stream_id``: a resumable stream's (docs/streams.md), whose events
    each carry an ``id:`` line numbering them from 1; ``after``: a resume's, whose caller has
    the events up to that number (read for how the stream ended, not sent again);
    ``withdrawn``: a resumable stream's look at whether its log was given up since it began
    (its reason), said once in a comment: ``: llmgate: resumable=no; reason=<why>``.

    One generator from the head to the end, the events' loop in it: a stream's every write
    resumes it, and each level of generators more would cost each write its resumption.
    """
    timeout = heartbeat if heartbeat > 0 else None
    try:
        if ping_first:
            on_ping()
            yield [sse.comment()]
        while True:
            try:
                head = listener.wait_head(timeout)
            except ClientGone:
                return
            except GatewayError as exc:
                on_error(tracing.error_type(exc))
                yield [error_event(exc, door)]
                return
            if head is not None:
                break
            on_ping()
            yield [sse.comment()]
        if head.body is not None:
            # The upstream answered with a whole body after we had committed to a stream:
            # carry it over (an error becomes the final error event).
            if head.status >= 300:
                on_error(str(head.status))
                error = GatewayError(_message_of(head.body, head.status), status=head.status)
                if door == ANTHROPIC:
                    yield [error_event(error, door)]
                else:
                    yield [b"data: " + wrap_upstream_body(head.status, head.body) + b"\n\n"]
            else:
                yield [head.body]
            return
        # The started stream: its events as they arrive, pings between them, then its end,
        # with an error event when it ends without its route's end.
        saw_end = saw_error = False
        while True:
            try:
                item = listener.next_batch(timeout)
            except ClientGone:
                return
            if item is None:
                on_ping()
                yield [sse.comment()]
            elif isinstance(item, list):
                batch = item
                for event in batch:
                    if not saw_error and is_error_event(event):
                        saw_error = True
                        on_error("upstream_error")  # the upstream's own error event, relayed
                    if not saw_end and end is not None and end.ends(event):
                        saw_end = True
                        if not saw_error and typed(event) == "response.failed":
                            on_error("upstream_error")  # a Responses stream that ended failed
                if stream_id is None:
                    yield [batch[0].raw] if len(batch) == 1 else [event.raw for event in batch]
                    continue
                # Numbered from the log's count (the events just read are its last ones); a
                # resume's caller has those up to ``after``.
                first = listener.position - len(batch) + 1
                numbered = [(first + k, e) for k, e in enumerate(batch) if first + k > after]
                if numbered:
                    yield [sse.with_id(e.raw, f"{stream_id}:{n}") for n, e in numbered]
                if withdrawn is not None and (why := withdrawn()):
                    withdrawn = None  # said once: a resume of this stream would find nothing
                    yield [sse.comment(f"llmgate: resumable=no; reason={why}")]
            elif isinstance(item, Finished):
                if end is not None and not (saw_end or saw_error):
                    cut = UpstreamReset(f"Upstream ended the stream before {end.expected}.")
                    on_error(tracing.error_type(cut))
                    yield [error_event(cut, door)]
                    return
                if not saw_error:
                    on_complete(item.usage_estimated)
                if item.leftover:
                    yield [item.leftover]
                return
            else:
                on_error(tracing.error_type(item))
                yield [error_event(item, door)]
                return
    finally:
        on_end()


def error_event(exc: GatewayError, door: str = OPENAI) -> bytes:
    """The final event of a broken stream: the OpenAI SDK raises APIError on it; on the
    Anthropic door, Anthropic's ``error`` event, on which its SDK raises."""
    if door == ANTHROPIC:
        return b"event: error\n" + sse.encode_json(anthropic_body(exc.status, exc.message))
    return sse.encode_json(exc.to_body())


def _message_of(body: bytes, status: int) -> str:
    """The message of an upstream's error body in either dialect, else its text."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str):
        return message
    return body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
