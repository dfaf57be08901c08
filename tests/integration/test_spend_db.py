"""The spend ledger's database (app/store/spend_db.py) on both kinds it runs on, one contract:
a SQLite file, and a PostgreSQL of the test's own (each test a fresh database in it). What
was written is read back with the database's own client (sqlite3, psycopg:
tests/support/postgres.py ``ledger_query``), never through the module under test.
"""

from __future__ import annotations

import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store.spend_db import SCHEMA_VERSION, SchemaTooNew, SpendDatabase, redacted
from app.store.spend_rows import COLUMNS, SpendRow
from tests.support.postgres import fresh_database, ledger_query, postgres_server


@pytest.fixture(scope="module")
def pg_port(runs_dir: Path) -> Iterator[int]:
    with postgres_server(runs_dir) as (_, port):
        yield port


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "spend.sqlite3")
    port = request.getfixturevalue("pg_port")
    return fresh_database(port, f"spend_{uuid.uuid4().hex[:12]}")


def row(request_id: str, at: float, key: str = "team", **fields: object) -> SpendRow:
    values: dict[str, object] = {
        "model": "m",
        "upstream": "u",
        "tokens_in": 10,
        "tokens_cached": 2,
        "tokens_written": None,
        "tokens_out": 5,
        "tokens": 15,
        "cost_pico": 1_000_000,
        "basis": "usage",
        "upstream_request_id": f"req-{request_id}",
        "prices_version": "v1",
    }
    values.update(fields)
    return SpendRow(request_id=request_id, at=at, key_name=key, **values)  # type: ignore[arg-type]


def columns_of(url: str) -> list[str]:
    if url.startswith("postgresql://"):
        sql = (
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'llmgate_spend' ORDER BY ordinal_position"
        )
        return [name for (name,) in ledger_query(url, sql)]
    return [r[1] for r in ledger_query(url, "PRAGMA table_info(llmgate_spend)")]


def migrated(url: str) -> SpendDatabase:
    db = SpendDatabase(url)
    db.migrate()
    return db


def test_an_empty_database_is_brought_to_the_schema_once(url: str) -> None:
    db = SpendDatabase(url)
    assert db.version() == 0
    assert db.migrate() == 0  # the version it found
    assert db.version() == SCHEMA_VERSION == 1
    assert ledger_query(url, "SELECT version FROM llmgate_schema") == [(1,)]
    assert columns_of(url) == list(COLUMNS)  # every field of the row, in its order
    assert db.migrate() == 1  # again: nothing to do, and still one version row
    assert ledger_query(url, "SELECT COUNT(*) FROM llmgate_schema") == [(1,)]
    db.close()


def test_workers_starting_at_once_migrate_it_once(url: str) -> None:
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            db = SpendDatabase(url)
            try:
                db.migrate()
            finally:
                db.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert ledger_query(url, "SELECT version FROM llmgate_schema") == [(1,)]


def test_a_database_a_newer_gateway_migrated_is_refused(url: str) -> None:
    migrated(url).close()
    ledger_query(url, "UPDATE llmgate_schema SET version = 2")
    db = SpendDatabase(url)
    with pytest.raises(SchemaTooNew, match="version 2"):
        db.migrate()
    db.close()


def test_a_row_counts_once_by_its_request_id(url: str) -> None:
    db = migrated(url)
    db.insert([row("a", 100.0), row("b", 101.0)])
    # A batch sent again (its commit went through, its answer was lost) changes nothing.
    db.insert([row("a", 100.0, tokens=999), row("c", 102.0)])
    found = ledger_query(url, "SELECT request_id, tokens FROM llmgate_spend ORDER BY request_id")
    assert found == [("a", 15), ("b", 15), ("c", 15)]
    db.close()


def test_a_rows_fields_are_kept_as_given_nulls_too(url: str) -> None:
    db = migrated(url)
    big = 2**62  # a 64-bit count
    given = row(
        "x",
        1_790_000_000.25,
        model=None,
        upstream=None,
        tokens_in=None,
        tokens_cached=None,
        tokens_out=None,
        tokens=big,
        cost_pico=big,
        basis="reservation",
        upstream_request_id=None,
        prices_version=None,
    )
    db.insert([given])
    (found,) = ledger_query(url, f"SELECT {', '.join(COLUMNS)} FROM llmgate_spend")
    assert SpendRow(*found) == given
    db.close()


def test_a_total_is_one_keys_calls_admitted_in_its_window(url: str) -> None:
    db = migrated(url)
    db.insert(
        [
            row("before", 99.9, tokens=1000),  # before the window
            row("first", 100.0, tokens=1, cost_pico=10),  # its first instant counts
            row("in", 150.0, tokens=2, cost_pico=20),
            row("other", 150.0, key="other", tokens=4000),  # another key
            row("end", 200.0, tokens=8000),  # its end does not
        ]
    )
    assert db.total("team", "tokens", 100, 200) == 3
    assert db.total("team", "cost", 100, 200) == 30
    assert db.total("nobody", "tokens", 0, 1000) == 0
    db.close()


def test_a_period_is_summed_per_key_model_and_upstream(url: str) -> None:
    db = migrated(url)
    db.insert(
        [
            row("1", 10.0, model="a", tokens_written=7),
            row("2", 11.0, model="a", tokens_written=None),
            row("3", 12.0, model="b", upstream="v"),
            row("4", 13.0, key="other"),
            row("5", 50.0),  # after the period
        ]
    )
    report = db.report(0, 50)
    assert [(r["key"], r["model"], r["upstream"], r["calls"]) for r in report] == [
        ("other", "m", "u", 1),
        ("team", "a", "u", 2),
        ("team", "b", "v", 1),
    ]
    team_a = report[1]
    assert team_a["tokens_in"] == 20 and team_a["tokens_written"] == 7
    assert team_a["tokens"] == 30 and team_a["cost_pico"] == 2_000_000
    db.close()


def test_rows_are_read_oldest_first_within_the_period(url: str) -> None:
    db = migrated(url)
    times = [(2500 - i) / 10 for i in range(2500)]  # 250.0 down to 0.1: newest first
    db.insert([row(str(i), at) for i, at in enumerate(times)])
    found = list(db.rows(0, 200))  # 1,999 rows: more than one fetch of 1,000
    assert [r.at for r in found] == sorted(at for at in times if at < 200)
    db.close()


def test_pruning_deletes_what_is_older_a_batch_at_a_time(url: str) -> None:
    db = migrated(url)
    db.insert([row(str(i), float(i)) for i in range(25)])
    assert db.prune(before=20, limit=8) == 8
    assert db.prune(before=20, limit=8) == 8
    assert db.prune(before=20, limit=8) == 4
    assert db.prune(before=20, limit=8) == 0
    left = ledger_query(url, "SELECT at FROM llmgate_spend ORDER BY at")
    assert [at for (at,) in left] == [float(i) for i in range(20, 25)]
    db.close()


def test_a_sqlite_ledger_is_its_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "spend.sqlite3"
    migrated(str(path)).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ledger_query(str(path), "PRAGMA journal_mode") == [("wal",)]


def test_a_url_is_logged_without_its_password() -> None:
    url = "postgresql://spend:s3cret@db.internal:5432/llmgate"
    assert redacted(url) == "postgresql://spend:***@db.internal:5432/llmgate"
    assert redacted("/var/lib/llmgate/spend.sqlite3") == "/var/lib/llmgate/spend.sqlite3"
