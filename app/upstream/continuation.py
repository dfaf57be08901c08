"""A stream that outlives its upstream: continued on another upstream call when it breaks.

The rule: a stream of a route that ``continues`` (chat, /v1/messages) whose upstream fails
after it started (a reset, an idle stall, the upstream's own error event, a clean end
without its end mark, an event that is not a JSON object: it is not relayed) is continued
when it can be: the same request is sent again, to an upstream that may continue it, with
the answer so far as a partial assistant turn (app/dialects/continuation.py), and its events
go on in the same stream (app/upstream/splice.py). The caller reads one answer. The stream
is read in its door's dialect (app/upstream/continued_doors.py: chat chunks, or the named
events of /v1/messages).
What cannot be continued is said as before, never faked: the stream ends with its error.
With the read upstream's ``hold_tool_calls``, tool calls wait for the finish (app/upstream/
hold.py): a cut drops them, and the continuation, handed the text before them, writes them.

It can be continued when (``Continuation._continue``, in this order, the first failing one
naming the ``outcome`` of ``llmgate_stream_continuations_total``): the answer shows no
thinking, no tool call, no finish and one choice (app/upstream/transcript.py); the deadline
has time left and the stream has continuations left (``LLMGATE_RETRIES`` a stream); an
upstream may continue it (its ``continuation`` is not ``off`` and it serves the model, or
its ``continues_models`` names it: then it is asked with its own); the worker's retry
budget has room (the one the retries and the hedges share, app/upstream/retry_budget.py);
the caller's key, if it has budgets, takes the continuation's reservation
(``Hooks.reserve_again``). Then each candidate is tried once, in turn, the upstream that
broke last; the first whose stream starts goes on.

What it costs until then: nothing is parsed. The batches relayed are kept (a reference each,
one list append a read; read into a ``Transcript`` only at a cut, or once FOLD events are
kept, to bound the memory of a very long stream), each event's data has its first and last
characters looked at (could it be a chunk?) and each read's last event is looked at (is it
an error event?) before it goes; the request is kept for the stream's life. A
call that cannot be continued (not a stream of a route that continues, no upstream that
continues its model) reads its stream as it did before this module: app/upstream/exchange.py
hands it none.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

import gevent

from app.core.errors import (
    GatewayError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamReset,
    UpstreamTimeout,
)
from app.dialects import continuation as modes
from app.dialects.continuation import CannotContinue, Partial
from app.observe import tracing
from app.observe.tracing import Value
from app.request.events import is_error_event, malformed_chunk
from app.upstream.attempt import READ, READING
from app.upstream.catalog import UpstreamSpec
from app.upstream.continued_doors import door_of
from app.upstream.reading import Patience, ReadRules, Start
from app.upstream.retry import Deadline
from app.upstream.splice import Before, Splice
from app.upstream.transcript import Transcript
from app.upstream.transport import UpstreamRequest
from llmgate_wire import sse

if TYPE_CHECKING:
    from app.upstream.exchange import Upstream

log = logging.getLogger("llmgate.relay")

# The outcomes of a stream that broke and might have been continued.
CONTINUED, FAILED = "continued", "failed"
NO_UPSTREAM, NO_BUDGET, NO_RESERVATION = "no_upstream", "no_budget", "no_reservation"
DEADLINE, EXHAUSTED = "deadline", "exhausted"
FOLD = 4096  # events kept by reference before they are read into the transcript
Batch = list[sse.Event]


class Hooks(Protocol):
    """What a continuation asks of its call (app/request/call.py's Trace): the key's
    reservation for one more upstream call (False: its budgets have no room), and where the
    facts of each continuation go (the log line, the request's span)."""

    def reserve_again(self) -> bool: ...

    def continued(self, fact: Mapping[str, Value | None]) -> None: ...


def may_continue(upstream: Upstream, req: UpstreamRequest) -> bool:
    """Whether a stream of ``req`` could be continued at all: a stream of a route that
    continues, with an upstream that may continue its model (else it is read as before)."""
    if not (req.stream and req.route.continues):
        return False
    return any(spec.continues(req.model) for spec in upstream.continuers)


def _bad(batch: Batch) -> tuple[int, GatewayError] | None:
    """Where a read's events fail, if they do, and how: the first event that is not a chat
    chunk (``malformed_chunk``, app/request/events.py), else the last, if it is the
    upstream's own error event (which ends its stream: nothing comes after it but the end
    of the body)."""
    for at, event in enumerate(batch):
        data = event.data  # a chunk's braces looked at inline first: the common case
        if data and not (data[0] == "{" and data[-1] == "}") and malformed_chunk(data):
            return at, UpstreamProtocolError("The upstream sent an event that is not a chunk.")
    if is_error_event(batch[-1]):
        why = "The upstream ended its stream with an error."
        return len(batch) - 1, UpstreamError(why, code="upstream_error")
    return None


def _note(upstream: str, after: int) -> sse.Event:
    """The comment that says where a continuation began, for tools that read comments (SDKs
    skip them): the upstream that took over, after how many of the stream's data events."""
    text = f"llmgate: continued; upstream={upstream}; after={after}"
    return sse.Event(sse.comment(text), comments=(text,))


def _last(kept: list[Batch], before: sse.Event | None) -> sse.Event | None:
    """The last event of ``kept`` that is not a comment, else ``before``."""
    for batch in reversed(kept):
        for event in reversed(batch):
            if not event.is_comment:
                return event
    return before


class Continuation:
    """The events of one exchange's stream, continued when it breaks (see the module)."""

    def __init__(
        self,
        upstream: Upstream,
        req: UpstreamRequest,
        deadline: Deadline,
        reading: ReadRules,
        hooks: Hooks,
        first: Start,
    ) -> None:
        self._up = upstream
        self._req = req  # kept for the stream's life: a continuation sends it again
        self._deadline = deadline
        self._reading = reading
        self._hooks = hooks
        self.current = first  # the start being read (the exchange closes it at its end)
        self.estimated = False  # a cut call's usage in the sum is an estimate
        self._calls = 1
        self._left = upstream.settings.retries
        self._kept: list[Batch] = []
        self._count = 0
        self._door = door_of(req.route)  # its dialect's reading, splice and request edit
        self._transcript = self._door.transcript()
        self._tail: sse.Event | None = None  # the last event not a comment, once folded
        self._abandoned = False  # the stream's upstream was let go of for a continuation
        held = [s.hold_tool_calls for s in upstream.specs if s.name == first.resp.upstream]
        self._hold = self._door.hold(any(held))  # its tool calls held whole (hold.py)

    # -- the stream --------------------------------------------------------------------------
    def events(self, patience: Patience | None) -> Iterator[Batch]:
        """The stream's events, a batch per read, continued across cuts."""
        source = self._source(patience)
        splice: Splice | None = None
        while True:
            try:
                batch = next(source)
            except StopIteration:
                if self._ended():
                    return
                cut: GatewayError = UpstreamReset("Upstream ended the stream before [DONE].")
                nxt = yield from self._continue(cut, patience, None)
                if nxt is None:
                    return
                source, splice = nxt
                continue
            except GatewayError as exc:  # the read broke: reset, stall, event too large
                nxt = yield from self._continue(exc, patience, None)
                if nxt is None:
                    raise
                source, splice = nxt
                continue
            if batch and (found := _bad(batch)) is not None:
                at, bad = found
                front = self._out(batch[:at], splice)
                if front:
                    yield front
                nxt = yield from self._continue(bad, patience, source)
                if nxt is not None:
                    source, splice = nxt
                    continue
                # Not continued: relayed as it came, and the stream goes on (or, when its
                # upstream was let go of for continuations that all failed, ends there).
                batch = batch[at:]
                if self._abandoned:
                    yield self._out(batch[:1], splice)
                    return
            if batch:
                batch = self._out(batch, splice)
                if not batch:  # all held, or spliced away: an empty batch would be a ping
                    continue
            yield batch

    def _source(self, patience: Patience | None) -> Iterator[Batch]:
        return self._up.reader.events(self.current, self._deadline, self._reading.end, patience)

    def _ended(self) -> bool:
        """The stream read to its end ended as its route's streams end (or with an error
        event relayed as it came)."""
        end = self._reading.end
        last = _last(self._kept, self._tail)
        return end is None or (last is not None and (end.ends(last) or is_error_event(last)))

    def _out(self, batch: Batch, splice: Splice | None) -> Batch:
        """A read's events as the caller gets them (spliced after a continuation), kept."""
        if splice is not None:
            batch = splice.events(batch)
        batch = self._hold.take(batch)
        if batch:
            self._kept.append(batch)
            self._count += len(batch)
            if self._count >= FOLD:
                self._fold()
        return batch

    def _fold(self) -> None:
        """The kept events read into the transcript, and let go of."""
        self._tail = _last(self._kept, self._tail)
        for batch in self._kept:
            self._transcript.read(batch)
        self._kept, self._count = [], 0

    # -- continuing ----------------------------------------------------------------------------
    def _continue(
        self, cut: GatewayError, patience: Patience | None, source: Iterator[Batch] | None
    ) -> Generator[Batch, None, tuple[Iterator[Batch], Splice] | None]:
        """Continue the stream after ``cut``: the next source and its splice, or None when
        it is not continued (``source``: the one still open, for an event that may yet be
        relayed as it came)."""
        self._fold()
        t = self._transcript
        broke = self.current.resp.upstream
        why = t.blocker
        if why is None and (
            self._deadline.remaining() <= 0
            or (isinstance(cut, UpstreamTimeout) and cut.phase == "deadline")
        ):
            why = DEADLINE
        if why is None and self._left <= 0:
            why = EXHAUSTED
        candidates = [] if why else self._candidates(broke)
        if why is None and not candidates:
            why = NO_UPSTREAM
        if why is not None:
            self._told(broke, why, cut)
            return None
        with self._up.budget.request() as claim:
            if not claim.retry():
                self._up.ledger.budget_exhausted()
                self._told(broke, NO_BUDGET, cut)
                return None
            if not self._hooks.reserve_again():
                self._told(broke, NO_RESERVATION, cut)
                return None
            lost = self._abandon(source, cut)
            before = self._before(lost)
            partial = Partial(t.answer, self._used())
            for i, spec in enumerate(candidates):
                if i and not claim.retry():  # each attempt beyond the first, room again
                    self._up.ledger.budget_exhausted()
                    self._told(broke, NO_BUDGET, cut)
                    break
                self._left -= 1
                started = yield from self._open(spec, partial, patience)
                if started is None:
                    self._told(broke, FAILED, cut, spec.name)
                    if self._left <= 0:
                        break
                    continue
                self.current, self._calls = started, self._calls + 1
                self._hold.on = spec.hold_tool_calls
                self.estimated = self.estimated or before.estimated
                self._told(broke, CONTINUED, cut, spec.name)
                yield [_note(spec.name, t.shown)]
                space = spec.continuation == modes.PREFILL and partial.prefill != partial.text
                trim = spec.continuation == modes.INSTRUCTION
                return self._source(patience), self._door.splice(t, before, space, trim)
        return None

    def _candidates(self, broke: str) -> list[UpstreamSpec]:
        """The upstreams that may continue the stream: by breaker state and priority, the
        one that broke last."""
        req, allowed = self._req, self._up.ledger.outliers.refresh()
        found = [
            spec
            for spec in self._up.continuers
            if spec.continues(req.model)
            and (req.upstreams is None or "*" in req.upstreams or spec.name in req.upstreams)
            and spec.speaks(req.route, req.path)
        ]
        usable = [spec for spec in found if allowed(spec.name)] or found
        return sorted(usable, key=lambda spec: (spec.name == broke, spec.priority))

    def _used(self) -> int:
        """The output tokens the answer so far took: as the upstream reported them (a
        running usage, whole at the cut), else one an output event."""
        t = self._transcript
        if t.usage is not None and t.usage_at == t.outputs:
            count = t.usage.get("completion_tokens")
            if isinstance(count, int) and not isinstance(count, bool):
                return count
        return t.outputs

    def _before(self, lost: Transcript) -> Before:
        """The cut calls' usage: the events relayed, and the held tool calls ``lost``."""
        t = lost if lost.outputs else self._transcript  # the last output's usage, if any
        whole = t.usage is not None and t.usage_at == t.outputs
        return Before(
            self._calls, self._transcript.outputs + lost.outputs, t.usage if whole else None
        )

    def _abandon(self, source: Iterator[Batch] | None, cut: GatewayError) -> Transcript:
        """The broken stream let go of: its reads stopped, its attempt failed (unless its
        reader said so already) and closed; its held tool calls dropped (returned)."""
        self._abandoned = True
        if source is not None and hasattr(source, "close"):
            source.close()
        resp = self.current.resp
        if resp.attempt.state in (READING, READ):
            self._up.ledger.broken(resp, cut)
        self.current.close()
        return self._hold.drop()

    def _open(
        self, spec: UpstreamSpec, partial: Partial, patience: Patience | None
    ) -> Generator[Batch, None, Start | None]:
        """The continuation's stream at ``spec`` up to its first events, or None when it did
        not start (or the request cannot be continued there). It is opened in a greenlet of
        its own, so a stream read with patience still gets its heartbeats (an empty batch
        each time the patience runs out)."""
        model = spec.continued_as(self._req.model)  # another only where the file allows it
        try:
            doc = json.loads(self._req.body or b"")
            if model != self._req.model:
                doc["model"] = model
            body = self._door.request(doc, partial, spec.continuation)
        except (CannotContinue, ValueError, TypeError):
            return None
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        req = dataclasses.replace(self._req, body=raw, upstreams=None, model=model, continuing=True)
        job = gevent.spawn(self._start_at, spec, req)
        taken = False
        try:
            while not job.ready():
                job.join(None if patience is None else patience.timeout)
                if not job.ready():
                    yield []
            taken = True
        finally:
            if not taken:
                job.kill(block=True, timeout=2.0)
                if job.successful() and job.value is not None:
                    job.value.close()
        return job.value if job.successful() else None

    def _start_at(self, spec: UpstreamSpec, req: UpstreamRequest) -> Start | None:
        """The continuation's first events (in a greenlet of its own: nothing escapes it)."""
        try:
            resp = self._up.attempts.once(req, self._deadline, spec)
            start = self._up.reader.start(resp, self._deadline, self._reading)
        except GatewayError:
            return None  # the attempt failed and was accounted for (reader.start closed it)
        except Exception:
            log.exception("a continuation could not be opened (request %s)", "-")
            return None
        if start.ok and start.body is None and start.events:
            return start
        if start.body is None:
            self._up.ledger.broken(resp, UpstreamReset("The continuation's stream broke."))
        start.close()
        return None

    def _told(self, broke: str, outcome: str, cut: GatewayError, to: str | None = None) -> None:
        self._up.metrics.stream_continuations.labels(broke, outcome).inc()
        self._hooks.continued(
            {
                "upstream": broke,
                "cut": tracing.error_type(cut),
                "after_events": self._transcript.shown,
                "after_chars": len(self._transcript.answer),
                "outcome": outcome,
                "to": to,
            }
        )
