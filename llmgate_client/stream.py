"""A chat completion stream: SSE bytes in, chunk dicts and text deltas out.

Rules:

- Decoding uses the SSE codec the gateway uses too (``llmgate_wire.sse``); heartbeat
  comments are skipped.
- The stream ends only at ``data: [DONE]``. An error event (``data: {"error": ...}``) raises
  ``StreamError``; an end of body, a broken connection or a malformed event before
  ``[DONE]`` raises ``IncompleteStreamError``: a stream never ends silently.
- Every read waits at most ``min(idle timeout, time left before the deadline)``.
- Stopping early (``break``, ``close()``, leaving the ``with`` block, an exception, garbage
  collection) closes the connection instead of draining it, so the gateway sees the
  disconnect and stops the generation. A stream read to ``[DONE]`` gives its connection
  back to the pool for reuse.
- Nothing here retries: once the caller has seen part of a stream, a retry could repeat it.
  A resumable stream (llmgate_client/resume.py) *resumes* instead: when its connection breaks
  or its body ends before ``[DONE]``, it reconnects for the events after the last one it
  numbered and goes on, skipping any event it has already given; only when no resume is
  possible does the drop raise ``IncompleteStreamError``. An error event, a malformed event
  and a timeout end the stream as above: none of them is a drop.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from llmgate_wire.sse import Decoder, Event

from .errors import (
    APITimeoutError,
    IncompleteStreamError,
    LLMGateError,
    from_event,
)
from .policy import Deadline
from .resume import Reconnector, event_number
from .transport import Response

# After [DONE] the body should end at once; a server that keeps talking is cut off.
_DRAIN_WAIT = 1.0


class ChatStream:
    """Iterate it for chunk dicts, or call ``text_deltas()`` for the content strings.

    Use it as a context manager (or iterate it to the end) so that the connection is always
    released. ``text`` accumulates the content seen so far; ``usage`` and ``finish_reason``
    hold the last values the chunks carried. ``stream_id`` is set when the stream is
    resumable; ``resumes`` counts the reconnects that carried it on after a drop.
    """

    def __init__(
        self,
        response: Response,
        *,
        deadline: Deadline,
        idle_timeout: float,
        attempts: int,
        resume: Reconnector | None = None,
    ) -> None:
        self._response = response
        self._deadline = deadline
        self._idle = idle_timeout
        self._decoder = Decoder()
        self._pending: deque[Event] = deque()
        self.headers = response.headers
        self.request_id: str | None = response.headers.get("x-request-id")
        self.attempts = attempts
        self.completed = False
        self.closed = False
        self._over = False  # the gateway ended the stream (an error event, a refused resume)
        self._text: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self._resume = resume  # None: a drop ends the stream
        self.stream_id = resume.stream_id if resume is not None else None
        self.resumes = 0
        self._last = 0  # the highest event number given to the caller

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Chunk dicts (``chat.completion.chunk``) until ``[DONE]``."""
        try:
            while (chunk := self._next_chunk()) is not None:
                yield chunk
        finally:
            # Reached on normal end (already released), on error, and on GeneratorExit when
            # the caller broke out of its loop.
            self.close()

    def text_deltas(self) -> Iterator[str]:
        """The non-empty content deltas of the first choice, as they arrive."""
        try:
            while (chunk := self._next_chunk()) is not None:
                piece = _delta_content(chunk)
                if piece:
                    yield piece
        finally:
            self.close()

    @property
    def text(self) -> str:
        """The first choice's content received so far."""
        return "".join(self._text)

    def close(self) -> None:
        """Stop reading. Before ``[DONE]`` this closes the connection (never drains it)."""
        if self.closed:
            return
        self.closed = True
        if not self._response.done:
            self._response.abort()
        if self._resume is not None and not (self.completed or self._over):
            # Stopped early on purpose: a resumable stream would otherwise be generated on,
            # for a resume that never comes, until the gateway's window ran out.
            self._resume.delete()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # best effort, maybe at interpreter teardown
            # No DELETE from the garbage collector: no request from wherever a collection
            # happens to run (the gateway stops a stream nobody resumed after its window).
            self._resume = None
            self.close()

    # -- reading ------------------------------------------------------------------------

    def _next_chunk(self) -> dict[str, Any] | None:
        """The next data chunk, or None after [DONE]; raises on error events and cut streams."""
        if self.completed:
            return None
        if self.closed:
            raise IncompleteStreamError(
                "the stream was closed before [DONE]", **self._error_context()
            )
        while True:
            event = self._next_event()
            if event.is_comment or event.data is None:
                continue  # heartbeats and data-less frames carry nothing for the caller
            if self._is_repeat(event):
                continue
            if event.is_done:
                self._finish()
                return None
            try:
                payload = event.json()
            except ValueError as exc:
                self.close()
                raise IncompleteStreamError(
                    f"malformed event in stream: {event.data[:100]!r}", **self._error_context()
                ) from exc
            error = from_event(payload, request_id=self.request_id, attempts=self.attempts)
            if error is not None:
                self._over = True  # the gateway's stream ended with it: nothing to stop
                self.close()
                raise error
            if isinstance(payload, dict):
                self._observe(payload)
                return payload

    def _next_event(self) -> Event:
        while not self._pending:
            data = self._read()
            if isinstance(data, IncompleteStreamError):
                self._resume_or_raise(data)
                continue
            self._pending.extend(self._decoder.feed(data))
        return self._pending.popleft()

    def _read(self) -> bytes | IncompleteStreamError:
        """The next bytes, or the drop (a broken connection, the end of the body) that ends the
        stream unless it resumes. Timeouts raise: a silent server is no drop."""
        try:
            data = self._response.read_chunk(self._deadline, self._idle)
        except APITimeoutError as exc:  # idle timeout, or DeadlineExceeded
            self.closed = True
            exc.attempts, exc.request_id = self.attempts, self.request_id
            raise
        except LLMGateError as exc:
            cut = IncompleteStreamError(
                f"the stream broke before [DONE]: {exc.message}", **self._error_context()
            )
            cut.__cause__ = exc
            return cut
        if data:
            return data
        leftover = self._decoder.close()
        detail = " (an unfinished event was cut off)" if leftover.strip() else ""
        return IncompleteStreamError(
            "the stream ended before [DONE]" + detail, **self._error_context()
        )

    def _resume_or_raise(self, cut: IncompleteStreamError) -> None:
        """Carry on over a new connection from the last event given, or raise the drop."""
        if self._resume is None:
            self.close()
            raise cut
        try:
            response = self._resume.reopen(self._last, self._deadline, cut)
        except IncompleteStreamError:
            self._over = True  # gone, or refused: nothing left to stop
            self.close()
            raise
        self._response = response
        self._decoder = Decoder()  # the cut connection's unfinished event is sent again whole
        self.resumes += 1

    def _is_repeat(self, event: Event) -> bool:
        """True for a numbered event at or below the last one given (a resume sent it again)."""
        if self._resume is None:
            return False
        number = event_number(event.id, self._resume.stream_id)
        if number is None:
            return False  # the gateway's own final error event carries no id
        if number <= self._last:
            return True
        self._last = number
        self._resume.progressed()
        return False

    def _finish(self) -> None:
        """[DONE] seen: read the end of the body so the connection can be reused."""
        self.completed = True
        try:
            while not self._response.done:
                if self._response.read_chunk(self._deadline, min(_DRAIN_WAIT, self._idle)):
                    break  # data after [DONE]: not ours to consume, drop the connection
        except LLMGateError:
            pass
        self.close()

    def _observe(self, chunk: dict[str, Any]) -> None:
        piece = _delta_content(chunk)
        if piece:
            self._text.append(piece)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if reason:
                self.finish_reason = reason

    def _error_context(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "attempts": self.attempts}


def _delta_content(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    delta = choices[0].get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else None
