"""Shared test setup: the repository root on sys.path, and the CI rule for missing binaries."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    """The binary's path; a skip on a laptop without it, a failure in CI (never a quiet green)."""
    from runner.procs import find_binary

    path = find_binary(name)
    if path is None:
        message = f"{name} is not installed (make setup installs it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def require_postgres() -> None:
    """PostgreSQL's programs (runner/postgres.py finds them where Debian keeps them): a skip
    on a laptop without them, a failure in CI, as for any other binary."""
    from runner import postgres

    if not postgres.installed():
        hint = postgres.INSTALL_HINT
        message = f"PostgreSQL is not installed (make setup-test installs it; {hint})"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(autouse=True, scope="module")
def _leaks_found_where_they_are_made() -> Iterator[None]:
    """A socket or file left open in a reference cycle warns (ResourceWarning, an error here)
    only when the garbage collector frees it: in whatever test allocates enough to run it,
    often another file's in the same xdist worker. Collected at the end of each test file,
    such a leak fails the file that made it, every time."""
    yield
    gc.collect()
