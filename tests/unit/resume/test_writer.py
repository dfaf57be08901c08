"""A resumable stream's log writer (app/resume/writer.py) against a store that loses or
refuses what it holds, as a restarted or unreachable Memcached does: the log is promised
only once its first item is written, written again whole when it is lost, and the answer
is read to its end meanwhile. The store is the real in-process backend behind a switch; the
flight's producer is a script (tests/support/flights.py)."""

from __future__ import annotations

import gevent
import gevent.event

from app.request import routes
from app.resume import ids
from app.resume.reader import StoredStream
from app.resume.record import Meta
from app.resume.writer import LogWriter
from app.store.memory import MemoryBackend
from app.streams.answer import Finished, Head
from app.streams.flight import Flight
from app.streams.flight_life import COMPLETE
from app.streams.log_memory import LogBudget, LogShare
from llmgate_wire import sse
from tests.support.flights import script

KEY = ids.log_key("key:test", "W" * 24)
HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)
PAD = "x" * 1000  # ~1 KB events: a 32 KiB chunk seals every ~31 of them


class Switched(MemoryBackend):
    """The in-process backend, which can refuse every command (``down``) or lose all it
    holds (``restart``), as a Memcached node does when it is unreachable or restarted."""

    def __init__(self) -> None:
        super().__init__(64 << 20)
        self.down = False

    def restart(self) -> None:
        for key in list(self._entries):
            super().delete(key)

    def get(self, key: str) -> bytes | None:
        return None if self.down else super().get(key)

    def set(self, key: str, value: bytes, ttl: int) -> bool:
        return not self.down and super().set(key, value, ttl)

    def touch(self, key: str, ttl: int) -> bool:
        return not self.down and super().touch(key, ttl)

    def delete(self, key: str, *, force: bool = False) -> None:
        if not self.down:
            super().delete(key, force=force)


def events(first: int, last: int) -> list[sse.Event]:
    raw = b"".join(sse.encode_json({"n": n, "pad": PAD}) for n in range(first, last + 1))
    return sse.Decoder().feed(raw + sse.encode("[DONE]") if last == 100 else raw)


def writer_for(flight: Flight, store: Switched, share: LogShare | None = None) -> LogWriter:
    ended: list[LogWriter] = []
    return LogWriter(
        store,
        KEY,
        flight,
        Meta(routes.CHAT, False),
        window_s=60,
        cap=4 << 20,
        lifetime_s=600,
        on_end=ended.append,
        share=share,
    )


def logged_numbers(store: Switched, *, whole: bool = True) -> list[int]:
    """The events a resume from the first would read back, by their numbers: up to the
    end (``whole``: -1 last when there is none within its wait), or what there is now."""
    stream = StoredStream(store, KEY, after=0, window_s=60, patience_s=5.0)
    out = []
    while True:
        item = stream.next_item(1.0 if whole else 0.2)
        if isinstance(item, sse.Event):
            if item.data != "[DONE]":
                out.append(item.json()["n"])
            continue
        return [*out, -1] if whole and not isinstance(item, Finished) else out


def run(flight: Flight, writer: LogWriter) -> None:
    """Until the flight settled and the writer finished."""
    caller = flight.join()
    while not isinstance(caller.next_batch(5.0), Finished | type(None)):
        pass
    caller.leave()
    for _ in range(100):
        if writer.finished:
            return
        gevent.sleep(0.05)
    raise AssertionError("the writer did not finish")


def test_the_log_is_promised_only_once_its_first_item_is_written() -> None:
    store, gate = Switched(), gevent.event.Event()
    store.down = True
    flight = Flight(script(HEAD, gate, *events(1, 100), Finished(b"")))
    writer = writer_for(flight, store)
    assert writer.open() is False
    assert flight.listeners == 0  # it left the flight it joined
    gate.set()


def test_a_log_lost_mid_stream_is_written_again_whole() -> None:
    """Memcached restarted (empty) after 60 events: the writer finds its log gone at its
    next write and writes the meta and every chunk again; a resume reads all 100."""
    store, gate = Switched(), gevent.event.Event()
    flight = Flight(script(HEAD, *events(1, 60), gate, *events(61, 100), Finished(b"")))
    writer = writer_for(flight, store)
    assert writer.open()
    gevent.sleep(0.3)  # the first 60 written, two chunks sealed
    assert logged_numbers(store, whole=False) == list(range(1, 61))
    store.restart()
    assert store.get(KEY) is None
    gate.set()
    run(flight, writer)
    assert writer.how == "complete" and flight.state == COMPLETE
    assert logged_numbers(store) == list(range(1, 101))


def test_a_store_down_for_a_while_costs_the_answer_nothing() -> None:
    """Memcached unreachable from event 40 to the end of the answer, then back: the answer
    is read to its end all the while (the flight completes: never abandoned), and the log
    is whole once the writer can write again."""
    store, gate, back = Switched(), gevent.event.Event(), gevent.event.Event()
    flight = Flight(script(HEAD, *events(1, 40), gate, *events(41, 100), back, Finished(b"")))
    writer = writer_for(flight, store)
    assert writer.open()
    gevent.sleep(0.3)
    store.down = True
    gate.set()
    gevent.sleep(0.5)  # writes refused meanwhile
    store.restart()
    store.down = False
    back.set()
    run(flight, writer)
    assert flight.state == COMPLETE
    assert logged_numbers(store) == list(range(1, 101))


def test_a_lost_log_the_worker_could_not_keep_is_withdrawn_and_deleted() -> None:
    """No memory to keep the sealed chunks (a share with no room): when Memcached loses
    the log the writer cannot write it again; it says so (``withdrawn``) and deletes what
    is left, so a resume finds nothing rather than a log with a hole."""
    store, gate = Switched(), gevent.event.Event()
    flight = Flight(script(HEAD, *events(1, 60), gate, *events(61, 100), Finished(b"")))
    writer = writer_for(flight, store, share=LogShare(LogBudget(0)))
    assert writer.open()
    gevent.sleep(0.3)
    store.restart()
    gate.set()
    run(flight, writer)
    assert writer.withdrawn == "withdrawn" and writer.how == "withdrawn"
    assert store.get(KEY) is None
