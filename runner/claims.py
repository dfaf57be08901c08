"""One gateway per port and per run directory, claimed before anything starts.

nginx listens with ``reuseport`` (each worker its own accept queue), and Linux lets any
later socket of the same user with that option join the port: a second `make run` on a
taken port used to start without complaint and take every other connection. So each fixed
port the stack will listen on is, before any child starts:

- claimed among llmgates: an abstract Unix socket named after the port, which the kernel
  frees when the runner ends however it ends (no file left behind), so two runners started
  at the same moment cannot both pass;
- tried: a bind without SO_REUSEPORT fails while anything listens there (another server,
  or the nginx a killed runner left behind). SO_REUSEADDR is set so that the connections a
  previous run closed (TIME_WAIT) do not count, as nginx and gunicorn set it too.

The run directory is locked with flock (released by the kernel too): two runners there
would overwrite each other's nginx config, pid file, metrics and logs. A refusal is a
StartError of one line naming the port or directory and the setting that moves it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runner.procs import StartError

LOCK_FILE = "runner.lock"


@dataclass(frozen=True)
class Listener:
    """A fixed address the stack will listen on, and the setting that chose it."""

    host: str
    port: int
    setting: str  # the port's, e.g. LLMGATE_PORT
    host_setting: str = "LLMGATE_HOST"  # empty: the host is fixed (loopback)


class Claims:
    """The ports and run directory this runner holds until ``release``."""

    def __init__(self) -> None:
        self._held: list[socket.socket | IO[str]] = []

    def port(self, listener: Listener) -> None:
        def taken(by: str = "") -> str:
            return (
                f"port {listener.port} on {listener.host} is in use{by}; "
                f"set {listener.setting} to a free port"
            )

        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0llmgate-port-{listener.port}")
        except OSError as exc:
            claim.close()
            if exc.errno == errno.EADDRINUSE:
                raise StartError(taken(" by another llmgate")) from None
            raise
        self._held.append(claim)
        if not _bindable(listener):
            raise StartError(taken())

    def run_dir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
            lock = open(path / LOCK_FILE, "a+")  # noqa: SIM115 - held until release()
        except OSError as exc:
            raise StartError(
                f"LLMGATE_RUN_DIR {path} cannot be used: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            lock.close()
            raise StartError(
                f"run directory {path} is in use by another llmgate (pid {holder}); "
                "set LLMGATE_RUN_DIR to another directory"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._held.append(lock)

    def release(self) -> None:
        while self._held:
            self._held.pop().close()


def _bindable(listener: Listener) -> bool:
    """Whether a socket without SO_REUSEPORT can bind the address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((listener.host, listener.port))
        except socket.gaierror:
            raise StartError(
                f"{listener.host_setting} names {listener.host!r}, which does not resolve"
            ) from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            either = f" or {listener.host_setting}" if listener.host_setting else ""
            raise StartError(
                f"cannot listen on {listener.host}:{listener.port} ({exc.strerror}); "
                f"set {listener.setting}{either}"
            ) from None
    return True
