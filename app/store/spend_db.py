"""The spend ledger's database: one table of settled calls, in a SQLite file or in PostgreSQL,
created and migrated by the gateway itself. Blocking I/O: called only from real OS threads
(the ledger's writer and the hub's thread pool, app/store/spend_ledger.py), never from a
greenlet of a worker's loop.

Where: ``LLMGATE_LEDGER_URL`` is a path or ``sqlite:///path`` (a SQLite file, the default of
`make run`, one machine), or ``postgresql://...`` (several instances, Kubernetes). The URL may
hold a password: it is never logged (``redacted``).

- **SQLite** runs in WAL mode: readers go on beside the one writer of the moment, and the
  writers of several worker processes take turns (each batch is one short transaction; a
  writer waits up to ``BUSY_S`` for another's). ``synchronous=NORMAL``: a commit survives the
  process's death (SIGKILL); a power cut may lose the last commits, not the file.
- **PostgreSQL** through psycopg 3: a batch is one ``executemany`` in one transaction (psycopg
  pipelines its statements). A connection belongs to the one thread that opened it.

Every row is keyed by the gateway's request id and inserted with ``ON CONFLICT DO NOTHING``,
so a batch sent again (its commit happened but its answer was lost) counts once.

The schema is versioned in ``llmgate_schema``: ``migrate`` applies each step above the
version it finds, in one transaction under a lock (the workers of every instance may start at
once), and refuses a database written by a newer gateway.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from app.store.spend_rows import COLUMNS, TOTALS, SpendRow

# How long a SQLite writer waits for another process's transaction before it fails.
BUSY_S = 5.0
TABLE = "llmgate_spend"


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer gateway: this one does not write to it."""


# The schema, one list of statements per version; the first is 1 (an empty database is 0).
# {real}, {bigint}: each kind's type for a Unix time and a 64-bit count.
STEPS: dict[int, list[str]] = {
    1: [
        f"""CREATE TABLE {TABLE} (
            request_id TEXT PRIMARY KEY,
            at {{real}} NOT NULL,
            key_name TEXT NOT NULL,
            model TEXT,
            upstream TEXT,
            tokens_in {{bigint}},
            tokens_cached {{bigint}},
            tokens_written {{bigint}},
            tokens_out {{bigint}},
            tokens {{bigint}} NOT NULL,
            cost_pico {{bigint}} NOT NULL,
            basis TEXT NOT NULL,
            upstream_request_id TEXT,
            prices_version TEXT
        )""",
        f"CREATE INDEX {TABLE}_key_at ON {TABLE} (key_name, at)",
        f"CREATE INDEX {TABLE}_at ON {TABLE} (at)",
    ],
}
SCHEMA_VERSION = max(STEPS)
_PG_TYPES = {"real": "DOUBLE PRECISION", "bigint": "BIGINT"}
_SQLITE_TYPES = {"real": "REAL", "bigint": "INTEGER"}


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path(url: str) -> Path:
    """The file of a SQLite ledger URL: ``sqlite:///abs/path``, ``sqlite:rel/path`` or a path."""
    if url.startswith("sqlite://"):
        return Path(url.removeprefix("sqlite://"))
    return Path(url.removeprefix("sqlite:"))


def redacted(url: str) -> str:
    """The URL without its password (``user:password@`` or ``password=``), for a log line."""
    url = re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)
    return re.sub(r"(password=)[^&\s]+", r"\1***", url, flags=re.IGNORECASE)


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) without ``url``'s password, wherever the
    driver quoted it: as the URL, or the password alone, plain or percent-encoded."""
    text = redacted(text)
    secrets = set(re.findall(r"password=([^&\s]+)", url, flags=re.IGNORECASE))
    with contextlib.suppress(ValueError):
        if password := urlsplit(url).password:
            secrets.add(password)
    for secret in sorted(secrets | {unquote(s) for s in secrets}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def failure(exc: BaseException, url: str) -> str:
    """A driver's failure about ``url`` in one line (its first), without the password."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {scrubbed(text, url)}" if text else type(exc).__name__


