"""Fan-out of many independent calls over a bounded thread pool, results in input order.

Rules:

- At most ``max_workers`` calls are in flight; the next input is read from the iterable only
  when a worker is free, so a long (or endless) input is never loaded or queued at once.
- Each call's exception is captured in its ``Outcome``; one failure never fails the batch.
- Outcomes come back in input order; finished ones wait only for their predecessors.
- With a ``deadline``, nothing is started once it has passed and each call gets the batch
  deadline as its own upper bound; inputs never started become ``DeadlineExceeded`` outcomes
  with ``attempts == 0``, as does an input the call refused before sending it (not a JSON
  object, or the reader's verdict on a line).
- The progress callback runs on the caller's thread (never on a worker), once per outcome.

Connections: workers share the client's pool (``block=True``), so the number of sockets is
at most ``min(max_workers, pool_size)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import DeadlineExceeded, LLMGateError
from .policy import Deadline

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """One input's result or error. ``latency`` is the call's wall time in seconds."""

    index: int
    result: R | None = None
    error: Exception | None = None
    latency: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def attempts(self) -> int:
        """The HTTP attempts the call made: its error's count, or its result's. An error
        that is not the client's (a bad input item, refused before any request: the client
        raises everything of a request that went out as an ``LLMGateError``) made none."""
        if isinstance(self.error, LLMGateError):
            return self.error.attempts
        if self.error is not None:
            return 0
        return int(getattr(self.result, "attempts", 1))


Progress = Callable[[int, int | None, "Outcome[Any]"], None]
"""``progress(done, total, outcome)``; ``total`` is None when the input has no length."""


def iter_map(
    call: Callable[[T, Deadline], R],
    items: Iterable[T],
    *,
    max_workers: int,
    deadline: float | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Outcome[R]]:
    """Run ``call(item, batch_deadline)`` for every item; yield outcomes in input order."""
    if max_workers < 1:
        raise ValueError("max_workers must be >= 1")
    until = Deadline.after(deadline, clock())
    total = len(items) if isinstance(items, Sized) else None
    source = enumerate(items)
    running: dict[Future[Outcome[R]], int] = {}
    ready: dict[int, Outcome[R]] = {}
    next_index = 0
    done = 0
    exhausted = False
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="llmgate-map") as pool:
        while True:
            while not exhausted and len(running) < max_workers and not until.expired(clock()):
                entry = next(source, None)
                if entry is None:
                    exhausted = True
                    break
                index, item = entry
                running[pool.submit(_run_one, call, index, item, until, clock)] = index
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                del running[future]
                outcome = future.result()
                ready[outcome.index] = outcome
                done += 1
                if progress is not None:
                    progress(done, total, outcome)
            while next_index in ready:
                yield ready.pop(next_index)
                next_index += 1
    for index, _item in source:  # only left over when the deadline stopped submission
        outcome = Outcome[R](
            index=index,
            error=DeadlineExceeded("not started: the batch deadline had passed", attempts=0),
        )
        done += 1
        if progress is not None:
            progress(done, total, outcome)
        yield outcome


def _run_one(
    call: Callable[[T, Deadline], R],
    index: int,
    item: T,
    until: Deadline,
    clock: Callable[[], float],
) -> Outcome[R]:
    started = clock()
    try:
        result = call(item, until)
    except Exception as exc:  # captured per item by design; the caller inspects .error
        return Outcome(index=index, error=exc, latency=clock() - started)
    return Outcome(index=index, result=result, latency=clock() - started)
