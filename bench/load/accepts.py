"""A fresh stack's first burst, with each setting of LLMGATE_ACCEPTS_PER_TURN in turns:
`python -m bench.compare --public --callers 800 --rounds 3 --accepts 1,64`.

Each round starts one fresh `make run`-shaped stack per setting (bench/load/public.py's
options, the 20 ms mock), the settings in turns so that the machine's other load falls on
each alike. On each: the **first burst** (twice the callers, non-stream chat calls, before any
warm-up: nginx opens its connections to gunicorn as the callers arrive), its p50/p99 and the
mean Server-Timing stages of its tail against the fair bound (bench/load/public.py's
``tail_stages``); how the two workers shared it, as the connections from nginx each worker
holds after it and the CPU seconds each spent on it (also over the warm step: /proc,
bench/kit/proctree.py); gunicorn's accept queue meanwhile, as the kernel shows it
(``QueueWatch``); then the public method's warm step at the same callers (its warm-up
first), which must not get worse.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.kit import loadgen, proctree
from bench.kit.loadgen import pct
from bench.load import public as method

COLUMNS = [
    "accepts a turn",
    "round",
    "what",
    "req/s",
    "p50 ms",
    "p99 ms",
    "fair bound ms",
    "errors",
    "the tail's queue / work / gateway ms",
    "nginx conns per worker",
    "CPU s per worker",
    "accept queue: most waiting / ms with any",
]
SAMPLE_S = 0.005


class QueueWatch:
    """gunicorn's accept queue (bench/kit/proctree.py's ``accept_queue``) sampled every
    SAMPLE_S in a thread of its own while a burst runs: the most connections waiting at
    once, and how long any waited (a count of samples, in ms): what a worker taking more a
    turn changes, read from the kernel, not from the gateway's own timings."""

    def __init__(self, port: int) -> None:
        self.port, self.most, self.busy_s = port, 0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._done.is_set():
            waiting = proctree.accept_queue(self.port)
            now = time.monotonic()
            self.most = max(self.most, waiting)
            if waiting:
                self.busy_s += now - last
            last = now
            time.sleep(SAMPLE_S)

    def __str__(self) -> str:
        return f"{self.most} / {1000 * self.busy_s:.0f}"


def _stages(tail: dict[str, float]) -> str | None:
    if not tail:
        return None
    return (
        f"{tail.get('queue', 0):.1f} / {tail.get('work', 0):.1f} / {tail.get('gateway', 0):.1f}"
        f" of {tail['total']:.0f}"
    )


def first_burst(accepts: int, callers: int, round_: int) -> list[list[Any]]:
    """One fresh stack at ``accepts``: its first burst's row and its warm step's row."""
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-accepts-"))
    env = {"LLMGATE_ACCEPTS_PER_TURN": str(accepts)}
    try:
        with method.started(method.options(run_dir, env)) as stack:
            gateway = method.address(stack.url)
            port = method.address(stack.app_url)[1]
            workers = proctree.children(stack.proc("gunicorn").popen.pid)
            before = [proctree.cpu_s([w]) for w in workers]
            with QueueWatch(port) as queue:
                found = loadgen.run(
                    *gateway, method.chat(), callers, callers * 2, keep="Server-Timing"
                )
            cpu = [proctree.cpu_s([w]) - b for w, b in zip(workers, before, strict=True)]
            conns = [proctree.accepted_on([w], port) for w in workers]
            p99 = pct(found.total, 0.99)
            errors = ", ".join(f"{k} {v}" for k, v in sorted(Counter(found.errors).items()))
            burst = [
                accepts,
                round_,
                "first burst",
                found.rps,
                pct(found.total, 0.5),
                p99,
                2000 * callers / found.rps if found.rps else float("nan"),
                errors or "0",
                _stages(method.tail_stages(found.kept, p99 / 1000)),
                " / ".join(str(c) for c in conns),
                " / ".join(f"{c:.2f}" for c in cpu),
                str(queue),
            ]
            before = [proctree.cpu_s([w]) for w in workers]
            warm = method.step(
                gateway, method.chat(), callers, max(3000, callers * 10), stack.sim_url
            )
            cpu = [proctree.cpu_s([w]) - b for w, b in zip(workers, before, strict=True)]
            errors = ", ".join(f"{k} {v}" for k, v in sorted(warm.errors.items()))
            after = [proctree.accepted_on([w], port) for w in workers]
            steady = [accepts, round_, "warm step", warm.rps, warm.p50_ms, warm.p99_ms]
            steady += [warm.fair_bound_ms, errors or "0", _stages(warm.tail_ms)]
            steady += [" / ".join(str(c) for c in after), " / ".join(f"{c:.2f}" for c in cpu)]
            steady += [None]
            return [burst, steady]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def compare(settings: list[int], callers: int, rounds: int) -> list[list[Any]]:
    """Every setting's rows, round by round, the settings in turns within each round."""
    rows = []
    for round_ in range(1, rounds + 1):
        for accepts in settings:
            rows.extend(first_burst(accepts, callers, round_))
            print(rows[-2], rows[-1], flush=True)
    return rows
