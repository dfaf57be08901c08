"""The gateway's side of resumable streams (docs/streams.md), scripted for the client's unit
tests on tests/support/scripted_server.py (no tests in here).

``ResumableGateway(...).app`` answers the chat POST with a numbered stream (``id:
<sid>:<n>``) that is cut at a chosen byte, and each ``GET /v1/streams/<sid>`` with the
behaviour the test lists for it, in order ("rest" once the list is used up):

- ``rest``: the events after the request's ``Last-Event-ID``, then ``[DONE]``;
- ``repeat``: the same, but from event 1 again (events the client has already seen);
- ``cut``: two events after ``Last-Event-ID``, then a reset (a second drop);
- ``404`` / ``503``: the error answer; ``reset``: the connection reset before any answer;
- ``stall``: no answer at all until the client leaves.

Every request is kept (``requests``) for the tests to read its method, path and headers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tests.support.scripted_server import DONE, Exchange, Request, chunk, error_body

SID = "Zk3q9RsT4uVw5xYz6AbCdEf7"  # 24 characters, as the gateway's
WHOLE = ["Once ", "upon ", "a ", "time ", "there ", "was ", "a ", "stream."]
NOT_FOUND = error_body(
    "No resumable stream has this id (it may have expired).",
    "invalid_request_error",
    "stream_not_found",
)


def numbered(events: list[bytes], first: int = 1, sid: str = SID) -> bytes:
    """``events`` (each ``data: ...\\n\\n``) with their ``id:`` lines, numbered from ``first``."""
    return b"".join(
        f"id: {sid}:{n}\n".encode() + event for n, event in enumerate(events, start=first)
    )


@dataclass
class ResumableGateway:
    """One answer (``tokens`` as chunks, a finishing chunk, ``[DONE]``), cut at ``cut_at``
    bytes of its first sending, by ``cut`` ("reset" or "eof": the body ends cleanly)."""

    cut_at: int
    cut: str = "reset"
    tokens: list[str] = field(default_factory=lambda: list(WHOLE))
    offer: str | None = "yes; window=30"  # the response's X-LLMGate-Resumable, None: absent
    stream_id: str | None = SID
    done_numbered: bool = True  # whether [DONE] carries an id too
    resumes: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    @property
    def events(self) -> list[bytes]:
        """The answer's events without ids: the chunks, then [DONE]."""
        return [*(chunk(t) for t in self.tokens), chunk(None, "stop"), DONE]

    @property
    def wire(self) -> bytes:
        """The whole answer as the first response sends it (when not cut)."""
        events = self.events
        if self.done_numbered:
            return numbered(events)
        return numbered(events[:-1]) + events[-1]

    def offset_after(self, k: int) -> int:
        """The byte of the first answer just after its k-th event (a cut there loses none)."""
        return sum(len(event) + 2 for event in self.wire.split(b"\n\n")[:k])

    @property
    def gets(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET"]

    def app(self, request: Request, ex: Exchange) -> None:
        self.requests.append(request)
        if request.method == "POST":
            self._first(ex)
            return
        if request.method == "DELETE":  # the client stopped early: nobody will resume
            ex.respond(200, b'{"object": "stream", "deleted": true}')
            return
        if request.path != f"/v1/streams/{SID}":
            ex.respond(404, NOT_FOUND)
            return
        plan = self.resumes[len(self.gets) - 1] if len(self.gets) <= len(self.resumes) else "rest"
        self._resume(plan, request, ex)

    def _first(self, ex: Exchange) -> None:
        headers = {}
        if self.offer is not None:
            headers["x-llmgate-resumable"] = self.offer
        if self.stream_id is not None:
            headers["x-llmgate-stream-id"] = self.stream_id
        ex.start_stream(headers=headers)
        sent = self.wire[: self.cut_at]
        if sent:
            ex.send(sent)
        self._drop(ex)

    def _drop(self, ex: Exchange) -> None:
        if self.cut == "eof":
            ex.finish()  # the connection stays open: the resume may come over it
        else:
            time.sleep(0.02)  # the bytes reach the client's kernel before the reset does
            ex.reset()

    def _resume(self, plan: str, request: Request, ex: Exchange) -> None:
        if plan in ("404", "503"):
            ex.respond(int(plan), NOT_FOUND if plan == "404" else error_body("busy", "x"))
            return
        if plan == "reset":
            ex.reset()
            return
        if plan == "stall":
            ex.wait_gone(10)
            ex.close()
            return
        after = int(request.headers["last-event-id"].rpartition(":")[2])
        first = 1 if plan == "repeat" else after + 1
        rest = self.wire.split(b"\n\n")[first - 1 : -1]
        ex.start_stream()
        ex.send(b": ping\n\n")  # the gateway's heartbeat while it waits for the log
        if plan == "cut":
            ex.send(b"".join(event + b"\n\n" for event in rest[:2]))
            self._drop(ex)
            return
        ex.send(b"".join(event + b"\n\n" for event in rest))
        ex.finish()
