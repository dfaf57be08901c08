"""SIGTERM to `make run` (what systemd, the container and Kubernetes send): the instance turns
unready while it still serves, and says so until it is gone.

Watched from outside, as a balancer would: a fresh connection to the public port every
0.1 s asks ``/readyz`` and makes one short call, while a stream that began before the
SIGTERM runs on. Held: the stream finishes whole; every ``/readyz`` from the SIGTERM until
gunicorn is gone answers 503 ``"draining": true`` (before, nginx quit at once and
`/readyz` was a refused connect while the stream still ran); the short calls of the first
LLMGATE_DRAIN_DELAY_S are served; no call gets a refused connect or a 502 while gunicorn
lives (a call gunicorn no longer takes is nginx's 503 ``gateway_shutdown``)."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import urllib3
from urllib3.exceptions import HTTPError

from tests.conftest import require_binary
from tests.support.calls import call
from tests.support.runner_cli import Runner, alive, descendants

DELAY_S = 2


@dataclass
class Poll:
    at: float  # seconds after the SIGTERM
    gunicorn_alive: bool  # after both answers came
    readyz: int | str  # the status, or "refused"
    draining: bool | None  # /readyz's checks.draining
    call: int | str  # a short chat call: the status, or "refused"
    code: str | None  # its error code, if any


def _get(http: urllib3.PoolManager, method: str, url: str, body: bytes | None = None):
    headers = {"Connection": "close", "Content-Type": "application/json"}
    try:
        resp = http.request(method, url, body=body, headers=headers, timeout=5)
    except HTTPError:
        return "refused", None
    try:
        return resp.status, json.loads(resp.data)
    except ValueError:
        return resp.status, None


def _gunicorn_master(runner_pid: int) -> int:
    for pid in descendants(runner_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        # The runner's own child; gunicorn names itself "gunicorn: master [llmgate]" when
        # setproctitle is installed, else its command is "python -m gunicorn -c ...".
        if parent == runner_pid and (b"gunicorn: master" in command or b"\0gunicorn\0" in command):
            return pid
    raise AssertionError("no gunicorn master under the runner")


@pytest.mark.slow
def test_sigterm_keeps_readyz_answering_503_while_a_stream_finishes(runs_dir) -> None:
    require_binary("nginx")
    settings = {"LLMGATE_DRAIN_DELAY_S": str(DELAY_S), "LLMGATE_GRACEFUL_TIMEOUT_S": "30"}
    http = urllib3.PoolManager(retries=False)
    with Runner(runs_dir / "drain", **settings) as run:
        assert _get(http, "GET", run.url + "/readyz")[0] == 200
        gunicorn = _gunicorn_master(run.proc.pid)
        result: dict = {}
        slow = {"x-sim-tps": "10", "x-sim-ttft-ms": "0"}  # 50 tokens: ~5 s
        stream = threading.Thread(
            target=lambda: result.update(
                out=call(http, run.url, "drain me", 50, stream=True, headers=slow)
            )
        )
        stream.start()
        time.sleep(1.0)
        run.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        body = json.dumps(
            {"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        ).encode()
        polls: list[Poll] = []
        while run.proc.poll() is None and time.monotonic() - sent < 60:
            at = time.monotonic() - sent
            ready, doc = _get(http, "GET", run.url + "/readyz")
            answered, error = _get(http, "POST", run.url + "/v1/chat/completions", body)
            polls.append(
                Poll(
                    at=at,
                    gunicorn_alive=alive(gunicorn),  # after both answers: alive throughout
                    readyz=ready,
                    draining=(doc or {}).get("checks", {}).get("draining"),
                    call=answered,
                    code=((error or {}).get("error") or {}).get("code"),
                )
            )
            time.sleep(0.1)
        stream.join(30)
    assert run.returncode == 0, run.rest
    assert result["out"].kind == "ok", str(result["out"])  # the whole text, then [DONE]
    assert "llmgate: draining" in run.rest, run.rest
    shown = "\n".join(map(str, polls))
    # The first few ms after the kill may come before the runner's signal handler ran.
    while_up = [p for p in polls if p.gunicorn_alive and p.at >= 0.1]
    # The stream ran ~4 s past the SIGTERM: many polls fell while gunicorn still served it.
    assert len(while_up) >= 10, shown
    assert all(p.readyz == 503 and p.draining is True for p in while_up), shown
    # Served as before during the delay (a balancer has not noticed yet) ...
    in_delay = [p for p in while_up if p.at < DELAY_S - 0.5]
    assert in_delay and all(p.call == 200 for p in in_delay), shown
    # ... and afterwards served, or refused as a retryable 503: never a refused connect.
    for p in while_up:
        assert p.call == 200 or (p.call == 503 and p.code == "gateway_shutdown"), shown
    # The drain began after the delay: gunicorn outlived it.
    assert max(p.at for p in while_up) > DELAY_S, shown
