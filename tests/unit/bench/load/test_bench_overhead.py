"""The overhead section's CPU targets are issue 25's: each gateway's CPU per call over the
floor's at the highest load, both measured in the same run; gateway+keys has its rows.

Fabricated runs, no process: each path's CPU is chosen so that a ratio taken against any
other path, or at another load, gives another number than the floor's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.kit import loadgen
from bench.kit.report import Config
from bench.load import overhead_table
from bench.load.overhead_runs import Measured, merge

# CPU ms per call at 200 callers; at 1 caller the floor's is ten times larger, the others'
# twelve times (so a ratio taken at 1 caller is not the one at 200).
CPU = {"nginx-only": 1.0, "floor": 4.0, "gateway": 4.2, "gateway+keys": 5.6}
NON_STREAM = {"nginx-only": 0.3, "floor": 1.0, "gateway": 1.2, "gateway+keys": 1.2}


def measured(kind: str, callers: int, path: str) -> Measured:
    base = (CPU if kind == "stream" else NON_STREAM).get(path)
    alone = 10 if path == "floor" else 12
    cpu = None if base is None else base * (alone if callers == 1 else 1)
    samples = [0.2 + i / 10_000 for i in range(100)]
    result = loadgen.Result(samples, [s + 0.5 for s in samples], [], 10.0, 0.5)
    upstream = None if path == "direct" else 0.0
    memcached = 0.3 if path == "gateway+keys" else None
    return Measured(path, kind, callers, result, cpu, upstream, 0.01, upstream, memcached)


def runs() -> list[Measured]:
    return [
        measured(kind, callers, path)
        for kind in overhead_table.KINDS
        for callers in (1, 200)
        for path in overhead_table.PATHS
    ]


def by(out: list[Measured]) -> dict[tuple[str, int, str], Measured]:
    return {(m.kind, m.callers, m.path): m for m in out}


def test_the_cpu_checks_are_each_gateways_cpu_over_the_floors_at_the_highest_load() -> None:
    checks = {c.what: c for c in overhead_table.checks(by(runs()))}
    cpu = {what: c for what, c in checks.items() if "CPU" in what}
    assert sorted(cpu) == [
        "gateway CPU per non-stream request over the floor's (200 callers)",
        "gateway CPU per streamed request over the floor's (200 callers)",
        "gateway+keys CPU per non-stream request over the floor's (200 callers)",
        "gateway+keys CPU per streamed request over the floor's (200 callers)",
    ]
    assert all(c.unit == "x floor" and c.op == "<=" for c in cpu.values())
    stream = cpu["gateway CPU per streamed request over the floor's (200 callers)"]
    assert (stream.target, stream.measured, stream.met) == (1.10, pytest.approx(1.05), True)
    plain = cpu["gateway CPU per non-stream request over the floor's (200 callers)"]
    assert (plain.measured, plain.met) == (pytest.approx(1.2), False)
    keyed = cpu["gateway+keys CPU per streamed request over the floor's (200 callers)"]
    assert (keyed.target, keyed.measured, keyed.met) == (1.25, pytest.approx(1.4), False)
    keyed = cpu["gateway+keys CPU per non-stream request over the floor's (200 callers)"]
    assert (keyed.measured, keyed.met) == (pytest.approx(1.2), True)
    # The absolute targets are gone; issue 11's others stay.
    assert not [c for c in checks.values() if c.unit == "ms" and "CPU" in c.what]
    assert checks["non-stream, 200 callers: req/s"].target == 1500


def test_the_table_has_gateway_keys_rows_with_their_ratio_and_memcacheds_cpu(
    tmp_path: Path,
) -> None:
    section = overhead_table.section(
        Config(out_dir=tmp_path), runs(), {"idle_cpu_share": {"gateway+keys memcached": 0.001}}
    )
    ratio = section.columns.index("CPU x floor")
    memcached = section.columns.index("Memcached CPU ms/req")
    rows = {(r[0], r[1], r[2]): r for r in section.rows}
    keyed = rows[("stream", 200, "gateway+keys")]
    assert keyed[ratio] == pytest.approx(1.4) and keyed[memcached] == 0.3
    assert rows[("stream", 1, "gateway")][ratio] == pytest.approx(1.26)  # 50.4 / 40
    assert rows[("non-stream", 200, "floor")][ratio] == pytest.approx(1.0)
    assert rows[("non-stream", 200, "direct")][ratio] is None
    assert rows[("non-stream", 200, "gateway")][memcached] is None
    # The floor's own CPU per call stays in the notes, beside the gateways'.
    note = next(n for n in section.notes if n.startswith("floor:"))
    assert "stream: floor 4.00 ms, gateway 4.20 ms (1.05x" in note
    assert "gateway+keys 1.20 ms (1.20x, target ≤ 1.25x)" in note
    assert all((tmp_path / p.file).is_file() for p in section.plots)


def test_the_note_gives_each_halfs_ratio_to_the_floors_same_half(tmp_path: Path) -> None:
    """A run's two halves (A B C, then C B A) each give a ratio: the spread within one run,
    which a ratio of the merged means hides."""
    out = []
    for m in runs():
        if m.callers == 200 and m.kind == "stream" and m.path in ("floor", "gateway"):
            # The floor 3.0 then 5.0 ms; the gateway 3.6 then 5.5: 1.20x and 1.10x.
            halves = (3.0, 5.0) if m.path == "floor" else (3.6, 5.5)
            m = dataclasses.replace(m, halves_cpu_ms=halves)
        out.append(m)
    section = overhead_table.section(Config(out_dir=tmp_path), out, {"idle_cpu_share": {}})
    note = next(n for n in section.notes if n.startswith("floor:"))
    assert "gateway 4.20 ms (1.05x, target ≤ 1.10x; halves 1.20x and 1.10x)" in note
    assert "gateway+keys 5.60 ms (1.40x, target ≤ 1.25x)" in note  # no halves: none said
    first, second = measured("stream", 200, "gateway"), measured("stream", 200, "floor")
    assert merge(first, second).halves_cpu_ms == (4.2, 4.0)  # merge keeps both, in order
