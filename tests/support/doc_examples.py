"""The docs' fenced code blocks, and whether each is an example to run.

A block a reader is meant to run against a running gateway says so on a line of its own
before its opening fence (blank lines between are allowed), as an HTML comment that does not
render: ``<!-- example: run -->``. A block a reader does not run that way says why:
``<!-- example: not run: needs a provider's key -->``. Every block in a language a reader
runs (sh, bash, python) in EXAMPLE_DOCS carries one of the two, so a test never guesses
which blocks are examples and never skips one quietly; a block without a language (a
diagram, a tree, a usage synopsis) is never run. No I/O here: text in, blocks out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The docs whose runnable blocks are all marked and whose `run` examples a test runs.
EXAMPLE_DOCS = ("README.md", "docs/client.md")
RUNNABLE = frozenset({"sh", "bash", "shell", "console", "python", "py"})
SHELL = frozenset({"sh", "bash", "shell", "console"})

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
_MARK = re.compile(r"^\s*<!--\s*example:\s*(.*?)\s*-->\s*$")
_VALID_MARK = re.compile(r"run|not run: \S.*")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # the opening fence's, from 1
    lang: str  # "" for a fence without a language
    text: str
    mark: str | None  # "run", "not run: <why>", or None

    @property
    def runs(self) -> bool:
        return self.mark == "run"

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Parsed:
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def parse(text: str, doc: str) -> Parsed:
    """The fenced blocks of ``text`` with their marks, and every mark that breaks the rules."""
    out = Parsed()
    lines = text.splitlines()
    mark: tuple[int, str] | None = None  # a mark waiting for its block: (line, text)
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        found = _MARK.match(lines[i])
        if fence:
            end = _closing(lines, i, fence.group(1))
            body = "\n".join(lines[i + 1 : end]) + "\n"
            block = Block(doc, i + 1, fence.group(2).lower(), body, mark and mark[1])
            out.blocks.append(block)
            out.problems.extend(_check(block))
            mark, i = None, end + 1
            continue
        if mark and (found or lines[i].strip()):
            out.problems.append(f"{doc}:{mark[0]}: the mark is not followed by a code block")
            mark = None
        if found:
            mark = (i + 1, found.group(1))
        i += 1
    if mark:
        out.problems.append(f"{doc}:{mark[0]}: the mark is not followed by a code block")
    return out


def _closing(lines: list[str], start: int, fence: str) -> int:
    """The index of the line closing the block opened at ``start`` (CommonMark: the same
    character, at least as many; an unclosed block runs to the end)."""
    for j in range(start + 1, len(lines)):
        stripped = lines[j].strip()
        if stripped.startswith(fence) and set(stripped) == {fence[0]}:
            return j
    return len(lines)


def _check(block: Block) -> list[str]:
    if block.mark is None:
        if block.lang in RUNNABLE:
            return [f"{block.where}: a {block.lang} block without <!-- example: ... -->"]
        return []
    if not _VALID_MARK.fullmatch(block.mark):
        return [f"{block.where}: mark {block.mark!r}: `run` or `not run: <why>`"]
    if block.runs and block.lang not in RUNNABLE:
        return [f"{block.where}: marked run, but {block.lang or 'no language'} is not run"]
    return []
