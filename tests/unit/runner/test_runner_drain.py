"""runner/drain.py's arithmetic and its file: the delay counts from when the instance turned
unready, so a Kubernetes preStop hook's sleep is not served twice. The processes' side (a
stream finishing while /readyz answers 503) is tests/integration/test_run_drain.py."""

from __future__ import annotations

import os
from pathlib import Path

from runner.drain import delay_left, turn_unready
from runner.stack import Stack, StackOptions


def test_the_delay_left_is_what_has_not_passed_yet() -> None:
    assert delay_left(5, 0) == 5
    assert delay_left(5, 2) == 3
    assert delay_left(5, 10) == 0  # a preStop hook slept 10 s already
    assert delay_left(0, 0) == 0
    assert delay_left(5, -3) == 5  # a file from the future (clock steps) counts as new


def test_turning_unready_makes_the_file_or_keeps_a_hooks(tmp_path: Path) -> None:
    made = tmp_path / "new" / "draining"
    assert turn_unready(made) == 0.0 and made.exists()
    hooks = tmp_path / "draining"
    hooks.touch()
    os.utime(hooks, (1000.0, 1000.0))
    assert turn_unready(hooks, now=1010.0) == 10.0
    assert hooks.stat().st_mtime == 1000.0  # not touched again: its age is the hook's


def test_the_stack_gives_its_drain_file_to_gunicorn_and_nginx(tmp_path: Path) -> None:
    own = Stack(StackOptions(run_dir=tmp_path / "run"))
    assert own.drain_file == (tmp_path / "run" / "draining").absolute()
    assert own.gateway_env(8000)["LLMGATE_DRAIN_FILE"] == str(own.drain_file)
    given = Stack(StackOptions(run_dir=tmp_path, env={"LLMGATE_DRAIN_FILE": "rel/draining"}))
    assert given.drain_file == Path("rel/draining").absolute()  # gunicorn runs elsewhere
    assert given.gateway_env(8000)["LLMGATE_DRAIN_FILE"] == str(given.drain_file)
