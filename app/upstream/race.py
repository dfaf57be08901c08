"""Hedged first token: the primary exchange, and after a delay a backup, race to stream first.

``first_to_start`` runs the primary exchange up to its first event. When that has not happened
within the hedge delay it starts the backup beside it; the first of the two to start
streaming (or to bring a whole successful answer) is kept and the other is killed, which
closes its upstream connection: a generation nobody will read is not left running. An
exchange that fails while the other is still running gives way to it; when both fail, the
primary's outcome is the one reported (it already had its own retries and failover).

The cost is the backup's tokens until it is closed; ``llmgate_hedges_total`` counts every
backup sent, by which one won, so it stays visible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import gevent
from gevent.queue import Empty, Queue


class Contender(Protocol):
    """An exchange that reached its first event (or its whole answer) and owns a connection."""

    @property
    def ok(self) -> bool: ...  # a successful answer: keep it

    def close(self) -> None: ...  # give up the exchange and its connection


S = TypeVar("S", bound=Contender)

PRIMARY, BACKUP, FAILED, NOT_SENT = "primary", "backup", "failed", "not_sent"


def first_to_start(
    primary: Callable[[], S], backup: Callable[[], S | None], delay: float
) -> tuple[S, str]:
    """The start to keep, and the hedge's verdict: ``not_sent`` (the primary was in time,
    or ``backup`` declined by returning None), else who won: ``primary``, ``backup`` or
    ``failed`` (both failed; the primary's result is returned or its exception raised)."""
    done: Queue[tuple[str, S | BaseException | None]] = Queue()
    running = {PRIMARY: gevent.spawn(_run, PRIMARY, primary, done)}
    sent = False  # a backup was started and did not decline
    reported: S | BaseException | None = None  # the primary's failure, if it failed
    try:
        try:
            first = done.get(timeout=delay)
        except Empty:
            running[BACKUP] = gevent.spawn(_run, BACKUP, backup, done)
            sent = True
            first = done.get()
        while True:
            who, outcome = first
            del running[who]
            if who == BACKUP and outcome is None:
                sent = False
            if _is_ok(outcome):
                if reported is not None and not isinstance(reported, BaseException):
                    reported.close()  # the primary's error answer, overtaken by the backup
                return outcome, (who if sent else NOT_SENT)
            if who == PRIMARY:
                reported = outcome
            elif isinstance(outcome, Exception) or outcome is None:
                pass  # the backup failed or was not sent: the primary may still come
            else:
                outcome.close()  # the backup's error answer: not the one to report
            if not running:
                verdict = FAILED if sent else NOT_SENT
                if isinstance(reported, BaseException):
                    raise reported
                assert reported is not None
                return reported, verdict
            first = done.get()
    finally:
        # The loser, still running: killed in its read or connect, it closes its own
        # connection. One that finished but lost waits in the queue: closed here.
        for greenlet in running.values():
            greenlet.kill(block=True)
        while not done.empty():
            _, left = done.get_nowait()
            if left is not None and not isinstance(left, BaseException):
                left.close()


def _run(
    who: str, exchange: Callable[[], S | None], done: Queue[tuple[str, S | BaseException | None]]
) -> None:
    try:
        done.put((who, exchange()))
    except Exception as exc:  # handed to first_to_start, which raises or discards it
        done.put((who, exc))


def _is_ok(outcome: object) -> bool:
    return outcome is not None and not isinstance(outcome, BaseException) and outcome.ok  # type: ignore[attr-defined]
