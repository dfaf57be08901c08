"""Per-module mutation score of the last `mutmut run` (the end of `make mutate`).

Reads mutmut's result files (mutants/<module>.meta) for every module listed in
[tool.mutmut] only_mutate of pyproject.toml, and the survivors argued equivalent in
docs/mutation.md (list items that start with a mutant name in backticks). Prints, per module:
mutants, killed (a timeout counts as killed: the tests noticed), survived, equivalent, and
the two scores, killed / total and killed / non-equivalent; then the work left: every
survivor that is not argued equivalent, every argued name that is killed now or names no
mutant at all (renumbered after an edit), and every mutant the run did not check.

With --write-doc, the "Result" table of docs/mutation.md (between the two marker comments)
is rewritten from the run: the table is the run's, never typed by hand. A partial run
(mutants not checked, as after `mutmut run 'llmgate_wire.sse*'` on a fresh mutants/, or a
module with no result at all) is refused, and so is a run whose sources were not snapshot at
its start (--snapshot, which `make mutate` runs after emptying mutants/) or changed since.
Under the table it records the SHA-256 of each module the run mutated, only when the run
left nothing to do: that record is what --check, and the unit test of CI that calls it,
hold the modules to.

--check (no mutmut result needed): whether docs/mutation.md records a clean run of the
modules as they are now: every module of only_mutate recorded, none other, each with the
hash of its current contents. Exit status 1, naming each module and what to do, when not.

Exit status: 0 when nothing is left to do; 2 when work is left (listed); 1 when there is no
result to read, or --write-doc meets a partial run or a doc without the markers, or --check
finds the record out of date. Stdlib only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import platform
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mutation.md"
SNAPSHOT = Path("mutants") / "sources.json"  # under the root: the sources at the run's start
# Beside it when the run started on an earlier run's results (mutants/ kept): mutmut then
# runs again only the mutants of the functions whose source changed, keeping the others'.
KEPT = Path("mutants") / "kept-results"
FRESH_RUN = "`make mutate` (a fresh `mutmut run` of every mutant)"
KEPT_RUN = (
    "`mutmut run` over an earlier full run's results (mutmut ran again every mutant of a "
    "function whose source changed since, and kept the others')"
)
KILLED = {1, 3, 24, -24, 152, 255, 36}  # mutmut: killed, pytest internal error, timeouts
SURVIVED = {0}
BEGIN = "<!-- mutation-score:begin (scripts/mutation_score.py --write-doc) -->"
END = "<!-- mutation-score:end -->"
_EQUIVALENT = re.compile(r"^\s*[-*]\s+`((?:app|llmgate_wire)\.[\w.ǁ]+__mutmut_\d+)`", re.MULTILINE)
_SOURCE = re.compile(r"^- `([\w/.]+\.py)` sha256 `([0-9a-f]{64})`$", re.MULTILINE)
SOURCES_HEAD = "The modules as this run mutated them (SHA-256 of each file, checked by `--check`):"
NO_SOURCES = (
    "No modules recorded: this run left work (the script's lists), so `--check` fails until "
    "a run leaves none."
)
REMEDY = (
    "Run `make mutate` (MUTATE_CHILDREN=2 make mutate: 15 minutes or more on 2 cores), kill or "
    "argue in docs/mutation.md every survivor it lists until it exits 0, and commit the "
    "docs/mutation.md it rewrites (the Result table and the modules' SHA-256 under it)."
)


def equivalent_names(doc_text: str) -> set[str]:
    return set(_EQUIVALENT.findall(doc_text))


def mutated_modules(root: Path) -> list[str]:
    """The modules mutmut mutates: [tool.mutmut] only_mutate of pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["tool"]["mutmut"]
    return list(config["only_mutate"])


def source_hashes(root: Path, paths: list[str]) -> dict[str, str]:
    """The SHA-256 of each file's bytes, by its path under ``root``."""
    return {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in paths}


def recorded_sources(doc_text: str) -> dict[str, str]:
    """The modules and hashes the last clean run recorded in the doc's Result block."""
    begin, end = doc_text.find(BEGIN), doc_text.find(END)
    return dict(_SOURCE.findall(doc_text[begin:end])) if 0 <= begin < end else {}


