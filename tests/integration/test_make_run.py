"""`make run`'s entry point end to end: up on the asked port, answers, and Ctrl-C stops all;
through make itself, a SIGINT to make alone stops all too, and a refusal is the last line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
import urllib3

from runner.procs import free_port
from tests.conftest import ROOT, require_binary
from tests.support.runner_cli import (
    STREAM_BODY,
    Runner,
    alive,
    curl_stream,
    descendants,
    runner_env,
    token_arrivals,
)

# `make run` and `make run-cluster` (the same runner with more instances and Memcached nodes).
RUNS = {"run": [], "run-cluster": ["--instances", "2", "--memcached-nodes", "2"]}


@pytest.mark.parametrize("make_target", list(RUNS))
def test_run_serves_then_stops_every_child_on_ctrl_c(runs_dir, make_target) -> None:
    require_binary("nginx")
    require_binary("memcached")
    children: set[int] = set()
    with Runner(runs_dir / make_target, *RUNS[make_target]) as run:
        assert f"llmgate is running on {run.url}" in run.banner, run.banner
        assert "curl -N" in run.banner
        http = urllib3.PoolManager(retries=False)
        body = {**STREAM_BODY, "max_tokens": 3}
        resp = http.request(
            "POST",
            run.url + "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status == 200 and resp.data.endswith(b"data: [DONE]\n\n")
        # Token by token through nginx, as `curl -N` shows it: 20 tokens at the simulator's
        # 100 tokens/s arrive over ~0.2 s, not in one piece at the end.
        lines = curl_stream(run.url + "/v1/chat/completions")
        tokens = token_arrivals(lines)
        assert len(tokens) == 20 and [line for _, line in lines][-2:] == [b"data: [DONE]\n", b"\n"]
        assert tokens[-1] - tokens[0] >= 0.1, "the tokens arrived together"
        ready = http.request("GET", run.url + "/readyz").json()
        assert ready["ready"] and ready["checks"]["memcached"]["ok"]
        children = descendants(run.proc.pid)
        assert len(children) >= 4  # memcached, simulator, gunicorn (+ workers), nginx
    assert run.returncode == 0, run.rest
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)], "children outlived Ctrl-C"


def test_run_warns_at_start_when_the_upstream_name_does_not_resolve(runs_dir) -> None:
    """It starts (the name may resolve later), says so before the banner, and a call's
    error names the host, as docs/troubleshooting.md shows."""
    require_binary("nginx")
    url = "https://no-such-host.invalid/v1"
    settings = {"LLMGATE_UPSTREAM_URL": url, "LLMGATE_RETRIES": "0"}
    with Runner(runs_dir / "unresolved", **settings) as run:
        before = run.banner.split("llmgate is running on", 1)[0]
        assert (
            "llmgate: warning: upstream default: host no-such-host.invalid does not resolve ("
            in before
        ), run.banner
        http = urllib3.PoolManager(retries=False)
        resp = http.request(
            "POST",
            run.url + "/v1/chat/completions",
            body=json.dumps({**STREAM_BODY, "stream": False}),
            headers={"Content-Type": "application/json"},
        )
        error = resp.json()["error"]
        assert (resp.status, error["code"]) == (502, "upstream_unreachable"), resp.data
        assert "Failed to resolve 'no-such-host.invalid'" in error["message"], error
    assert run.returncode == 0, run.rest


def _make_run(run_dir, **settings: str) -> subprocess.Popen[str]:
    """`make run` as a user types it (make, then the runner as its child), its output read
    here; the runner's settings as Runner gives them, on free ports."""
    require_binary("make")
    env = runner_env(run_dir, free_port(), free_port(), **settings)
    env.pop("MAKEFLAGS", None)
    env.pop("MAKELEVEL", None)
    return subprocess.Popen(["make", "run"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def test_a_refusal_through_make_is_the_last_line_and_the_exit_is_not_zero(runs_dir) -> None:
    with _make_run(runs_dir / "make-refused", LLMGATE_PORT="abc") as make:
        output = make.communicate(timeout=60)[0]
    assert output.splitlines()[-1] == (
        "llmgate: could not start: LLMGATE_PORT must be a whole number between 1 and 65535, "
        "got 'abc'"
    ), output
    assert "make:" not in output, output  # make's own "*** [Makefile:…: run] Error 1"
    assert make.returncode != 0


def test_sigint_to_makes_own_pid_stops_every_process(runs_dir) -> None:
    """Not to its process group (a terminal's Ctrl-C reaches every process of it): to make
    alone, as `kill -INT <pid>` or a supervisor sends it. make waits for the runner."""
    require_binary("nginx")
    require_binary("memcached")
    with _make_run(runs_dir / "make-sigint") as make:
        assert make.stdout is not None
        banner = []
        for line in make.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        url = next(line.split()[-1] for line in banner if "llmgate is running on" in line)
        processes = descendants(make.pid)
        assert len(processes) >= 5, banner  # runner, memcached, simulator, gunicorn, nginx
        os.kill(make.pid, signal.SIGINT)
        try:
            make.wait(timeout=30)
        finally:
            for pid in processes:  # whatever the runner left, so no test leaves it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        rest = make.communicate(timeout=10)[0]
    assert "llmgate: stopping" in rest, rest
    left = [pid for pid in processes if alive(pid)]
    assert not left, f"outlived make's SIGINT: {left}"
    with pytest.raises(urllib3.exceptions.NewConnectionError):  # its port freed
        urllib3.PoolManager(retries=False).request("GET", url + "/healthz")
