"""Resuming a dropped stream (docs/streams.md): what makes a stream resumable, how its events
are numbered, and the reconnect itself.

Rules:

- A stream is resumable only when its response said ``X-LLMGate-Resumable: yes; ...`` and
  named its ``X-LLMGate-Stream-ID``. Anything else (``no; reason=...``, a server that ignores
  the header) leaves a drop what it always was, an ``IncompleteStreamError``.
- Events are numbered ``id: <stream id>:<n>``, from 1. An event whose ``n`` is not above the
  highest seen is a repeat: the stream skips it, so the caller gets each event once.
- A reconnect is ``GET /v1/streams/<id>`` with ``Last-Event-ID: <id>:<n>`` and the call's
  own headers, whose credentials the gateway binds the stream to. A resume bills nothing, so
  a failed reconnect (no connection, 429, 5xx) is tried again; a 404 (expired, unknown) or
  any other refusal ends the stream at once, with the cause in the error.
- Each reconnect waits at most the idle timeout for its answer, never past the stream's
  deadline; ``ResumePolicy`` says how many in a row and how far apart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from urllib.parse import quote

from .errors import (
    APIConnectionError,
    APIStatusError,
    IncompleteStreamError,
    LLMGateError,
    from_response,
)
from .policy import Deadline, ResumePolicy, Timeout
from .transport import AttemptTimeouts, Response, Transport

ASK_HEADER = "x-llmgate-resumable"  # the request's "true"; the response's "yes; ..." / "no; ..."
STREAM_ID_HEADER = "x-llmgate-stream-id"


def offered_stream_id(headers: Mapping[str, str]) -> str | None:
    """The stream id when the response (lower-cased headers) made the stream resumable."""
    verdict = headers.get(ASK_HEADER, "").split(";", 1)[0].strip().lower()
    stream_id = headers.get(STREAM_ID_HEADER, "").strip()
    return stream_id if verdict == "yes" and stream_id else None


def event_number(event_id: str | None, stream_id: str) -> int | None:
    """``n`` of an event's ``id: <stream id>:<n>``; None for no id or another stream's."""
    if event_id is None:
        return None
    owner, _, number = event_id.rpartition(":")
    if owner != stream_id or not number.isdigit():
        return None
    return int(number)


def reconnector_for(
    response: Response,
    transport: Transport,
    url: str,
    headers: Mapping[str, str],
    policy: ResumePolicy | None,
    timeout: Timeout,
    sleep: Callable[[float], None],
    rand: Callable[[], float],
) -> Reconnector | None:
    """How the stream of ``response`` resumes: None when resuming is off (``policy``) or
    the gateway did not make it resumable."""
    stream_id = offered_stream_id(response.headers) if policy is not None else None
    if policy is None or stream_id is None:
        return None
    return Reconnector(transport, url, headers, stream_id=stream_id, timeout=timeout,
                       policy=policy, sleep=sleep, rand=rand)  # fmt: skip


class Reconnector:
    """Reopens one resumable stream after a drop. Owned by its ``ChatStream``, one thread."""

    def __init__(
        self,
        transport: Transport,
        path: str,
        headers: Mapping[str, str],
        *,
        stream_id: str,
        timeout: Timeout,
        policy: ResumePolicy,
        sleep: Callable[[float], None],
        rand: Callable[[], float],
    ) -> None:
        self.stream_id = stream_id
        self.url = path.rstrip("/") + "/" + quote(stream_id, safe="")
        self._transport = transport
        self._headers = {k: v for k, v in headers.items() if k not in (ASK_HEADER, "content-type")}
        self._headers["accept"] = "text/event-stream"
        self._idle = timeout.read  # the idle timeout bounds each reconnect, connect included
        self._connect = min(timeout.connect, timeout.read)
        self._policy = policy
        self._sleep = sleep
        self._rand = rand
        self._tries = 0  # reconnects made since the last new event

    def progressed(self) -> None:
        """A new event arrived: the next drop starts with the whole set of attempts."""
        self._tries = 0

    def reopen(self, last: int, deadline: Deadline, cut: IncompleteStreamError) -> Response:
        """An event stream of the events after ``last``, or ``cut`` (the drop) raised again
        with the reason no resume was possible."""
        headers = {**self._headers, "last-event-id": f"{self.stream_id}:{last}"}
        failure: LLMGateError | None = None
        while self._tries < self._policy.attempts:
            wait = self._policy.delay(self._tries, self._rand())
            left = deadline.remaining(time.monotonic())
            if left is not None and wait >= left:
                raise _unresumed(cut, f"no time left before the deadline{_after(failure)}", failure)
            if wait:
                self._sleep(wait)
            self._tries += 1
            outcome = self._attempt(headers, deadline)
            if isinstance(outcome, Response):
                return outcome
            failure = outcome
            if not _worth_retrying(outcome):
                raise _unresumed(cut, _describe(outcome), outcome)
        raise _unresumed(cut, f"{self._tries} reconnects failed{_after(failure)}", failure)

    def delete(self) -> None:
        """Tell the gateway nobody will resume: it stops generating what nobody will read
        (``DELETE /v1/streams/<id>``; best effort, one short try, its answer unread)."""
        short = min(self._connect, 2.0)
        timeouts = AttemptTimeouts(pool=short, connect=short, read=short)
        with contextlib.suppress(LLMGateError):
            response = self._transport.request(
                "DELETE", self.url, body=None, headers=self._headers, timeouts=timeouts
            )
            with contextlib.suppress(LLMGateError):
                response.read_all(Deadline.after(short, time.monotonic()), short)

    def _attempt(self, headers: dict[str, str], deadline: Deadline) -> Response | LLMGateError:
        now = time.monotonic()
        timeouts = AttemptTimeouts(
            pool=deadline.cap(self._idle, now),
            connect=deadline.cap(self._connect, now),
            read=deadline.cap(self._idle, now),
        )
        try:
            response = self._transport.request(
                "GET", self.url, body=None, headers=headers, timeouts=timeouts
            )
        except LLMGateError as exc:
            return exc
        if response.status != 200:
            body = b""
            with contextlib.suppress(LLMGateError):  # the status alone still says enough
                body = response.read_all(deadline, self._idle)
            return from_response(response.status, body, response.headers)
        return response.not_an_event_stream() or response


def _worth_retrying(error: LLMGateError) -> bool:
    if isinstance(error, APIConnectionError):
        return True  # a GET that bills nothing: safe to send again
    return isinstance(error, APIStatusError) and (error.status == 429 or (error.status or 0) >= 500)


def _describe(error: LLMGateError) -> str:
    if isinstance(error, APIStatusError) and error.status == 404:
        return f"the gateway no longer has the stream (404: {error.message})"
    if isinstance(error, APIStatusError):
        return f"the gateway refused the resume ({error.status}: {error.message})"
    return error.message


def _after(failure: LLMGateError | None) -> str:
    return "" if failure is None else f"; the last: {_describe(failure)}"


def _unresumed(
    cut: IncompleteStreamError, reason: str, cause: LLMGateError | None
) -> IncompleteStreamError:
    error = IncompleteStreamError(
        f"{cut.message}; not resumed: {reason}", request_id=cut.request_id, attempts=cut.attempts
    )
    # The reconnect's own error (a NotFoundError for the 404) stays reachable for a caller.
    error.__cause__ = cause if cause is not None else cut.__cause__
    return error