class SpendDatabase:
    """One connection to the ledger's database, used by one thread."""

    def __init__(self, url: str, connect_timeout_s: float = 5.0) -> None:
        self.url = url
        self.postgres = is_postgres(url)
        self._mark = "%s" if self.postgres else "?"
        self.conn: Any = self._connect(connect_timeout_s)

    def _connect(self, timeout_s: float) -> Any:
        if self.postgres:
            import psycopg

            # libpq takes whole seconds, at least 2.
            return psycopg.connect(
                self.url, connect_timeout=max(2, round(timeout_s)), application_name="llmgate"
            )
        path = sqlite_path(self.url)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # Spend by key is the operator's: the file (and SQLite's -wal and -shm beside it,
            # which take its mode) readable by its owner only.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        # Not checked for its thread: a reader's connection passes from one thread of the
        # pool to another, used by one at a time.
        conn = sqlite3.connect(path, timeout=BUSY_S, isolation_level=None, check_same_thread=False)
        # WAL is kept in the file: set once, by the first connection (setting it takes the
        # database alone, which a busy timeout does not always wait for).
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a connection the server dropped: nothing to close
            self.conn.close()

    def _sql(self, text: str) -> str:
        return text.replace("?", self._mark)

    # -- the schema -----------------------------------------------------------------------
    def version(self) -> int:
        """The schema's version (0: an empty database)."""
        found = self._query(
            "SELECT 1 FROM information_schema.tables WHERE table_name = 'llmgate_schema'"
            if self.postgres
            else "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'llmgate_schema'"
        )
        if not found:
            return 0
        rows = self._query("SELECT version FROM llmgate_schema")
        return int(rows[0][0]) if rows else 0

    def migrate(self, target: int = SCHEMA_VERSION) -> int:
        """Bring the schema to ``target``, each step above the version found, in one
        transaction under a lock; the version it was at. SchemaTooNew past ``target``.
        A schema at ``target`` already is only read: the workers of a fleet starting at once
        take the lock one after another only while it is being made, not each for a write
        (on a busy disk a SQLite write waits for fsyncs, and six in a row outlasted the busy
        timeout)."""
        if self.version() == target:
            return target
        with self._transaction(lock=True) as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS llmgate_schema (version INTEGER NOT NULL)")
            cur.execute("SELECT version FROM llmgate_schema")
            row = cur.fetchone()
            found = int(row[0]) if row else 0
            if found > target:
                raise SchemaTooNew(
                    f"the spend ledger's schema is version {found}, newer than this gateway's "
                    f"{target}: written by a newer gateway"
                )
            types = _PG_TYPES if self.postgres else _SQLITE_TYPES
            for step in range(found + 1, target + 1):
                for statement in STEPS[step]:
                    cur.execute(statement.format(**types))
            if row is None:
                cur.execute(self._sql("INSERT INTO llmgate_schema (version) VALUES (?)"), (target,))
            elif found != target:
                cur.execute(self._sql("UPDATE llmgate_schema SET version = ?"), (target,))
        return found

    # -- writes ---------------------------------------------------------------------------
    def insert(self, rows: Sequence[SpendRow]) -> None:
        """The rows, in one transaction; a row already there (same request id) stays as is."""
        names = ", ".join(COLUMNS)
        marks = ", ".join([self._mark] * len(COLUMNS))
        sql = f"INSERT INTO {TABLE} ({names}) VALUES ({marks}) ON CONFLICT (request_id) DO NOTHING"
        with self._transaction() as cur:
            cur.executemany(sql, [astuple(row) for row in rows])

    def prune(self, before: float, limit: int) -> int:
        """Delete at most ``limit`` rows admitted before ``before``; how many went."""
        slot = "ctid" if self.postgres else "rowid"
        sql = self._sql(
            f"DELETE FROM {TABLE} WHERE {slot} IN (SELECT {slot} FROM {TABLE} WHERE at < ? LIMIT ?)"
        )
        with self._transaction() as cur:
            cur.execute(sql, (before, limit))
            return int(cur.rowcount)

    # -- reads ----------------------------------------------------------------------------
    def total(self, key_name: str, what: str, start: float, end: float) -> int:
        """What ``key_name`` was charged (``what``: tokens or cost) by the calls admitted in
        [start, end)."""
        column = TOTALS[what]
        rows = self._query(
            f"SELECT COALESCE(SUM({column}), 0) FROM {TABLE} "
            "WHERE key_name = ? AND at >= ? AND at < ?",
            (key_name, start, end),
        )
        return int(rows[0][0])

    def report(self, start: float, end: float) -> list[dict[str, Any]]:
        """The calls admitted in [start, end) summed per key, model and upstream."""
        sums = ("tokens_in", "tokens_cached", "tokens_written", "tokens_out", "tokens", "cost_pico")
        rows = self._query(
            "SELECT key_name, model, upstream, COUNT(*), "
            + ", ".join(f"COALESCE(SUM({c}), 0)" for c in sums)
            + f" FROM {TABLE} WHERE at >= ? AND at < ? GROUP BY key_name, model, upstream "
            "ORDER BY key_name, model, upstream",
            (start, end),
        )
        names = ("key", "model", "upstream", "calls", *sums)
        return [dict(zip(names, (*r[:3], *(int(v) for v in r[3:])), strict=True)) for r in rows]

    def rows(self, start: float, end: float) -> Iterator[SpendRow]:
        """Every call admitted in [start, end), oldest first, read as it goes (an export of a
        year holds one batch in memory at a time)."""
        sql = self._sql(
            f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE at >= ? AND at < ? "
            "ORDER BY at, request_id"
        )
        # PostgreSQL sends a named cursor's rows as they are fetched, not all at once.
        cur = self.conn.cursor(name="llmgate_export") if self.postgres else self.conn.cursor()
        try:
            cur.execute(sql, (start, end))
            while batch := cur.fetchmany(1000):
                for row in batch:
                    yield SpendRow(*row)
        finally:
            cur.close()
            if self.postgres:
                self.conn.rollback()

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        cur = self.conn.cursor()
        try:
            cur.execute(self._sql(sql), args)
            return list(cur.fetchall())
        finally:
            cur.close()
            if self.postgres:
                self.conn.rollback()  # end the read's transaction: no snapshot held open

    def _transaction(self, lock: bool = False) -> _Transaction:
        return _Transaction(self, lock)


class _Transaction:
    """``with``: a cursor in one transaction, committed at the end or rolled back. ``lock``:
    the whole database's writes held first (the migration's: one at a time)."""

    def __init__(self, db: SpendDatabase, lock: bool) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> Any:
        db = self.db
        self.cur = db.conn.cursor()
        if not db.postgres:
            self.cur.execute("BEGIN IMMEDIATE" if self.lock else "BEGIN")
        elif self.lock:
            self.cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        return self.cur

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        conn, postgres = self.db.conn, self.db.postgres
        try:
            if kind is None:
                conn.commit() if postgres else conn.execute("COMMIT")
            elif postgres:
                with contextlib.suppress(Exception):  # the connection is gone: so is its work
                    conn.rollback()
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self.cur.close()


# The advisory lock the migration holds in PostgreSQL (any constant of our own).
_MIGRATION_LOCK = 0x11_6A7E_5BE0
