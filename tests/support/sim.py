"""The simulator as a subprocess, for tests and benchmarks. No pytest here.

``SimProcess`` runs ``python -m simulator --port 0`` and reads its one "listening" line, so
it never races on a port it picked itself and never polls; if the process dies or stays
silent for ``startup_timeout`` seconds the error carries its stderr. The control helpers
(``stats``, ``reset``, ``requests``) use http.client on a fresh connection each time, so they
never share a socket, or a keep-alive count, with the traffic under test; ``send`` is the
same request for the traffic under test, its whole answer whatever the status.

``start_simulator`` starts one as the stack's processes are started (runner/procs.py), its
log beside theirs, kept with the run's logs when a test fails; ``sim_stats`` and
``sim_requests`` read any simulator's counters by its URL.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import urllib3

from runner.procs import Proc, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"^simulator listening on (http://([^\s:/]+):(\d+))$")


class SimProcess:
    """One simulator process on loopback; a context manager that stops it on exit."""

    def __init__(
        self,
        *extra_args: str,
        host: str = "127.0.0.1",
        ttft_ms: float | None = None,
        tps: float | None = None,
        require_key: str | None = None,
        startup_timeout: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [sys.executable, "-m", "simulator", "--host", host, "--port", "0"]
        if ttft_ms is not None:
            self.argv += ["--ttft-ms", str(ttft_ms)]
        if tps is not None:
            self.argv += ["--tps", str(tps)]
        if require_key is not None:
            self.argv += ["--require-key", require_key]
        self.argv += list(extra_args)
        self.startup_timeout = startup_timeout
        self.env = env
        self.url = ""
        self.host = host
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def start(self) -> SimProcess:
        if self._proc is not None:
            raise RuntimeError("simulator already started")
        # A file, not a pipe: it can never fill up and block the simulator. Closed in stop().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.argv,
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        try:
            line = self._read_listening_line()
        except BaseException:
            self.stop()
            raise
        match = _LISTENING.match(line)
        if match is None:
            error = self._failure(f"unexpected first line {line!r}")
            self.stop()
            raise error
        self.url, self.host, self.port = match[1], match[2], int(match[3])
        return self

    def _read_listening_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + self.startup_timeout
        buf = b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._failure(f"no listening line within {self.startup_timeout} s")
                if not selector.select(remaining):
                    continue
                data = os.read(fd, 4096)
                if not data:
                    self._proc.wait(timeout=5)
                    raise self._failure(f"exited with status {self._proc.returncode}")
                buf += data
        return buf.split(b"\n", 1)[0].decode(errors="replace").strip()

    def _failure(self, reason: str) -> RuntimeError:
        return RuntimeError(f"simulator failed to start: {reason}\nstderr:\n{self.stderr()}")

    def stderr(self) -> str:
        """Everything the process wrote to stderr so far."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, wait ``timeout`` s, then SIGKILL; the exit status (None if never started)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return proc.returncode

    def __enter__(self) -> SimProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def send(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection, whatever its answer: the status, the headers
        (their names in lower case) and the body. ``body``: bytes as they are, else JSON."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            payload = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
            conn.request(method, path, body=payload, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request on a fresh connection; the JSON answer (raises on a non-2xx status)."""
        headers = {"content-type": "application/json"} if body is not None else {}
        status, _, data = self.send(method, path, body, headers)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path} -> {status}: {data[:500]!r}")
        return json.loads(data)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", "/sim/stats")
        return result

    def reset(self) -> None:
        self.call("POST", "/sim/reset")

    def requests(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/sim/requests")
        return result


_http = urllib3.PoolManager(retries=False)


def start_simulator(log_dir: Path, *args: str) -> tuple[Proc, str]:
    """A simulator on a free port (``args``: more of its options, e.g. "--ttft-ms", "2000");
    the process (the caller stops it) and its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port), *args]
    log_path = log_dir / f"simulator-{port}.log"
    proc = Proc(f"simulator-{port}", argv, log_path=log_path, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/healthz")
    except Exception:
        proc.stop()
        raise
    return proc, url


def sim_stats(url: str) -> dict:
    """The counters of the simulator at ``url`` (/sim/stats)."""
    return json.loads(_http.request("GET", url + "/sim/stats").data)


def sim_requests(url: str) -> list[dict]:
    """The requests the simulator at ``url`` received, oldest first (/sim/requests)."""
    return json.loads(_http.request("GET", url + "/sim/requests").data)
