"""`make run`'s command as a user starts it, and `curl -N` as a user watches a stream.

``Runner`` starts ``python -m runner`` with a clean LLMGATE_* environment on free ports
(the HTTPS one too: another `make run` on the machine may hold the default 8443), reads its
banner up to "Ctrl-C stops everything", and on leaving sends SIGINT and keeps what it printed
after and its exit code. ``run_refused`` runs one that should not start, to its end.
``curl_stream`` runs curl and notes when each line arrived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from runner.procs import free_port
from tests.conftest import ROOT, require_binary

STREAM_BODY = {
    "model": "sim-model",
    "stream": True,
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "hello"}],
}


def runner_env(run_dir: Path, port: int, tls_port: int, **settings: str) -> dict[str, str]:
    """Our environment without its LLMGATE_* variables, then the runner's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
    env.update(LLMGATE_PORT=str(port), LLMGATE_TLS_PORT=str(tls_port),
               LLMGATE_RUN_DIR=str(run_dir), PYTHONPATH=str(ROOT))  # fmt: skip
    return {**env, **settings}


class Runner:
    def __init__(self, run_dir: Path, *args: str, **settings: str) -> None:
        self.port, self.tls_port = free_port(), free_port()
        env = runner_env(run_dir, self.port, self.tls_port, **settings)
        self.run_dir = run_dir
        self.argv = [sys.executable, "-m", "runner", *args]
        self.env = env
        self.banner = self.rest = ""
        self.returncode: int | None = None

    def __enter__(self) -> Runner:
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        self.banner = "".join(lines)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.rest = self.proc.communicate(timeout=30)[0]
        self.returncode = self.proc.returncode

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Refused:
    returncode: int | None = None  # None: still running after the wait (it started)
    seconds: float = 0.0  # until it ended, or the wait
    output: str = ""  # everything it printed (known once the block is left)


@contextmanager
def run_refused(env: dict[str, str], wait_s: float = 15.0) -> Iterator[Refused]:
    """``python -m runner`` with ``env``, expected to give up: waits up to ``wait_s`` for its
    end, then runs the block (one that started after all is still serving during it), then
    stops it if it runs (Ctrl-C, which stops its children) and keeps what it printed."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "runner"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    result = Refused()
    try:
        result.returncode = proc.wait(timeout=wait_s)
        result.seconds = time.monotonic() - started
    except subprocess.TimeoutExpired:
        result.seconds = wait_s
    try:
        yield result
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        result.output = proc.communicate(timeout=30)[0]


def descendants(root: int) -> set[int]:
    """Every process below ``root`` (children, grandchildren, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def curl_stream(url: str, *options: str, body: dict = STREAM_BODY) -> list[tuple[float, bytes]]:
    """``curl -N`` posting ``body`` to ``url``: its output lines with the moment each arrived."""
    curl = require_binary("curl")
    argv = [curl, "-N", "-s", *options, "-H", "Content-Type: application/json",
            "-d", json.dumps(body), url]  # fmt: skip
    lines = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line))
    return lines


def token_arrivals(lines: list[tuple[float, bytes]]) -> list[float]:
    """When each content token of a chat stream arrived (the role chunk's empty one aside)."""
    return [at for at, line in lines if b'"content":"' in line and b'"content":""' not in line]
