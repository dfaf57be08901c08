"""Resumable streams for the orchestrator (app/gateway.py): who may have one, its start, and
a resume. The protocol is docs/streams.md.

A stream that asks is admitted when the deployment allows it (LLMGATE_RESUME_WINDOW_S) and
its worker has room: a share of the kept-log memory for the events waiting to be written
(``PENDING_BYTES``) and a reservation of the Memcached budget for the log
(app/resume/budget.py). Admitted, it gets an id, a writer (app/resume/writer.py) and a
settlement that waits for the answer's end (``SettledAtTheEnd``). A resume finds the log by
the id and the caller's owner (app/resume/ids.py) and reads it back (app/resume/reader.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs

from app.core.config import Settings
from app.core.errors import NotFound, ServiceUnavailable
from app.observe.metrics import Metrics
from app.observe.unobserved import UNOBSERVED
from app.request.call import SSE_HEADERS, Call, Reply, Settlement
from app.request.headers import tenant_of
from app.request.metering import without_usage_chunk
from app.request.routes import RESUME
from app.request.usage import Usage
from app.resume import ids
from app.resume.budget import Reservation, ResumeBudget
from app.resume.reader import StoredStream
from app.resume.record import SEAL_BYTES, Meta
from app.resume.writer import LogWriter, Store
from app.store.memcached import Unavailable
from app.streams.flight import Flight
from app.streams.log_memory import LogBudget, LogShare
from app.streams.relay import relay
from app.streams.reply import NO_OFFER, Offer

RESUMED = "RESUMED"  # the X-LLMGate-Cache status of a resume: nothing billed


class StreamNotFound(NotFound):
    code = "stream_not_found"


class ResumeUnavailable(ServiceUnavailable):
    """The log's store could not answer (a Memcached node down or just restarted): whether
    the stream is there is not known, so it is not said to be gone; the caller may come
    back in a second (every id gets this answer alike: no oracle)."""

    code = "resume_unavailable"

    def __init__(self) -> None:
        super().__init__(
            "Resumable streams cannot be read right now; retry shortly.",
            headers={"retry-after": "1", "retry-after-ms": "1000"},
        )


def not_found() -> StreamNotFound:
    """One answer for an unknown, expired, made-up and foreign id: no oracle."""
    return StreamNotFound("No resumable stream has this id (it may have expired).")


def owner_of(call: Call) -> str:
    """Who owns the streams a call makes and may resume them: its gateway key (the name
    ``Gateway.identify`` put on its trace), or with keys off the credential it sends (hashed,
    as the cache's tenant is)."""
    return "key:" + call.trace.key if call.trace.key is not None else tenant_of(call.headers)


# The kept-log memory a resumable stream holds for its events on their way to Memcached: the
# chunk being written (up to SEAL_BYTES of bytes) as Python objects, about three times that.
PENDING_BYTES = 4 * SEAL_BYTES


@dataclass
class Admitted:
    share: LogShare
    reservation: Reservation


@dataclass(frozen=True)
class Resumable:
    """A stream made resumable: its id and its writer."""

    stream_id: str
    writer: LogWriter


class Resumes:
    def __init__(
        self,
        settings: Settings,
        store: Store | None,
        log_budget: LogBudget,
        metrics: Metrics = UNOBSERVED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = settings.resume_window_s
        self.cap = settings.resume_stream_bytes
        self.deadline_s = settings.deadline_s
        self.heartbeat_s = settings.heartbeat_s
        self.store = store
        self.log_budget = log_budget
        self.budget = ResumeBudget(settings.resume_memcached_bytes, clock)
        self.metrics = metrics
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self.window_s > 0 and self.store is not None

    # -- a resumable stream -----------------------------------------------------------------
    def asked(self, call: Call) -> bool:
        """Whether the call asks for its stream to be resumable (answered or refused in
        ``attach``)."""
        return ids.asked(call.headers)

    def attach(self, call: Call, flight: Flight) -> Offer:
        """For a stream about to be relayed from ``flight``: when its call asks to be
        resumable, its log is started (a writer joins the flight) and the stream id and the
        headers that say so are returned; else no id, and the headers that say why (none
        for a call that did not ask). The flight may be the call's own, or one it coalesced
        onto (which a resumable call keeps going for a resume as its own)."""
        if not ids.asked(call.headers):
            return NO_OFFER
        if flight.event_count and not flight.log_whole:  # joined too late to log from 1
            return Offer(None, ids.refused_headers(self._counted(ids.JOINED_LATE)))
        admitted = self.admit()
        if isinstance(admitted, str):
            return Offer(None, ids.refused_headers(admitted))
        span = call.trace.span
        traceparent = None if span is None else span.inject({}).get("traceparent")
        meta = Meta(call.route, call.trace.hide_usage, traceparent)
        # The stream may run until its deadline (LLMGATE_DEADLINE_S, from its flight's start).
        lifetime_s = max(0.0, self.deadline_s - (self._clock() - flight.started))
        resumable = self.begin(
            flight, admitted, owner=owner_of(call), meta=meta, lifetime_s=lifetime_s
        )
        if resumable is None:
            return Offer(None, ids.refused_headers(self._counted(ids.STORE)))
        writer = resumable.writer
        call.trace.settled_otherwise(lambda grant: SettledAtTheEnd(grant, writer))
        granted = ids.granted_headers(resumable.stream_id, self.window_s)
        return Offer(resumable.stream_id, granted, lambda: writer.withdrawn)

    # -- a resume ---------------------------------------------------------------------------
    def is_resume(self, call: Call) -> bool:
        """GET or DELETE /v1/streams/{id}; or, while resuming is on, a POST to a stream route
        with Last-Event-ID (off, the header means nothing to us and the call goes on)."""
        if call.route is RESUME:
            return True
        return (
            self.enabled
            and call.method == "POST"
            and call.route.resumable
            and ids.last_event_id(call.headers) is not None
        )

    def reply(self, call: Call, owner: str) -> Reply:
        """The resume's stream: the events after the caller's last, the live rest, the end;
        StreamNotFound (404) for any id that is not this caller's live or kept stream;
        ResumeUnavailable (503) when the logs' store cannot say."""
        wanted = self._wanted(call)
        try:
            found = None if wanted is None else self.find(owner, *wanted)
        except ResumeUnavailable:
            self.metrics.resumes.labels("unavailable").inc()
            raise
        deleting = call.method == "DELETE"
        outcome = "not_found" if found is None else "deleted" if deleting else "resumed"
        self.metrics.resumes.labels(outcome).inc()
        if wanted is None or found is None:
            raise not_found()
        meta, reader = found
        if deleting:
            return self._deleted(wanted[0], reader.key)
        call.admission.admit(True)
        call.trace.resuming(meta.traceparent)
        stream_id = wanted[0]
        body = relay(
            reader,
            heartbeat=self.heartbeat_s,
            end=meta.route.end,
            door=meta.route.door,
            stream_id=stream_id,
            after=reader.after,
        )
        if meta.hide_usage:
            body = without_usage_chunk(body, lambda _: None)
        headers = [*SSE_HEADERS, *ids.granted_headers(stream_id, self.window_s)]
        counted = self._counted_at_end(body, reader)
        return Reply(200, headers, counted, cache=RESUMED, stream_id=stream_id)

    def _deleted(self, stream_id: str, key: str) -> Reply:
        """DELETE /v1/streams/{id}: the log is deleted now (a resume after this one is the
        404 of any unknown id), and a stream still running stops being logged within a
        second; its upstream call stops once its caller is gone (a caller still reading
        stops it by closing its connection)."""
        assert self.store is not None
        self.store.set(ids.deleted_key(key), b"1", self.window_s)
        self.store.delete(key)  # the meta item: no resume finds the stream from now on
        for i in range(self.cap // SEAL_BYTES + 1):  # its chunks, up to the first not there
            chunk = ids.chunk_key(key, i)
            if self.store.get(chunk) is None:
                break
            self.store.delete(chunk)
        body = json.dumps({"id": stream_id, "object": "stream", "deleted": True}).encode()
        return Reply(200, [("Content-Type", "application/json")], body)

    def _wanted(self, call: Call) -> tuple[str, int] | None:
        """(stream id, events the caller has) from the call, None when malformed."""
        last = ids.last_event_id(call.headers)
        parsed = None if last is None else ids.parse_event_id(last)
        if call.route is not RESUME:
            return parsed
        stream_id = call.path.rsplit("/", 1)[-1]
        if not ids.is_stream_id(stream_id):
            return None
        if last is not None:  # the id the caller last saw must be of this stream
            return parsed if parsed is not None and parsed[0] == stream_id else None
        after = ids.parse_after(parse_qs(call.query).get("after", [None])[0])
        return None if after is None else (stream_id, after)

    def _counted_at_end(
        self, body: Iterator[list[bytes]], reader: StoredStream
    ) -> Iterator[list[bytes]]:
        try:
            yield from body
        finally:
            self._count_replayed(reader)

    def admit(self) -> Admitted | str:
        """Room for one more resumable stream, or the reason there is none."""
        if not self.enabled:
            return self._counted(ids.DISABLED)
        share = LogShare(self.log_budget)
        if not share.take(PENDING_BYTES):
            return self._counted(ids.LOG_MEMORY)
        reservation = self.budget.reserve(self.cap)
        if reservation is None:
            share.release()
            return self._counted(ids.BUDGET)
        self._counted("yes")
        return Admitted(share, reservation)

    def begin(
        self, flight: Flight, admitted: Admitted, *, owner: str, meta: Meta, lifetime_s: float
    ) -> Resumable | None:
        """Log ``flight`` for resumes (call before the flight's greenlet first runs); None
        when Memcached did not take the log's first item: the stream is not resumable."""
        stream_id = ids.new_stream_id()

        def ended(writer: LogWriter) -> None:
            admitted.share.release()
            admitted.reservation.expire_at(self._clock() + self.window_s)
            self.metrics.resume_logs.labels(writer.how).inc()

        assert self.store is not None
        writer = LogWriter(
            self.store,
            ids.log_key(owner, stream_id),
            flight,
            meta,
            window_s=self.window_s,
            cap=self.cap,
            lifetime_s=lifetime_s,
            on_end=ended,
            share=admitted.share,
            clock=self._clock,
        )
        if not writer.open():
            admitted.share.release()
            admitted.reservation.expire_at(self._clock())
            return None
        return Resumable(stream_id, writer)

    def find(self, owner: str, stream_id: str, after: int) -> tuple[Meta, StoredStream] | None:
        """The stream ``stream_id`` of ``owner`` from after event ``after``; None for an
        unknown, expired, made-up or another owner's id alike."""
        key = ids.log_key(owner, stream_id)
        try:
            data = self.store.lookup(key) if self.store is not None and self.enabled else None
        except Unavailable:
            raise ResumeUnavailable() from None
        meta = None if data is None else Meta.decode(data)
        if meta is None:
            return None
        assert self.store is not None
        reader = StoredStream(
            self.store,
            key,
            after=after,
            window_s=self.window_s,
            patience_s=self.deadline_s,
            clock=self._clock,
        )
        return meta, reader

    def replayed(self, call: Call, reply: Reply | None) -> Reply | None:
        """A stored answer's reply to ``call``: a stream that asked to be resumable is told
        it is not (the answer is in the cache: asking again costs as little)."""
        if reply is not None and not isinstance(reply.body, bytes) and ids.asked(call.headers):
            reply.headers += ids.refused_headers(self._counted(ids.CACHED))
        return reply

    def _count_replayed(self, reader: StoredStream) -> None:
        if reader.replayed:
            self.metrics.resume_events_replayed.inc(reader.replayed)

    def _counted(self, result: str) -> str:
        self.metrics.resumable_streams.labels(result).inc()
        return result


@dataclass(frozen=True)
class SettledAtTheEnd:
    """A resumable stream's grant, settled when the answer ends rather than when its caller
    leaves: a caller who drops and resumes is billed once, for the answer's own usage (what
    its writer saw), not for the reservation a caller who left keeps."""

    inner: Settlement
    writer: LogWriter

    @property
    def headers(self) -> list[tuple[str, str]]:
        return self.inner.headers

    def reserve_again(self) -> bool:
        return self.inner.reserve_again()

    def settle(self, usage: Usage | None, billed: bool, served: bool) -> None:
        if usage is not None or not billed:
            self.inner.settle(usage, billed, served)
            return
        # The caller left (or its stream broke): the answer goes on for a resume, and the
        # key keeps the call's stream slot and reservation until the upstream's own end.
        writer, inner = self.writer, self.inner
        writer.when_finished(lambda: inner.settle(writer.bill, billed, served))
