"""PostgreSQL's programs are found where Debian keeps them (runner/postgres.py), and a machine
without them fails the PostgreSQL tests in CI rather than skipping them
(tests/conftest.py's ``require_postgres``, the rule nginx and Memcached follow)."""

from __future__ import annotations

import pytest

import tests.conftest
from runner import postgres


def test_the_newest_debian_version_is_found_when_none_is_on_path(monkeypatch, tmp_path) -> None:
    for version in ("9", "16", "15"):
        program = tmp_path / version / "bin" / "initdb"
        program.parent.mkdir(parents=True)
        program.write_text("#!/bin/sh\n")
    monkeypatch.setattr(postgres, "find_binary", lambda name: None)
    monkeypatch.setattr(postgres, "Path", lambda folder: tmp_path)
    assert postgres.find_program("initdb") == str(tmp_path / "16" / "bin" / "initdb")
    assert postgres.find_program("postgres") is None


def test_missing_postgresql_fails_in_ci_and_is_skipped_elsewhere(monkeypatch) -> None:
    monkeypatch.setattr(postgres, "installed", lambda: False)
    # Caught as BaseException: a skip where a failure is due must fail this test, not skip it.
    monkeypatch.setattr(tests.conftest, "IN_CI", True)
    with pytest.raises(BaseException) as in_ci:
        tests.conftest.require_postgres()
    assert in_ci.type is pytest.fail.Exception and "make setup-test" in str(in_ci.value)
    monkeypatch.setattr(tests.conftest, "IN_CI", False)
    with pytest.raises(BaseException) as on_a_laptop:
        tests.conftest.require_postgres()
    assert on_a_laptop.type is pytest.skip.Exception
