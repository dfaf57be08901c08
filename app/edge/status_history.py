"""The status page's history: the instance's status of the last 15 minutes, one sample per
period, kept in files that every worker reads, so that /status opens with data whichever
worker answers it.

The rule: one sample per period for the whole instance, whichever worker takes it. A sample
is the status document of its moment (app/edge/status_data.py ``history_sample``), summed over every
worker as /metrics is, from the multiprocess files. It is stored in ``status-history/`` in
the metrics directory as ``<slot>.json``, the slot being the start of its period in whole
seconds of the wall clock (every worker's clock). Each worker wakes once per period, a
random fraction of a second after the slot starts; the first to find the slot's file missing
takes the sample, writes it to a file of its own and links that to the slot's name.
``os.link`` fails when the name exists: the slot keeps the first sample, and a reader finds a
file complete or not at all.

The files outlive the workers, as the counters they sum do: a reload's new workers serve
the history of the old ones. gunicorn.conf.py wipes both when the instance starts.

The work per period is one snapshot (about a millisecond for a few workers) and one small
file; opening the page reads ~90 small files. The loop is never held for long.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("llmgate.history")

KEEP_S = 900  # what the page opens with: 15 minutes
DIRECTORY = "status-history"  # in PROMETHEUS_MULTIPROC_DIR (its *.db files are the metrics)
# How far after a slot's start the workers wake, at most: a spread that lets the first one
# publish before the others look, small next to any period.
_JITTER_S = 1.0


class History:
    """The samples in ``directory``, one per ``period_s`` seconds, the last ``keep_s`` kept."""

    def __init__(self, directory: Path, period_s: int, *, keep_s: int = KEEP_S) -> None:
        if period_s < 1:
            raise ValueError("period_s must be >= 1")
        self.directory = directory
        self.period_s = period_s
        self.keep_s = keep_s

    def slot(self, now: float) -> int:
        return int(now // self.period_s) * self.period_s

    def due(self, now: float) -> bool:
        """Whether the slot of ``now`` has no sample yet."""
        return not (self.directory / f"{self.slot(now)}.json").exists()

    def publish(self, sample: dict[str, Any], now: float) -> bool:
        """Store ``sample`` (taken at ``now``) as its slot's: True, or False when another
        worker stored one first (this one is dropped)."""
        slot = self.slot(now)
        self.directory.mkdir(parents=True, exist_ok=True)
        mine = self.directory / f".{slot}.{os.getpid()}.tmp"
        mine.write_bytes(json.dumps(sample, separators=(",", ":")).encode())
        try:
            os.link(mine, self.directory / f"{slot}.json")
        except FileExistsError:
            return False
        finally:
            mine.unlink(missing_ok=True)
        self.prune(now)
        return True

    def prune(self, now: float) -> None:
        """Remove samples older than ``keep_s`` (and files a dead writer left behind)."""
        oldest = self.slot(now) - self.keep_s - self.period_s
        for slot, path in self._files(include_unpublished=True):
            if slot < oldest:
                path.unlink(missing_ok=True)

    def since(self, after: float, now: float) -> list[dict[str, Any]]:
        """The samples taken after ``after`` within the last ``keep_s``, oldest first."""
        start = max(after, now - self.keep_s)
        samples = []
        for slot, path in self._files():
            if slot + self.period_s <= start:  # its sample was taken before its slot ended
                continue
            try:
                sample = json.loads(path.read_bytes())
            except (OSError, ValueError):  # pruned meanwhile, or not ours
                continue
            taken = sample.get("time") if isinstance(sample, dict) else None
            if isinstance(taken, (int, float)) and taken > start:
                samples.append(sample)
        samples.sort(key=lambda s: s["time"])
        return samples

    def _files(self, *, include_unpublished: bool = False) -> Iterator[tuple[int, Path]]:
        """(slot, path) of each sample file; with ``include_unpublished``, writers' own files
        too (``.<slot>.<pid>.tmp``). Other names are not ours and are left alone."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return
        for entry in entries:
            name = entry.name
            if name.endswith(".json"):
                stem = name.removesuffix(".json")
            elif include_unpublished and name.startswith(".") and name.endswith(".tmp"):
                stem = name[1:].split(".", 1)[0]
            else:
                continue
            if stem.isdigit():
                yield int(stem), Path(entry.path)


def record(
    history: History,
    take: Callable[[float], dict[str, Any]],
    *,
    sleep: Callable[[float], object],
    clock: Callable[[], float] = time.time,
    jitter: Callable[[], float] = random.random,
) -> None:
    """Forever: early in each slot, publish ``take(now)`` unless another worker has. A
    failure is logged (once until it recovers) and the next slot is tried."""
    failing = False
    while True:
        now = clock()
        wait = history.slot(now) + history.period_s - now
        sleep(wait + jitter() * min(_JITTER_S, history.period_s / 4))
        now = clock()
        try:
            if history.due(now):
                history.publish(take(now), now)
        except Exception:
            if not failing:
                log.exception("status history: the sample of %.0f was not kept", now)
            failing = True
        else:
            if failing:
                log.info("status history: samples kept again")
            failing = False
