"""Per-module mutation score of the last `mutmut run` (the end of `make mutate`).

Reads mutmut's result files (mutants/<module>.meta) for every module listed in
[tool.mutmut] only_mutate of pyproject.toml, and the survivors argued equivalent in
docs/mutation.md (list items that start with a mutant name in backticks). Prints, per module:
mutants, killed (a timeout counts as killed: the tests noticed), survived, equivalent, and
the two scores, killed / total and killed / non-equivalent; then every survivor that is not
argued equivalent, and every argued-equivalent name that is no longer a survivor.

Exit status: 0, or 1 when there is no result to read. Stdlib only.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED = {1, 3, 24, -24, 152, 255, 36}  # mutmut: killed, pytest internal error, timeouts
SURVIVED = {0}
_EQUIVALENT = re.compile(r"^\s*[-*]\s+`((?:app|llmgate_wire)\.[\w.ǁ]+__mutmut_\d+)`", re.MULTILINE)


def equivalent_names(doc: Path) -> set[str]:
    return set(_EQUIVALENT.findall(doc.read_text("utf-8"))) if doc.exists() else set()


def module_results(root: Path) -> dict[str, dict[str, int]]:
    config = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["tool"]["mutmut"]
    results: dict[str, dict[str, int]] = {}
    for path in config["only_mutate"]:
        meta = root / "mutants" / (path + ".meta")
        if meta.exists():
            results[path] = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return results


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:5.1f} %" if whole else "    - "


def report(results: dict[str, dict[str, int]], equivalent: set[str]) -> list[str]:
    lines = [
        f"{'module':<28}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>7}"
        f"{'killed/total':>14}{'killed/non-eq.':>16}"
    ]
    open_survivors: list[str] = []
    stale: list[str] = []
    totals = [0, 0, 0, 0]
    for path, codes in results.items():
        killed = sum(1 for code in codes.values() if code in KILLED)
        survivors = sorted(name for name, code in codes.items() if code not in KILLED)
        equiv = [name for name in survivors if name in equivalent]
        open_survivors += [
            f"{name} ({'survived' if codes[name] in SURVIVED else f'exit code {codes[name]}'})"
            for name in survivors
            if name not in equivalent
        ]
        stale += sorted(n for n in equivalent if n in codes and codes[n] in KILLED)
        row = [len(codes), killed, len(survivors), len(equiv)]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        lines.append(_row(path.removeprefix("app/"), row))
    lines.append(_row("all", totals))
    if open_survivors:
        count = len(open_survivors)
        lines += ["", f"Survivors not argued equivalent in docs/mutation.md ({count}):"]
        lines += [f"  {name}" for name in open_survivors]
    if stale:
        lines += ["", "Listed as equivalent but killed now (remove from docs/mutation.md):"]
        lines += [f"  {name}" for name in stale]
    return lines


def _row(name: str, row: list[int]) -> str:
    total, killed, survived, equiv = row
    return (
        f"{name:<28}{total:>8}{killed:>8}{survived:>9}{equiv:>7}"
        f"{_pct(killed, total):>14}{_pct(killed, total - equiv):>16}"
    )


def main() -> int:
    results = module_results(ROOT)
    if not results:
        print("No mutmut results in mutants/: run `make mutate` first.", file=sys.stderr)
        return 1
    print("\n".join(report(results, equivalent_names(ROOT / "docs" / "mutation.md"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
