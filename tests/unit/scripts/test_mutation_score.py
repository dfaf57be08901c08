"""scripts/mutation_score.py: the score of a mutmut run, and the doc table written from it.

The numbers in docs/mutation.md are the run's: the script sorts every mutant into killed
(a timeout too), argued equivalent (named in the doc), open (a survivor nobody argued) and
not checked, and rewrites only the block between its markers, never from a partial run.
Under the table a clean run records each mutated module's SHA-256, and the last test here
(so CI) fails when the modules are not the ones recorded: a module changed, or added to
the set, without its mutants run.
"""

from __future__ import annotations

import datetime
import hashlib
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


def _tree(root: Path, codes: dict[str, int | None], doc: str, script: ModuleType) -> None:
    """A checkout with one mutated module, app/m.py, and ``make mutate``'s run of it: the
    sources' snapshot at its start, then mutmut's result (``codes``)."""
    (root / "pyproject.toml").write_text('[tool.mutmut]\nonly_mutate = ["app/m.py"]\n')
    (root / "app").mkdir()
    (root / "app" / "m.py").write_text("def f():\n    return 1\n")
    script.snapshot(root)
    (root / "mutants" / "app").mkdir(parents=True)
    meta = {"exit_code_by_key": codes}
    (root / "mutants" / "app" / "m.py.meta").write_text(json.dumps(meta))
    (root / "docs").mkdir()
    (root / "docs" / "mutation.md").write_text(doc)


def _at(script: ModuleType, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "ROOT", root)
    monkeypatch.setattr(script, "DOC", root / "docs" / "mutation.md")


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
    _tree(tmp_path, {f"{M}1": 1, f"{M}2": 36, f"{M}3": 0}, _doc(script, [3]), script)
    _at(script, tmp_path, monkeypatch)
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
    _tree(tmp_path, {f"{M}1": 1, f"{M}2": None}, doc, script)
    _at(script, tmp_path, monkeypatch)
    assert script.main(["--write-doc"]) == 1
    assert (tmp_path / "docs" / "mutation.md").read_text() == doc  # left as it was
    meta = tmp_path / "mutants" / "app" / "m.py.meta"
    meta.write_text(json.dumps({"exit_code_by_key": {f"{M}1": 1, f"{M}2": 0}}))
    assert script.main([]) == 2
    assert (tmp_path / "docs" / "mutation.md").read_text() == doc  # only --write-doc writes


def test_a_run_over_an_earlier_runs_results_is_named_so(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, {f"{M}1": 1}, _doc(script, []), script)
    _at(script, tmp_path, monkeypatch)
    doc = tmp_path / "docs" / "mutation.md"
    assert script.main(["--write-doc"]) == 0  # make mutate's order: no mutants/ at the snapshot
    assert script.FRESH_RUN in doc.read_text() and script.KEPT_RUN not in doc.read_text()
    script.snapshot(tmp_path)  # now over the results above: mutmut keeps the unchanged ones'
    assert script.main(["--write-doc"]) == 0
    assert script.KEPT_RUN in doc.read_text() and script.FRESH_RUN not in doc.read_text()


def test_write_doc_records_the_modules_hashes_of_a_clean_run_only(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, {f"{M}1": 1, f"{M}2": 0}, _doc(script, []), script)
    _at(script, tmp_path, monkeypatch)
    doc = tmp_path / "docs" / "mutation.md"
    assert script.main(["--write-doc"]) == 2  # an open survivor: the table, no hashes
    assert script.NO_SOURCES in doc.read_text() and script.recorded_sources(doc.read_text()) == {}
    assert script.out_of_date(tmp_path, doc.read_text()) == [
        "docs/mutation.md records no clean run (none, or the last one left work)"
    ]
    assert script.main(["--check"]) == 1
    doc.write_text(doc.read_text() + f"- `{M}2`: argued.\n")
    assert script.main(["--write-doc"]) == 0
    digest = hashlib.sha256(b"def f():\n    return 1\n").hexdigest()
    assert f"- `app/m.py` sha256 `{digest}`\n{script.END}" in doc.read_text()
    assert script.out_of_date(tmp_path, doc.read_text()) == []
    assert script.main(["--check"]) == 0


def test_write_doc_refuses_a_run_whose_sources_are_unknown_or_changed_or_missing(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(script, [])
    _tree(tmp_path, {f"{M}1": 1}, doc, script)
    _at(script, tmp_path, monkeypatch)
    (tmp_path / "app" / "m.py").write_text("def f():\n    return 2\n")  # edited mid-run
    assert script.main(["--write-doc"]) == 1
    script.snapshot(tmp_path)
    (tmp_path / script.SNAPSHOT).unlink()  # a `mutmut run` of its own, not `make mutate`'s
    assert script.main(["--write-doc"]) == 1
    script.snapshot(tmp_path)
    config = '[tool.mutmut]\nonly_mutate = ["app/m.py", "app/n.py"]\n'
    (tmp_path / "pyproject.toml").write_text(config)
    (tmp_path / "app" / "n.py").write_text("")
    script.snapshot(tmp_path)
    assert script.main(["--write-doc"]) == 1  # no result for app/n.py
    assert (tmp_path / "docs" / "mutation.md").read_text() == doc


def test_check_names_each_module_changed_added_or_dropped_since_the_recorded_run(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _tree(tmp_path, {f"{M}1": 1}, _doc(script, []), script)
    _at(script, tmp_path, monkeypatch)
    assert script.main(["--write-doc"]) == 0
    text = (tmp_path / "docs" / "mutation.md").read_text()
    (tmp_path / "app" / "m.py").write_text("def f():\n    return 1  # a comment\n")
    config = '[tool.mutmut]\nonly_mutate = ["app/m.py", "app/n.py"]\n'
    (tmp_path / "pyproject.toml").write_text(config)
    (tmp_path / "app" / "n.py").write_text("")
    assert script.out_of_date(tmp_path, text) == [
        "app/n.py: in [tool.mutmut] only_mutate, not in the recorded run",
        "app/m.py: changed since the recorded run (its mutants were not run)",
    ]
    (tmp_path / "pyproject.toml").write_text("[tool.mutmut]\nonly_mutate = []\n")
    assert script.out_of_date(tmp_path, text) == [
        "app/m.py: in the recorded run, no longer in [tool.mutmut] only_mutate"
    ]
    capsys.readouterr()
    assert script.main(["--check"]) == 1
    assert "app/m.py" in capsys.readouterr().out and "make mutate" in script.REMEDY


def test_the_recorded_mutation_run_is_of_the_modules_as_they_are(script: ModuleType) -> None:
    """CI's check: a module of the mutation set that changed (or joined it) since the last
    clean `make mutate` fails here, until its mutants are run and the doc rewritten."""
    problems = script.out_of_date(ROOT, (ROOT / "docs" / "mutation.md").read_text("utf-8"))
    assert not problems, "\n".join(["The mutation run is out of date:", *problems, script.REMEDY])
