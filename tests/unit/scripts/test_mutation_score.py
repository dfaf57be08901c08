"""scripts/mutation_score.py: the score of a mutmut run, and the doc table written from it.

The numbers in docs/mutation.md are the run's: the script sorts every mutant into killed
(a timeout too), argued equivalent (named in the doc), open (a survivor nobody argued) and
not checked, and rewrites only the block between its markers, never from a partial run.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "mutation_score.py"
M = "app.m.x_f__mutmut_"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_score", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, codes: dict[str, int | None], doc: str) -> None:
    (root / "pyproject.toml").write_text('[tool.mutmut]\nonly_mutate = ["app/m.py"]\n')
    (root / "mutants" / "app").mkdir(parents=True)
    meta = {"exit_code_by_key": codes}
    (root / "mutants" / "app" / "m.py.meta").write_text(json.dumps(meta))
    (root / "docs").mkdir()
    (root / "docs" / "mutation.md").write_text(doc)


def _doc(script: ModuleType, argued: list[int]) -> str:
    names = "".join(f"- `{M}{n}`: same codec.\n" for n in argued)
    return f"# Mutation\n\n{script.BEGIN}\nold table\n{script.END}\n\n## Equivalent\n\n{names}"


def test_every_mutant_is_sorted_by_what_the_run_and_the_doc_say(script: ModuleType) -> None:
    codes = {f"{M}1": 1, f"{M}2": -24, f"{M}3": 0, f"{M}4": 0, f"{M}5": 33, f"{M}6": None}
    result = script.tally({"app/m.py": codes}, {f"{M}1", f"{M}3", f"{M}9"})
    m = result.scores["m.py"]
    assert (m.mutants, m.killed, m.equivalent, m.open, m.unchecked) == (6, 2, 1, 2, 1)
    assert result.open_survivors == [f"{M}4 (survived)", f"{M}5 (exit code 33)"]
    assert (result.stale, result.unknown, result.unchecked) == ([f"{M}1"], [f"{M}9"], [f"{M}6"])
    assert result.work_left


def test_the_doc_table_is_rewritten_between_its_markers_only(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, {f"{M}1": 1, f"{M}2": 36, f"{M}3": 0}, _doc(script, [3]))
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "DOC", tmp_path / "docs" / "mutation.md")
    assert script.main(["--write-doc"]) == 0  # every survivor argued: nothing left to do
    text = (tmp_path / "docs" / "mutation.md").read_text()
    assert text.startswith(f"# Mutation\n\n{script.BEGIN}\nRun of {datetime.date.today()}")
    assert "| m.py | 3 | 2 | 1 | 0 | 66.7 % | 100.0 % (2/2) |" in text
    assert "| all | 3 | 2 | 1 | 0 | 66.7 % | 100.0 % (2/2) |" in text
    assert "old table" not in text
    assert (text.count(script.BEGIN), text.count(script.END)) == (1, 1)
    assert text.endswith(f"{script.END}\n\n## Equivalent\n\n- `{M}3`: same codec.\n")


def test_a_partial_run_or_an_open_survivor_is_not_a_clean_score(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(script, [])
    _tree(tmp_path, {f"{M}1": 1, f"{M}2": None}, doc)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "DOC", tmp_path / "docs" / "mutation.md")
    assert script.main(["--write-doc"]) == 1
    assert (tmp_path / "docs" / "mutation.md").read_text() == doc  # left as it was
    meta = tmp_path / "mutants" / "app" / "m.py.meta"
    meta.write_text(json.dumps({"exit_code_by_key": {f"{M}1": 1, f"{M}2": 0}}))
    assert script.main([]) == 2
    assert (tmp_path / "docs" / "mutation.md").read_text() == doc  # only --write-doc writes
