"""How the runner reads the make it runs under (runner/make_parent.py), from status texts
shaped as /proc/<pid>/status writes them; the real make: tests/integration/test_make_run.py."""

from __future__ import annotations

import os
import signal

import pytest

from runner import make_parent
from runner.make_parent import MakeParent

# make 4.3 as measured on this machine: running its recipe (SIGCHLD blocked; SIGHUP, SIGINT,
# SIGQUIT, SIGUSR1, SIGTERM, SIGCHLD, SIGXCPU, SIGXFSZ caught), then in its SIGINT handler,
# waiting for its children: SIGINT blocked and no longer caught.
CHLD, CAUGHT = 0x10000, 0x1814207


def bit(sig: int) -> int:
    return 1 << (sig - 1)


def status(blocked: int = CHLD, ignored: int = 0, caught: int = CAUGHT) -> str:
    return (
        f"SigPnd:\t{0:016x}\nSigBlk:\t{blocked:016x}\nSigIgn:\t{ignored:016x}\n"
        f"SigCgt:\t{caught:016x}\n"
    )


def _make(monkeypatch: pytest.MonkeyPatch, now: str | None) -> MakeParent:
    make = MakeParent(os.getpid(), status())
    monkeypatch.setattr(make, "_status", lambda: now)
    return make


def test_make_handling_a_signal_it_waits_on_us_for_stops_the_runner(monkeypatch) -> None:
    assert not _make(monkeypatch, status()).stopping()
    waiting = status(CHLD | bit(signal.SIGINT), caught=CAUGHT & ~bit(signal.SIGINT))
    assert _make(monkeypatch, waiting).stopping()
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        assert _make(monkeypatch, status(CHLD | bit(sig))).stopping()
    # Another signal blocked is not one make dies of after its children.
    assert not _make(monkeypatch, status(CHLD | bit(signal.SIGUSR1))).stopping()
    assert _make(monkeypatch, None).stopping()  # make is gone
    # A signal make had blocked from its start (inherited) says nothing new.
    inherited = MakeParent(os.getpid(), status(CHLD | bit(signal.SIGHUP)))
    monkeypatch.setattr(inherited, "_status", lambda: status(CHLD | bit(signal.SIGHUP)))
    assert not inherited.stopping()


def test_make_is_ended_with_sigpipe_only_when_it_would_die_of_it(monkeypatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(make_parent.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    _make(monkeypatch, status()).end_quietly()
    assert sent == [(os.getpid(), signal.SIGPIPE)]
    sent.clear()
    # Caught or ignored, SIGPIPE would not end it: make is left to print its own line.
    _make(monkeypatch, status(caught=CAUGHT | bit(signal.SIGPIPE))).end_quietly()
    _make(monkeypatch, status(ignored=bit(signal.SIGPIPE))).end_quietly()
    _make(monkeypatch, None).end_quietly()  # gone
    assert sent == []