def out_of_date(root: Path, doc_text: str) -> list[str]:
    """What makes the doc's record not a clean run of the modules as they are (empty: none).
    Each line names a module, or says that no clean run is recorded at all."""
    recorded = recorded_sources(doc_text)
    if not recorded:
        return ["docs/mutation.md records no clean run (none, or the last one left work)"]
    modules = mutated_modules(root)
    problems = [
        f"{path}: in [tool.mutmut] only_mutate, not in the recorded run"
        for path in modules
        if path not in recorded
    ]
    problems += [
        f"{path}: in the recorded run, no longer in [tool.mutmut] only_mutate"
        for path in recorded
        if path not in modules
    ]
    for path, digest in source_hashes(root, [p for p in modules if p in recorded]).items():
        if digest != recorded[path]:
            problems.append(f"{path}: changed since the recorded run (its mutants were not run)")
    return problems


def module_results(root: Path) -> dict[str, dict[str, int | None]]:
    """Exit code by mutant name, per mutated module (None: not checked by the run)."""
    results: dict[str, dict[str, int | None]] = {}
    for path in mutated_modules(root):
        meta = root / "mutants" / (path + ".meta")
        if meta.exists():
            results[path] = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return results


@dataclass
class Score:
    """One module's counts, or all of them."""

    mutants: int = 0
    killed: int = 0
    equivalent: int = 0
    open: int = 0  # survivors not argued equivalent
    unchecked: int = 0

    def add(self, other: Score) -> None:
        for name in ("mutants", "killed", "equivalent", "open", "unchecked"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Tally:
    scores: dict[str, Score] = field(default_factory=dict)  # module (and "all") -> counts
    open_survivors: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # argued equivalent, killed now
    unknown: list[str] = field(default_factory=list)  # argued equivalent, no such mutant

    @property
    def work_left(self) -> bool:
        return bool(self.open_survivors or self.unchecked or self.stale or self.unknown)


def tally(results: dict[str, dict[str, int | None]], equivalent: set[str]) -> Tally:
    out = Tally()
    total = Score()
    for path, codes in results.items():
        score = Score(mutants=len(codes))
        for name, code in sorted(codes.items()):
            if code in KILLED:
                score.killed += 1
                if name in equivalent:
                    out.stale.append(name)
            elif code is None:
                score.unchecked += 1
                out.unchecked.append(name)
            elif name in equivalent:
                score.equivalent += 1
            else:
                score.open += 1
                status = "survived" if code in SURVIVED else f"exit code {code}"
                out.open_survivors.append(f"{name} ({status})")
        out.scores[path.removeprefix("app/")] = score
        total.add(score)
    out.scores["all"] = total
    known = {name for codes in results.values() for name in codes}
    out.unknown = sorted(equivalent - known)
    return out


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "-"


def report(result: Tally) -> list[str]:
    lines = [
        f"{'module':<22}{'mutants':>8}{'killed':>8}{'equiv.':>7}{'open':>6}{'unchecked':>10}"
        f"{'killed/total':>14}{'killed/non-eq.':>16}"
    ]
    for name, s in result.scores.items():
        lines.append(
            f"{name:<22}{s.mutants:>8}{s.killed:>8}{s.equivalent:>7}{s.open:>6}"
            f"{s.unchecked:>10}{_pct(s.killed, s.mutants):>14}"
            f"{_pct(s.killed, s.mutants - s.equivalent - s.unchecked):>16}"
        )
    for title, names in (
        ("Survivors not argued equivalent in docs/mutation.md", result.open_survivors),
        ("Listed as equivalent but killed now (remove from docs/mutation.md)", result.stale),
        ("Listed as equivalent but no such mutant (renumbered? argue again)", result.unknown),
        ("Not checked by this run (a partial run)", result.unchecked),
    ):
        if names:
            lines += ["", f"{title} ({len(names)}):", *(f"  {name}" for name in names)]
    return lines


def doc_block(
    result: Tally, day: datetime.date, sources: dict[str, str], fresh: bool = True
) -> list[str]:
    """The markdown between the markers: when and with what (``fresh``: every mutant run, or
    only those of changed functions over an earlier run's results), the table, then the
    modules' hashes (``sources``) when the run left nothing to do."""
    try:
        mutmut = importlib.metadata.version("mutmut")
    except importlib.metadata.PackageNotFoundError:
        mutmut = "(version unknown)"
    lines = [
        BEGIN,
        f"Run of {day.isoformat()}: {FRESH_RUN if fresh else KEPT_RUN},",
        f"mutmut {mutmut}, Python {platform.python_version()}; table written by "
        "`scripts/mutation_score.py --write-doc`.",
        "",
        "| module | mutants | killed | equivalent | not argued | killed / total "
        "| killed / non-equivalent |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result.scores.items():
        non_eq = s.mutants - s.equivalent
        lines.append(
            f"| {name} | {s.mutants} | {s.killed} | {s.equivalent} | {s.open} "
            f"| {_pct(s.killed, s.mutants)} | {_pct(s.killed, non_eq)} ({s.killed}/{non_eq}) |"
        )
    lines.append("")
    if result.work_left:
        lines.append(NO_SOURCES)
    else:
        lines += [SOURCES_HEAD, ""]
        lines += [f"- `{path}` sha256 `{digest}`" for path, digest in sources.items()]
    return [*lines, END]


def with_block(doc_text: str, block: list[str]) -> str:
    """``doc_text`` with the lines from BEGIN to END replaced by ``block``."""
    begin, end = doc_text.find(BEGIN), doc_text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"docs/mutation.md has no {BEGIN} ... {END} block")
    return doc_text[:begin] + "\n".join(block) + doc_text[end + len(END) :]


def snapshot(root: Path) -> None:
    """The modules' hashes at the start of a run, for --write-doc to record (and to check
    that none changed while the run went on)."""
    path = root / SNAPSHOT
    kept = any((root / "mutants").rglob("*.meta"))  # results of an earlier run are there
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(source_hashes(root, mutated_modules(root)), indent=1), "utf-8")
    (root / KEPT).unlink(missing_ok=True)
    if kept:
        (root / KEPT).write_text("mutmut keeps the unchanged functions' results\n", "utf-8")


