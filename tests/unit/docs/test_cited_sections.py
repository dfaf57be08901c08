"""The code cites the docs by page and section (``docs/performance.md, "The floor"``) where a
reader goes for the measurement or the reasoning behind a choice, so each cited section must
be on that page: a heading that begins with the quoted words, or a paragraph led by them in
bold (``**On by kind.**``). A section moved (docs/performance.md's run detail went to
bench/HISTORY.md) or renamed without its citations fails here, not in a reader's hands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT

# A page, a comma or not, then a quoted title that starts with a letter (not code: a path in
# a string literal is followed by other quotes). Line breaks and comment marks are taken out
# first, as a citation often wraps.
CITED_SECTION = re.compile(
    r"\b((?:docs/[\w/-]+|bench/HISTORY)\.md),?\s+\"([A-Za-z][^\"(){}=]{1,80})\""
)
WRAP = re.compile(r"\s*\n\s*(?:#\s*)?")


def _code_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed]


def _sections(page: Path) -> list[str]:
    lines = page.read_text("utf-8").splitlines()
    heads = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    leads = [found[1] for line in lines if (found := re.match(r"\*\*(.+?)\*\*", line))]
    return heads + leads


def _cited(title: str, sections: list[str]) -> bool:
    title = title.rstrip(".")
    return any(section.startswith(title) for section in sections)


def test_every_cited_section_is_on_its_page() -> None:
    found, missing = 0, []
    pages: dict[str, list[str] | None] = {}
    for path in _code_files():
        flat = WRAP.sub(" ", path.read_text("utf-8"))
        for cited in CITED_SECTION.finditer(flat):
            page, title = cited[1], cited[2].strip()
            if page not in pages:
                pages[page] = _sections(ROOT / page) if (ROOT / page).is_file() else None
            found += 1
            sections = pages[page]
            if sections is None or not _cited(title, sections):
                missing.append(f"{path.relative_to(ROOT)}: {page}, {title!r}")
    assert found > 10  # the pattern still finds the code's citations
    assert not missing, "cited but not on the page:\n" + "\n".join(missing)


def test_a_section_is_found_by_heading_or_bold_lead_only() -> None:
    sections = ["The floor, and where the gateway's own time goes", "On by kind."]
    assert _cited("The floor", sections)
    assert _cited("On by kind", sections)
    assert not _cited("Comparable numbers", sections)
