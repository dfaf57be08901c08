"""Child processes that start, answer on a port, and stop cleanly.

A child's log file is appended to across runs and keeps everything; what a failure reports
is this run's output only, and of it the one line that says why (``cause``): a start that
fails ends with its cause, not with the last lines of an older run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")


# How much of the end of this run's output is searched for the cause.
TAIL_BYTES = 64 * 1024


class StartError(RuntimeError):
    """Why the stack could not start (or a child died), in one line. ``log`` is the file
    with the whole story, when there is one."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


# The ports free_port() handed out, each held bound until this process ends.
_reserved: list[socket.socket] = []


def free_port() -> int:
    """A loopback port for a child to listen on, picked by the kernel and reserved for as long
    as this process lives: the socket stays bound, not listening, with SO_REUSEADDR. A bind to
    port 0 anywhere on the machine skips a bound port and a bind without SO_REUSEADDR is
    refused, so no other program is given it, while the child it is meant for binds and
    listens (nginx, gunicorn, Memcached and the simulator all set SO_REUSEADDR; a connection
    to the port is refused until then). Closed at once, the port was free until the child
    bound it, a second or two for a whole runner, and test processes running side by side
    were handed the same one: a runner's nginx could not bind its port, and its start passed
    on another stack's /healthz."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    if not _reserved:
        atexit.register(_release_ports)
    _reserved.append(sock)
    return sock.getsockname()[1]


def _release_ports() -> None:
    while _reserved:
        _reserved.pop().close()


def find_binary(name: str) -> str | None:
    """A binary on PATH or in the sbin directories a non-login root shell may not list."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN_DIRS:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


class Proc:
    """A child process with its output in a log file; stops its whole process group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdout: bool = False,
        user: str | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        """``stdout``: the child writes to our own stdout (a container's log), not the file;
        ``user``: the user it runs as (we are root; PostgreSQL refuses to run as root);
        ``stop_signal``: what ``stop`` sends it by default."""
        self.name = name
        self.stop_signal = stop_signal
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Where this run's output begins in the log (earlier runs' stays above it).
        self._log_start = 0 if stdout or not log_path.exists() else log_path.stat().st_size
        self._stdout = stdout
        self._log = open(os.devnull if stdout else log_path, "ab")  # noqa: SIM115 - stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=None if stdout else self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            user=user,
        )

    def output(self) -> list[str]:
        """The end of what this process wrote to its log (nothing when it writes to our
        stdout: it is already there)."""
        if self._stdout:
            return []
        try:
            with open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self._log_start, size - TAIL_BYTES))
                return log.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def failure(self, what: str) -> StartError:
        """``what`` happened to this process, with the cause its output gives."""
        why = cause(self.output())
        return StartError(
            f"{self.name} {what}" + (f": {why}" if why else ""),
            log=None if self._stdout else self.log_path,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_until(self, ready, timeout: float = 20.0, what: str = "ready") -> None:
        """Poll ``ready()`` until true; fail with the log if the process dies or time runs out."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive():
                raise self.failure(f"exited ({self.popen.returncode})")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise self.failure(f"not {what} after {timeout:g} s")

    def wait_port(self, port: int, host: str = "127.0.0.1", timeout: float = 20.0) -> None:
        def listening() -> bool:
            with socket.create_connection((host, port), timeout=0.5):
                return True

        self.wait_until(listening, timeout, f"listening on {host}:{port}")

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        def answers() -> bool:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self.wait_until(answers, timeout, f"answering {url}")

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0, sig: int | None = None) -> int | None:
        try:
            if self.alive():
                self.send_signal(self.stop_signal if sig is None else sig)
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.send_signal(signal.SIGKILL)
                    self.popen.wait(5)
        except ProcessLookupError:
            pass
        finally:
            self._log.close()
        return self.popen.returncode

    def kill(self) -> int | None:
        """SIGKILL the whole group and reap it: for a process whose way of stopping nobody
        looks at (a test's own Memcached at its end). A SIGTERM costs up to a second here:
        Memcached acts on it at its next clock tick, gunicorn's gevent workers at their next
        one-second nap."""
        return self.stop(sig=signal.SIGKILL)


def cause(lines: list[str]) -> str:
    """The line of a failed process's output that says why: the exception of its last
    Python traceback (gunicorn goes on logging after a worker's, down to "Reason: Worker
    failed to boot."), else its last line; our own "llmgate: " prefix dropped."""
    lines = [line.rstrip() for line in lines if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if starts:
        after = lines[starts[-1] + 1 :]
        found = next((line for line in after if not line.startswith((" ", "\t"))), "")
        if found:
            return found
    return lines[-1].removeprefix("llmgate: ") if lines else ""