def _refusal(root: Path, results: dict[str, dict[str, int | None]], result: Tally) -> str | None:
    """Why --write-doc must not write this run, or None."""
    modules = mutated_modules(root)
    missing = [path for path in modules if path not in results]
    if result.unchecked or missing:
        return "A partial run" + (f" (no result for {', '.join(missing)})" if missing else "")
    try:
        started = json.loads((root / SNAPSHOT).read_text("utf-8"))
    except FileNotFoundError:
        return f"No {SNAPSHOT} (the sources at the run's start): not a `make mutate` run"
    changed = [p for p, h in source_hashes(root, modules).items() if started.get(p) != h]
    if changed or set(started) != set(modules):
        return f"The sources changed since the run started ({', '.join(changed) or 'the list'})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-doc", action="store_true", help="rewrite the Result table")
    parser.add_argument(
        "--snapshot", action="store_true", help="record the sources at a run's start"
    )
    parser.add_argument(
        "--check", action="store_true", help="is the doc's run of the modules as they are?"
    )
    args = parser.parse_args(argv)
    doc_text = DOC.read_text("utf-8") if DOC.exists() else ""
    if args.snapshot:
        snapshot(ROOT)
        return 0
    if args.check:
        problems = out_of_date(ROOT, doc_text)
        if problems:
            print("\n".join(["The mutation run is out of date:", *problems, REMEDY]))
            return 1
        print("docs/mutation.md records a clean run of the modules as they are.")
        return 0
    results = module_results(ROOT)
    if not results:
        print("No mutmut results in mutants/: run `make mutate` first.", file=sys.stderr)
        return 1
    result = tally(results, equivalent_names(doc_text))
    print("\n".join(report(result)))
    if args.write_doc:
        refusal = _refusal(ROOT, results, result)
        if refusal:
            print(f"\n{refusal}: docs/mutation.md left as it was.", file=sys.stderr)
            return 1
        sources = source_hashes(ROOT, mutated_modules(ROOT))
        try:
            fresh = not (ROOT / KEPT).exists()
            block = doc_block(result, datetime.date.today(), sources, fresh)
            new_text = with_block(doc_text, block)
        except ValueError as exc:
            print(f"\n{exc}", file=sys.stderr)
            return 1
        DOC.write_text(new_text, "utf-8")
        print("\nWrote the Result table of docs/mutation.md.")
    return 2 if result.work_left else 0


if __name__ == "__main__":
    sys.exit(main())
