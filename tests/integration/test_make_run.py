"""`make run`'s entry point end to end: up on the asked port, answers, and Ctrl-C stops all."""

from __future__ import annotations

import json
import time

import pytest
import urllib3

from tests.conftest import require_binary
from tests.support.runner_cli import (
    STREAM_BODY,
    Runner,
    alive,
    curl_stream,
    descendants,
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
