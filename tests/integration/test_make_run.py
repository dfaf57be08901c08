"""`make run`'s entry point end to end: up on the asked port, answers, and Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import urllib3

from runner.procs import free_port
from tests.conftest import ROOT, require_binary


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _curl_stream(url: str, body: dict) -> list[tuple[float, bytes]]:
    """``curl -N``'s output lines with the moment each arrived, as a user would watch them."""
    curl = require_binary("curl")
    argv = [curl, "-N", "-s", "-H", "Content-Type: application/json", "-d", json.dumps(body), url]
    lines = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line))
    return lines


# `make run` and `make run-cluster` (the same runner with more instances and Memcached nodes).
RUNS = {"run": [], "run-cluster": ["--instances", "2", "--memcached-nodes", "2"]}


@pytest.mark.parametrize("make_target", list(RUNS))
def test_run_serves_then_stops_every_child_on_ctrl_c(runs_dir, make_target) -> None:
    require_binary("nginx")
    require_binary("memcached")
    port = free_port()
    run_dir = str(runs_dir / make_target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
    # A free HTTPS port too: a `make run` of someone else's may hold the default 8443.
    env.update(LLMGATE_PORT=str(port), LLMGATE_TLS_PORT=str(free_port()), LLMGATE_RUN_DIR=run_dir,
               PYTHONPATH=str(ROOT))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *RUNS[make_target]],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    banner: list[str] = []
    children: set[int] = set()
    try:
        for line in proc.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        text = "".join(banner)
        assert f"llmgate is running on http://127.0.0.1:{port}" in text, text
        assert "curl -N" in text
        http = urllib3.PoolManager(retries=False)
        body = {
            "model": "sim-model",
            "stream": True,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello"}],
        }
        resp = http.request(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status == 200 and resp.data.endswith(b"data: [DONE]\n\n")
        # Token by token through nginx, as `curl -N` shows it: 20 tokens at the simulator's
        # 100 tokens/s arrive over ~0.2 s, not in one piece at the end.
        lines = _curl_stream(
            f"http://127.0.0.1:{port}/v1/chat/completions", {**body, "max_tokens": 20}
        )
        tokens = [
            at for at, line in lines if b'"content":"' in line and b'"content":""' not in line
        ]
        assert len(tokens) == 20 and [line for _, line in lines][-2:] == [b"data: [DONE]\n", b"\n"]
        assert tokens[-1] - tokens[0] >= 0.1, "the tokens arrived together"
        ready = http.request("GET", f"http://127.0.0.1:{port}/readyz").json()
        assert ready["ready"] and ready["checks"]["memcached"]["ok"]
        children = _descendants(proc.pid)
        assert len(children) >= 4  # memcached, simulator, gunicorn (+ workers), nginx
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, rest
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)], "children outlived Ctrl-C"
