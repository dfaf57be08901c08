"""docs/simulator.md names every control, fault, script and route the simulator has
(simulator/behaviour.py, scripts.py, dialects.py), so a new one cannot go undocumented, and
its table of scripts says what each script holds."""

from __future__ import annotations

import re

from simulator import behaviour, dialects, scripts
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "simulator.md").read_text("utf-8")


def test_every_control_fault_and_route_is_named() -> None:
    named = set(re.findall(r"`([^`]+)`", DOC))
    words = {w for n in named for w in re.split(r"[\s,=]+", n)}
    assert [c for c in behaviour.CONTROLS if c not in words] == []
    assert sorted(f for f in behaviour.FAULTS if f not in words) == []
    assert [n for n in scripts.NAMES if f"`{n}`" not in DOC] == []
    routes = [dialects.MESSAGES, dialects.COUNT_TOKENS, *dialects.GEMINI_METHODS]
    assert [r for r in routes if r not in DOC] == []


def test_the_script_table_matches_the_scripts() -> None:
    rows = {
        m[1]: m[2]
        for m in re.finditer(r"^\| `(\w+)` \|(.*)\|$", DOC, re.M)
        if m[1] in scripts.SCRIPTS
    }
    assert set(rows) == set(scripts.NAMES)
    for name, script in scripts.SCRIPTS.items():
        u = script.usage
        counts = f"{u.input}, {u.output}, {u.cache_read}, {u.cache_creation}, {u.thinking}"
        assert rows[name].rstrip().endswith(counts), name
        for block in script.of_kind("text"):
            assert ", ".join(f"`{p}`" for p in block.pieces) in rows[name], name
        for block in script.of_kind("tool"):
            assert f"`{block.id}` `{block.name}`" in rows[name]
            assert f"{len(block.pieces)} of them" in rows[name]
