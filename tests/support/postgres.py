"""A PostgreSQL of the test's own (runner/postgres.py: initdb, then the server as a child), a
fresh database in it per test, and the spend ledger read straight from the database, never
through the gateway's code (app/store/spend_db.py).

PostgreSQL missing is a skip on a laptop and a failure with CI=true (`make test` installs it:
scripts/setup.sh), as a missing nginx is (tests/conftest.py's ``require_postgres``).
"""

from __future__ import annotations

import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runner import postgres
from runner.procs import Proc, free_port
from runner.stack import Stack
from tests.conftest import require_postgres


@contextmanager
def postgres_server(parent: Path) -> Iterator[tuple[Proc, int]]:
    """A cluster in a new folder of ``parent`` (which the server's user must be able to walk:
    runs_dir is), on a free port; stopped at the end."""
    require_postgres()
    folder = Path(tempfile.mkdtemp(prefix="postgres-", dir=parent))
    folder.chmod(0o755)
    port = free_port()
    proc = postgres.start(folder / "data", port, folder / "postgres.log")
    try:
        yield proc, port
    finally:
        proc.kill()


def fresh_database(port: int, name: str) -> str:
    """A new, empty database in the cluster on ``port``; its URL."""
    createdb = postgres.find_program("createdb")
    assert createdb is not None
    argv = [createdb, "-h", "127.0.0.1", "-p", str(port), "-U", postgres.USER, name]
    subprocess.run(argv, check=True, capture_output=True)
    return f"postgresql://{postgres.USER}@127.0.0.1:{port}/{name}"


def ledger_query(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``sql`` on the ledger's database itself (``?`` placeholders, either kind)."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            cur = pg.execute(sql.replace("?", "%s"), args)
            return [tuple(row) for row in cur.fetchall()] if cur.description else []
    lite = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
    try:
        return lite.execute(sql, args).fetchall()
    finally:
        lite.close()


def ledger_rows(url: str) -> int:
    """How many rows the ledger holds (0 before its table exists)."""
    try:
        return int(ledger_query(url, "SELECT COUNT(*) FROM llmgate_spend")[0][0])
    except Exception as exc:  # no table yet: nothing was written
        if "llmgate_spend" in str(exc):
            return 0
        raise


def stop_stack_postgres(stack: Stack) -> None:
    """Stop a stack's PostgreSQL (its fast shutdown: its sessions are ended); its cluster
    and port stay for ``start_stack_postgres``."""
    stack.proc("postgres").stop()
    stack.procs = [p for p in stack.procs if p.name != "postgres"]


def start_stack_postgres(stack: Stack) -> None:
    """The stack's PostgreSQL again, on its port, with its data."""
    stack.start_postgres()
