"""bench/cpu/hit_cpu.py times hits, not something else: its one process stores the answer with
a real call to the simulator, then every timed call is a HIT from the worker's L1, or from
the floor app's dict, and the simulator was asked once (a measurement of misses or errors
would be far off and say nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("floor", "cache"), [(False, "HIT; level=l1"), (True, "HIT (the floor's dict)")]
)
def test_the_measurement_is_of_hits(floor: bool, cache: str) -> None:
    argv = [sys.executable, "-m", "bench.cpu.hit_cpu", "--measure", "--calls", "200"]
    argv += ["--rounds", "2"]
    done = subprocess.run(
        argv + (["--floor"] if floor else []), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["cache"] == cache
    assert len(run["rounds"]) == 2 and run["us"] == min(run["rounds"]) > 0
    assert run["gc_us"] >= 0 and run["gc_passes"] >= 0
