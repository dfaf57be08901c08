"""`python -m app.tenancy.spend` (app/tenancy/spend.py) on a SQLite ledger of the test's own:
the export a finance team matches with the provider's invoice (CSV or JSON lines), a day's or
month's report, the schema made ahead, old rows pruned; a bad argument or a ledger that is not
there is one line and a status, never a traceback. The rows are written with sqlite3 itself.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.store.spend_db import SpendDatabase
from app.store.spend_rows import SpendRow
from app.tenancy import spend
from app.tenancy.limits import period
from tests.conftest import ROOT

JAN_31 = 1_801_353_600.0  # 2027-01-31T00:00:00Z
FEB_1 = JAN_31 + 86400


def row(request_id: str, at: float, key: str = "team", cost: int = 1_500_000) -> SpendRow:
    return SpendRow(request_id, at, key, "gpt-x", "primary", 120, 100, 20, 30, 150, cost,
                    "usage", f"req_{request_id}", "prices-7")  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    path = tmp_path / "spend.sqlite3"
    db = SpendDatabase(str(path))
    db.migrate()
    db.insert([
        row("a", JAN_31 + 0.25),
        row("b", JAN_31 + 3600, key="other", cost=123_456_789_012),
        row("c", FEB_1 + 5),  # the next day, and month
        row("old", JAN_31 - 40 * 86400),
    ])  # fmt: skip
    db.close()
    return str(path)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return spend.main(list(argv), out=out), out.getvalue()


def test_a_period_reads_as_a_utc_day_or_month() -> None:
    assert period("2027-01-31") == (JAN_31, FEB_1)
    assert period("2027-01") == (JAN_31 - 30 * 86400, FEB_1)
    assert period("2024-02") == (1_706_745_600, 1_709_251_200)  # a leap February: 29 days
    for bad in ("2027-13", "2027-02-29", "2027", "2027-1-1-1", "jan", ""):
        with pytest.raises(ValueError, match="is not a"):
            period(bad)


def test_an_export_is_the_periods_rows_as_csv(ledger: str) -> None:
    status, out = run("--url", ledger, "export", "--from", "2027-01-31", "--to", "2027-02-01",
                      "--csv")  # fmt: skip
    assert status == 0
    lines = list(csv.DictReader(io.StringIO(out)))
    assert [r["request_id"] for r in lines] == ["a", "b"]  # the day's, oldest first
    first = lines[0]
    assert first["at"] == "2027-01-31T00:00:00.250Z" and first["key"] == "team"
    assert (first["tokens_in"], first["tokens_cached"], first["tokens_written"]) == (
        "120",
        "100",
        "20",
    )
    assert (first["cost_pico"], first["cost_usd"]) == ("1500000", "0.000001500000")
    assert first["upstream_request_id"] == "req_a" and first["prices_version"] == "prices-7"
    assert lines[1]["cost_usd"] == "0.123456789012"  # exact: picodollars, not a float


def test_an_export_as_json_lines_keeps_nulls(ledger: str, tmp_path: Path) -> None:
    db = SpendDatabase(ledger)
    db.insert([SpendRow("n", JAN_31 + 7, "team", None, None, None, None, None, None, 200, 0,
                        "reservation", None, None)])  # fmt: skip
    db.close()
    status, out = run("--url", ledger, "export", "--from", "2027-01-31T00:00:05",
                      "--to", "2027-01-31T00:00:08")  # fmt: skip
    (line,) = [json.loads(text) for text in out.splitlines()]
    assert status == 0 and line["request_id"] == "n" and line["model"] is None
    assert (line["tokens"], line["basis"], line["cost_usd"]) == (
        200,
        "reservation",
        "0.000000000000",
    )


def test_a_report_sums_a_period_per_key_model_and_upstream(ledger: str) -> None:
    status, out = run("--url", ledger, "report", "--period", "2027-01")
    report = json.loads(out)
    assert status == 0 and (report["from"], report["to"]) == (
        "2027-01-01T00:00:00Z",
        "2027-02-01T00:00:00Z",
    )
    by_key = {k["name"]: k for k in report["keys"]}
    assert by_key["team"]["calls"] == 1 and by_key["team"]["tokens"] == 150
    assert by_key["other"]["usd"] == pytest.approx(0.123456789012)
    (line,) = by_key["team"]["by"]
    assert (line["model"], line["upstream"], line["tokens_written"]) == ("gpt-x", "primary", 20)


def test_the_schema_made_ahead_and_old_rows_pruned(tmp_path: Path, ledger: str) -> None:
    fresh = str(tmp_path / "new" / "spend.sqlite3")
    status, out = run("--url", fresh, "migrate")
    assert status == 0 and "version 1 (was 0)" in out
    status, out = run("--url", ledger, "prune", "--before", "2027-01-01")
    assert (status, out.strip()) == (0, "spend: 1 rows deleted")
    with sqlite3.connect(ledger) as conn:
        assert conn.execute("SELECT COUNT(*) FROM llmgate_spend").fetchone() == (3,)


def test_a_bad_argument_or_no_ledger_is_one_line_and_a_status(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "none.sqlite3")
    assert run("--url", missing, "report", "--period", "2027-01")[0] == 1
    assert "there is no ledger at" in capsys.readouterr().err
    assert not Path(missing).exists()  # reading made nothing
    with pytest.raises(SystemExit) as caught:
        run("--url", missing, "export", "--from", "yesterday", "--to", "2027-01-01")
    assert caught.value.code == 2 and "is not a UTC date" in capsys.readouterr().err
    # A PostgreSQL nobody serves: the reason, its password kept out.
    down = "postgresql://spend:s3cret@127.0.0.1:9/llmgate"
    assert run("--url", down, "report", "--period", "2027-01")[0] == 1
    err = capsys.readouterr().err
    assert "cannot open the ledger postgresql://spend:***@" in err and "s3cret" not in err
    assert "Traceback" not in err


def test_it_runs_as_a_module_with_make_runs_ledger_by_default(ledger: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "LLMGATE_RUN_DIR": str(Path(ledger).parent)}
    argv = [sys.executable, "-m", "app.tenancy.spend", "report", "--period", "2027-01-31"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [k["name"] for k in json.loads(done.stdout)["keys"]] == ["other", "team"]
