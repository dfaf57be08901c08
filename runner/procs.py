"""Child processes that start, answer on a port, and stop cleanly."""

from __future__ import annotations

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


class StartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    ) -> None:
        """``stdout``: the child writes to our own stdout (a container's log), not the file."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(os.devnull if stdout else log_path, "ab")  # noqa: SIM115 - stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=None if stdout else self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_until(self, ready, timeout: float = 20.0, what: str = "ready") -> None:
        """Poll ``ready()`` until true; fail with the log if the process dies or time runs out."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive():
                raise StartError(
                    f"{self.name} exited ({self.popen.returncode}):\n{self.log_tail()}"
                )
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise StartError(f"{self.name} not {what} after {timeout}s:\n{self.log_tail()}")

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

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        try:
            if self.alive():
                self.send_signal(sig)
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
