"""bench/cpu/call_cpu.py times calls that went upstream and were answered, not something else:
every call it makes must be a 200 (an error answer costs less and says nothing of a call;
with ``--keys``, a call whose grant failed is not a 200 either), and the simulator's own
count of the requests it served must equal the calls made."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require_binary


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--kind", "stream"],
        ["--keys", "--callers", "3"],
        ["--floor", "--callers", "3"],
        ["--log"],
        ["--keys", "--no-limits"],
        ["--kind", "stream", "--tps", "2000", "--callers", "10"],
    ],
    ids=[
        "non-stream",
        "stream",
        "keys-concurrent",
        "floor",
        "log",
        "key-without-limits",
        "paced-stream",
    ],
)
def test_the_measurement_is_of_answered_upstream_calls(options: list[str]) -> None:
    if "--keys" in options:
        require_binary("memcached")
    argv = [sys.executable, "-m", "bench.call_cpu", "--measure", "--calls", "30", "--rounds", "2"]
    done = subprocess.run(argv + options, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["calls"] == 30 * 3  # the warm-up and two rounds, each call answered 200
    assert run["upstream_calls"] == run["calls"]  # the simulator's own count
    assert len(run["rounds"]) == 2 and run["us"] == min(run["rounds"]) > 0
    if "--tps" in options:  # paced: each caller's 6 streams of 50 tokens at 2,000 a second
        assert run["rounds_s"] >= 6 * 50 / 2000 * 0.8


@pytest.mark.parametrize(
    ("options", "why"),
    [
        # valgrind slows the reader and not the simulator: an unpaced stream's count moves
        # with the events each read finds, and so does a paced one's among many callers.
        (["--instructions", "10", "--kind", "stream"], "only paced"),
        (
            ["--instructions", "10", "--kind", "stream", "--tps", "100", "--callers", "5"],
            "one caller",
        ),
        (["--instructions", "10", "--kind", "stream", "--tps", "1000"], "at most 100"),
        (["--no-limits"], "give --keys too"),  # without a key it would measure nothing new
        (["--tps", "100"], "give --kind stream"),  # a whole answer has no events to pace
        (["--kind", "stream", "--tps", "0"], "a pace above 0"),
    ],
    ids=[
        "unpaced-stream-not-counted",
        "stream-of-many-callers-not-counted",
        "stream-too-fast-to-count",
        "no-limits-without-a-key",
        "tps-without-a-stream",
        "tps-zero",
    ],
)
def test_a_measurement_that_would_mislead_is_refused(options: list[str], why: str) -> None:
    argv = [sys.executable, "-m", "bench.call_cpu", *options]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and why in done.stderr  # refused before anything starts


def test_a_counted_streams_warm_up_is_the_one_given() -> None:
    """A paced stream is counted with the same few streams of warm-up in both of its runs
    (``--warm-up``), so the difference of the two counts is the N streams alone."""
    argv = [sys.executable, "-m", "bench.call_cpu", "--measure", "--calls", "4", "--rounds", "1"]
    argv += ["--kind", "stream", "--tps", "2000", "--warm-up", "2"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["calls"] == run["upstream_calls"] == 2 + 4
