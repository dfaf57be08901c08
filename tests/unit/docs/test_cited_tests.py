"""The docs (and bench/HISTORY.md, the benchmarks' notebook that was docs/performance.md) cite
tests as evidence, so each test they cite must be there: a path under tests/ names a file
that exists (and a ``::name`` after it a test defined in that file), and a bare test file
name (``test_sse.py``) names a file somewhere under tests/. A test moved or renamed without
its citations fails here, not in a reader's hands."""

from __future__ import annotations

import re

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "HISTORY.md"]
# A path, written plainly or as a link (../tests/...), with an optional ::test_name after it.
CITED_PATH = re.compile(r"\btests/[\w./-]+?\.py(?:::(\w+))?\b")
# A file name alone; a glob such as test_schema*.py is a pattern, not a citation.
CITED_NAME = re.compile(r"(?<![\w/*])(test_\w+\.py)(?!\w)")


def _citations(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    return [
        (f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, found.start()) + 1}", found)
        for page in PAGES
        for text in [page.read_text("utf-8")]
        for found in pattern.finditer(text)
    ]


def test_every_cited_test_path_exists() -> None:
    cited = _citations(CITED_PATH)
    assert len(cited) > 50  # the pattern still finds the docs' citations
    missing = []
    for where, found in cited:
        path = ROOT / found.group(0).split("::")[0]
        name = found.group(1)
        if not path.is_file():
            missing.append(f"{where}: {found.group(0)}")
        elif name and not re.search(rf"^(?:async )?def {name}\b", path.read_text(), re.M):
            missing.append(f"{where}: {found.group(0)} (no such test in the file)")
    assert not missing, "cited but not there:\n" + "\n".join(missing)


def test_every_cited_test_file_name_is_a_file_under_tests() -> None:
    names = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    cited = _citations(CITED_NAME)
    assert cited  # the pattern still finds the docs' bare names
    missing = [f"{where}: {m.group(1)}" for where, m in cited if m.group(1) not in names]
    assert not missing, "cited but no such file under tests/:\n" + "\n".join(missing)


def test_a_citation_of_a_moved_test_is_caught() -> None:
    """The path pattern takes a link's path and a test name after it, not the text around."""
    text = "see [it](../tests/unit/wire/test_sse.py) and tests/unit/gone.py::test_x, as test_a.py"
    paths = [m.group(0) for m in CITED_PATH.finditer(text)]
    assert paths == ["tests/unit/wire/test_sse.py", "tests/unit/gone.py::test_x"]
    assert [m.group(1) for m in CITED_NAME.finditer(text + " test_schema*.py")] == ["test_a.py"]
