"""The container's command (deploy/Dockerfile: `python -m runner`, `make run`'s) with the
image's own settings, on loopback: it serves through nginx, logs on its stdout, and on
SIGTERM (what Kubernetes sends after the preStop hook) drains: a stream in flight finishes
whole, then every process exits. No Docker daemon needed: the same command, the same env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import urllib3

from runner.procs import free_port
from tests.conftest import ROOT, require_binary
from tests.deploy.support import dockerfile, env_pairs, exec_form
from tests.support.calls import call


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in dockerfile():
        if word == "ENV":
            env.update(env_pairs(args))
    return env


@pytest.mark.slow
def test_the_image_command_serves_and_drains_a_stream_on_sigterm(runs_dir) -> None:
    require_binary("nginx")
    command = next(exec_form(a) for w, a in dockerfile() if w == "CMD")
    image = image_env()
    port, app_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
    env.update(image)
    # The image's values where a shared machine needs others: free ports, loopback only.
    env.update(
        LLMGATE_HOST="127.0.0.1",
        LLMGATE_PORT=str(port),
        LLMGATE_TLS_PORT=str(free_port()),  # not the image's 8443: others may hold it
        LLMGATE_BIND=f"127.0.0.1:{app_port}",
        LLMGATE_RUN_DIR=str(runs_dir / "container"),
        LLMGATE_GRACEFUL_TIMEOUT_S="15",
        LLMGATE_CACHE_MODE="off",
        PYTHONPATH=str(ROOT),
    )
    assert image["LLMGATE_LOG_TO_STDOUT"] == "true"
    argv = [sys.executable, *command[1:]]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    http = urllib3.PoolManager(retries=False)
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        reader.start()
        # gunicorn answers on its fixed address too (the liveness probe). Like the kubelet's
        # probes, without keep-alive: an idle keep-alive connection holds a draining gunicorn
        # worker until LLMGATE_GRACEFUL_TIMEOUT_S (gunicorn counts it as a request).
        probe = http.request(
            "GET", f"http://127.0.0.1:{app_port}/healthz", headers={"Connection": "close"}
        )
        assert probe.status == 200
        assert http.request("GET", url + "/readyz").status == 200
        result: dict = {}
        slow = {"x-sim-tps": "10", "x-sim-ttft-ms": "0"}  # 30 tokens: ~3 s
        stream = threading.Thread(
            target=lambda: result.update(
                out=call(http, url, "drain me", 30, stream=True, headers=slow, timeout_s=30)
            )
        )
        stream.start()
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stream.join(30)
        assert result["out"].kind == "ok", (str(result["out"]), "".join(lines)[-3000:])
        assert proc.wait(30) == 0
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    reader.join(5)
    if proc.stdout is not None:
        proc.stdout.close()
    text = "".join(lines)
    assert "draining" in text
    # The children's logs went to the container's stdout: gunicorn's and nginx's lines.
    assert "Booting worker" in text, text[-2000:]
    assert '"path":"/v1/chat/completions"' in text, text[-2000:]
    assert took < 15, took  # waited for the stream, not the whole graceful timeout
    assert json.loads(json.dumps(image))  # the env is plain strings
