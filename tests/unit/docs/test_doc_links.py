"""The docs link to each other's sections by anchor (README.md to docs/performance.md, the
docs to bench/HISTORY.md's runs and cuts), so every relative link must land: on a file of
the repository, and with an anchor into a markdown page, on one of that page's headings. A
section moved or renamed without its links fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "HISTORY.md"]
# [text](target): a target without a scheme (http:, mailto:) is a path in the repository.
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$")


def anchors(page: str) -> set[str]:
    """The anchors of a page's headings as GitHub makes them: lower case, punctuation but
    hyphens dropped, spaces as hyphens, a repeated one numbered (-1, -2). Not in code."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
    return found


def broken(page: Path) -> list[str]:
    """The page's relative links that land on no file, or on no heading of the page named."""
    text = page.read_text("utf-8")
    out = []
    for found in LINK.finditer(text):
        target = found.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        landing = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, found.start()) + 1}"
        if not landing.exists():
            out.append(f"{where}: no such file: {target}")
        elif anchor and landing.suffix == ".md" and anchor not in anchors(landing.read_text()):
            out.append(f"{where}: no such heading: {target}")
    return out


def test_every_relative_link_lands_on_a_file_and_a_heading() -> None:
    links = sum(len(LINK.findall(page.read_text("utf-8"))) for page in PAGES)
    assert links > 300  # the pattern still finds the docs' links
    found = [problem for page in PAGES for problem in broken(page)]
    assert not found, "links that land nowhere:\n" + "\n".join(found)


def test_anchors_are_githubs() -> None:
    page = "# A page\n## HTTP/2\n## The floor's cost, cut\n```\n## not a heading\n```\n## HTTP/2\n"
    assert anchors(page) == {"a-page", "http2", "the-floors-cost-cut", "http2-1"}
