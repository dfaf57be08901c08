"""bench/cpu/ab.py's summary (each side's mean with its runs, and B over A; bench/floor/turns.py's
on top) and its export of a revision's tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.cpu.ab import BENCH, Run, export, summarize
from bench.floor import turns as floor


def test_the_summary_gives_each_sides_runs_mean_and_the_ratio() -> None:
    runs = [
        Run("A", "stream", 10.0, 70.0, 0, 0.25),
        Run("B", "stream", 9.0, 70.0, 0),
        Run("A", "stream", 12.0, 69.0, 1, 0.031),
        Run("B", "stream", 9.0, 71.0, 0),
        Run("A", "non-stream", 2.0, 600.0, 0),
        Run("B", "non-stream", 2.2, 610.0, 0),
    ]
    lines = summarize(runs, "A", "B")
    assert lines[0].split()[:3] == ["stream", "A", "11.00"] and "[10.00, 12.00]" in lines[0]
    assert "errors 1" in lines[0] and "errors 0" in lines[1]
    # How much of the cores other processes used during each run: the noise beside it.
    assert lines[0].endswith("others [25, 3] % of the cores")
    assert lines[2].endswith("B / A: 0.818 (-18.2 %)")
    assert lines[5].endswith("B / A: 1.100 (+10.0 %)")


def test_the_floor_summary_gives_the_gateways_own_work_and_its_ratio_to_the_floor() -> None:
    runs = [
        Run("gateway", "stream", 6.0, 200.0, 0),
        Run("floor", "stream", 4.0, 200.0, 0),
        Run("gateway", "stream", 6.4, 200.0, 0),
        Run("floor", "stream", 4.0, 200.0, 0),
    ]
    lines = floor.summarize(runs)
    assert lines[2].endswith("floor / gateway: 0.645 (-35.5 %)")
    # 6.2 - 4.0 = 2.2 ms of the gateway's own (35 % of 6.2); 6.2 / 4.0 = 1.55x the floor's.
    assert lines[3] == (
        "stream     the gateway's own work: 2.20 ms/call (35 % of its CPU); "
        "gateway 1.55x the floor, target ≤ 1.10x"
    )


def test_an_export_is_the_revisions_tree_measured_by_this_trees_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revision of another bench/ layout (here, one flat module) is measured by this tree's
    bench/, whole, while the rest of the tree is the revision's."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "ab.py").write_text("# the revision's own, flat\n")
    (repo / "app").mkdir()
    (repo / "app" / "gateway.py").write_text("# the revision's app\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for argv in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "old layout"]):
        subprocess.run([*git, *argv], check=True)
    monkeypatch.chdir(repo)
    tree = export("HEAD", tmp_path / "export")
    assert (tree / "app" / "gateway.py").read_text() == "# the revision's app\n"
    ours = {p.relative_to(BENCH) for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts}
    theirs = {p.relative_to(tree / "bench") for p in (tree / "bench").rglob("*.py")}
    assert theirs == ours and Path("cpu", "ab.py") in theirs
    assert (tree / "bench" / "ab.py").read_text() == (BENCH / "ab.py").read_text()
    assert not (tree / "bench" / "results").exists()
