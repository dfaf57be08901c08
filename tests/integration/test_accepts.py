"""LLMGATE_ACCEPTS_PER_TURN reaches each gunicorn worker of a real stack (app/patches/accepts.py):
the server gunicorn's own run built in each worker says, as it starts accepting, how many new
connections a turn of its loop now takes, read from the max_accept gevent's accept callback
reads. Each worker process (gunicorn's children, from /proc) must have said it; by default
(gunicorn's own, one a turn) none says anything."""

from __future__ import annotations

import re

import pytest

from app.patches import accepts
from bench.kit import proctree
from tests.support.stack import StackHandle


def _said(handle: StackHandle) -> dict[int, int]:
    """Each worker's pid -> the connections a turn it said it takes."""
    lines = re.findall(
        r"worker (\d+) accepts up to (\d+) new connections a turn", handle.log("gunicorn")
    )
    return {int(pid): int(n) for pid, n in lines}


def _workers(handle: StackHandle) -> set[int]:
    return set(proctree.children(handle.stack.proc("gunicorn").popen.pid))


def test_by_default_each_worker_accepts_as_gunicorn_does(gw: StackHandle) -> None:
    """The default (1) leaves gunicorn's own server: no worker says it takes more."""
    workers = _workers(gw)
    assert len(workers) == 2 and accepts.DEFAULT == 1
    assert not [pid for pid in _said(gw) if pid in workers]


@pytest.mark.slow  # a stack of its own
def test_the_setting_reaches_each_worker(make_stack) -> None:
    handle = make_stack(env={accepts.SETTING: "16"})
    workers = _workers(handle)
    assert len(workers) == 2 and accepts.DEFAULT == 1
    assert {pid: n for pid, n in _said(handle).items() if pid in workers} == dict.fromkeys(
        workers, 16
    )
