"""`python -m bench`'s parts: each name of the report's map (bench/kit/report.py's MODULES) is
a module with ``run``, so a module moved without its entry fails here rather than leaving
the report a section short (an absent part is not a problem for `make bench-smoke`); and a
name that is not a part is refused before anything runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from bench.kit import report
from tests.conftest import ROOT


def test_each_part_of_the_report_is_a_module_with_run() -> None:
    assert list(report.MODULES) == [
        "overhead",
        "features",
        "keyed",
        "memory",
        "cache",
        "capacity",
        "http2",
        "seed",
        "trace_latency",
        "translation",
        "prompt_cache",
        "public",
    ]
    for name, path in report.MODULES.items():
        assert callable(getattr(importlib.import_module(path), "run", None)), name


def test_a_part_not_in_the_report_is_refused(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench", "--only", "relay", "--out", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout
    assert "no such part: relay" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was started or written
