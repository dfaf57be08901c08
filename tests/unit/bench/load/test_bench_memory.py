"""The memory section's target is issue 25's: the gateway's workers' KB per held stream less
the floor's, both read in the same run (fabricated readings here, no process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kit.report import Config
from bench.load import memory
from bench.load.memory import Held


def held(per_stream_kb: int, first_kb: int) -> Held:
    """1,000 idle KB in the workers; 100 then 1,000 streams open. ``first_kb`` per stream at
    the first step, ``per_stream_kb`` at the last (the marginal figure differs from both)."""
    points = [
        (100, 100, 0, 1000 + 100 * first_kb, 5000),
        (1000, 1000, 0, 1000 + 1000 * per_stream_kb, 6000),
    ]
    return Held(1000, 4000, points, 70.0, 2, {"worker_connections": 15000})


def test_the_target_is_the_gateways_kb_per_stream_less_the_floors() -> None:
    gateway, floor = held(58, 100), held(50, 40)
    assert gateway.per_stream == 58 and floor.per_stream == 50
    (check,) = memory.checks(gateway, floor)
    assert (check.what, check.op, check.target, check.unit) == (
        "worker memory per open stream over the floor's (1000 streams)",
        "<=",
        10,
        "KB over the floor",
    )
    assert check.measured == pytest.approx(8) and check.met
    (check,) = memory.checks(held(61, 100), floor)
    assert check.measured == pytest.approx(11) and not check.met


def test_the_section_has_both_sides_rows_and_keeps_their_own_figures(tmp_path: Path) -> None:
    section = memory.section(Config(out_dir=tmp_path), held(58, 100), held(50, 40))
    assert [(r[0], r[1]) for r in section.rows] == [
        ("gateway", 100),
        ("gateway", 1000),
        ("floor", 100),
        ("floor", 1000),
    ]
    per_stream = section.columns.index("workers KB/stream")
    assert [r[per_stream] for r in section.rows] == [100, 58, 40, 50]
    assert section.data["floor"]["workers_kb_per_stream"] == 50
    assert any(n.startswith("floor: ") and "50.0 KB per stream" in n for n in section.notes)
    assert (tmp_path / section.plots[0].file).is_file()
