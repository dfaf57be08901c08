"""The spend ledger from a shell: `python -m app.tenancy.spend <command>`.

    export  every call admitted in [--from, --to), oldest first: CSV (--csv) or JSON lines,
            the rows a finance team matches with the provider's invoice
            (upstream_request_id, the usage's counts, cost, the prices' version)
    report  one day or month (--period 2026-01 or 2026-01-31) summed per key, model and
            upstream, as JSON: what /admin/usage?period= answers
    migrate create the schema or bring it to this gateway's version (the gateway does it
            itself when it first writes; this is for a database made ahead of a deploy)
    prune   delete the rows admitted before --before, 10,000 per transaction

The ledger is --url, else LLMGATE_LEDGER_URL, else `make run`'s SQLite file
($LLMGATE_RUN_DIR/spend.sqlite3, .run by default). Dates are UTC: ``2026-01-31``, or
``2026-01-31T12:00:00``; --to is not included. A bad argument or a ledger that cannot be
reached is one line on stderr and exit status 2 or 1, never a traceback.

It runs alone (no gevent, no worker): it uses the database module directly
(app/store/spend_db.py), read-only but for ``migrate`` and ``prune``.
"""

from __future__ import annotations

import argparse
import calendar
import csv
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from app.store.spend_db import SpendDatabase, failure, is_postgres, redacted, sqlite_path
from app.store.spend_rows import COLUMNS, SpendRow
from app.tenancy.limits import period
from app.tenancy.prices import PICO_PER_USD

ROOT = Path(__file__).resolve().parent.parent.parent
PRUNE_BATCH = 10_000
# The export's columns: the row's, with the key's name as "key" and its cost in USD beside
# the exact picodollars.
EXPORT_COLUMNS = [("key" if c == "key_name" else c) for c in COLUMNS] + ["cost_usd"]


def usd_text(picodollars: int) -> str:
    """Picodollars as USD, exactly: twelve decimals."""
    return f"{Decimal(picodollars) / PICO_PER_USD:.12f}"


def utc_time(text: str) -> float:
    """``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` (UTC) as Unix seconds."""
    for shape in ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"):
        try:
            return float(calendar.timegm(time.strptime(text.removesuffix("Z"), shape)))
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(f"{text!r} is not a UTC date (2026-01-31 or 2026-01-31T12:00)")


def export_line(row: SpendRow) -> dict[str, Any]:
    """The row as exported: its time in UTC to the millisecond, its cost in USD too."""
    values = dict(zip(EXPORT_COLUMNS, (*_values(row), usd_text(row.cost_pico)), strict=True))
    millis = round(row.at * 1000)
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000))
    values["at"] = f"{seconds}.{millis % 1000:03d}Z"
    return values


def write_export(rows: Iterable[SpendRow], out: IO[str], as_csv: bool) -> int:
    """The rows to ``out``, CSV or JSON lines; how many."""
    count = 0
    writer = csv.DictWriter(out, EXPORT_COLUMNS, lineterminator="\n") if as_csv else None
    if writer is not None:
        writer.writeheader()
    for row in rows:
        line = export_line(row)
        if writer is not None:
            writer.writerow({k: "" if v is None else v for k, v in line.items()})
        else:
            out.write(json.dumps(line) + "\n")
        count += 1
    return count


def report(db: SpendDatabase, start: float, end: float) -> dict[str, Any]:
    """A period's calls summed per key, model and upstream, and per key: /admin/usage's
    answer for a day or month."""
    return shaped_report(db.report(start, end), start, end)


def shaped_report(sums: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    keys: dict[str, dict[str, Any]] = {}
    for line in sums:
        line["usd"] = float(usd_text(line.pop("cost_pico")))
        name = line.pop("key")
        total = keys.setdefault(name, {"name": name, "calls": 0, "tokens": 0, "usd": 0.0})
        total["calls"] += line["calls"]
        total["tokens"] += line["tokens"]
        total.setdefault("by", []).append(line)
    for total in keys.values():
        total["usd"] = round(sum(line["usd"] for line in total["by"]), 12)
    return {
        "source": "ledger",
        "from": _iso(start),
        "to": _iso(end),
        "keys": list(keys.values()),
    }


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    url = args.url or os.environ.get("LLMGATE_LEDGER_URL", "").strip() or _default_url()
    if not is_postgres(url) and args.command != "migrate" and not sqlite_path(url).exists():
        print(f"spend: there is no ledger at {url}", file=sys.stderr)
        return 1
    try:
        db = SpendDatabase(url)
    except Exception as exc:
        why = failure(exc, url)
        print(f"spend: cannot open the ledger {redacted(url)}: {why}", file=sys.stderr)
        return 1
    try:
        if args.command == "migrate":
            found = db.migrate()
            print(f"spend: schema at version {db.version()} (was {found})", file=out)
        elif args.command == "prune":
            gone = 0
            while (batch := db.prune(args.before, PRUNE_BATCH)) > 0:
                gone += batch
            print(f"spend: {gone} rows deleted", file=out)
        elif db.version() == 0:
            print(f"spend: the ledger {redacted(url)} holds no schema yet", file=sys.stderr)
            return 1
        elif args.command == "report":
            start, end = args.period
            print(json.dumps(report(db, start, end), indent=2), file=out)
        else:
            write_export(db.rows(args.start, args.end), out, args.csv)
    except Exception as exc:
        print(
            f"spend: {args.command} failed on {redacted(url)}: {failure(exc, url)}",
            file=sys.stderr,
        )
        return 1
    finally:
        db.close()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app.tenancy.spend",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--url", help="the ledger (default: LLMGATE_LEDGER_URL, else make run's)")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="the calls of a period, one row each")
    export.add_argument("--from", dest="start", type=utc_time, required=True)
    export.add_argument("--to", dest="end", type=utc_time, required=True)
    export.add_argument("--csv", action="store_true", help="CSV with a header (else JSON lines)")
    summary = commands.add_parser("report", help="a day or month per key, model, upstream")
    summary.add_argument("--period", type=_period, required=True, help="2026-01 or 2026-01-31")
    commands.add_parser("migrate", help="create or migrate the schema")
    prune = commands.add_parser("prune", help="delete the rows admitted before a date")
    prune.add_argument("--before", type=utc_time, required=True)
    return parser


def _period(text: str) -> tuple[int, int]:
    try:
        return period(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_url() -> str:
    run_dir = os.environ.get("LLMGATE_RUN_DIR", "").strip()
    return str((Path(run_dir) if run_dir else ROOT / ".run") / "spend.sqlite3")


def _values(row: SpendRow) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in COLUMNS)


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


if __name__ == "__main__":
    sys.exit(main())
