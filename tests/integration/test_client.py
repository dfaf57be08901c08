"""Acceptance tests of the sync client against the whole stack on loopback.

nginx -> gunicorn (gevent) -> gateway -> simulator, with the gateway's own retries off
(`LLMGATE_RETRIES=0`) so the client's retry and deadline logic is what these tests see; the
simulator's ``/sim/stats`` (reset before each test) counts what reached the upstream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llmgate_client import (
    APITimeoutError,
    Client,
    DeadlineExceeded,
    IncompleteStreamError,
    InternalServerError,
    RetryPolicy,
    ServiceUnavailableError,
    StreamError,
    Timeout,
)
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
QUICK = RetryPolicy(max_retries=3, backoff_initial=0.02, backoff_max=0.1)


class SimView:
    """The stack's simulator counters, under the names these tests use."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def stats(self) -> dict:
        return self.handle.sim_stats()

    def reset(self) -> None:
        self.handle.sim_reset()


@pytest.fixture(scope="module")
def stack(make_stack):
    return make_stack(
        # No spare upstream connections: the simulator's count of connections is then the
        # client's concurrency (test_hundred_threads_thousand_calls_one_bounded_pool).
        env={"LLMGATE_RETRIES": "0", "LLMGATE_POOL_SPARE_RATIO": "0"},
        memcached=False,
        simulator_args=["--ttft-ms", "0", "--tps", "2000"],
    )


@pytest.fixture(scope="module")
def sim(stack) -> SimView:
    return SimView(stack)


@pytest.fixture(scope="module")
def client_base_url(stack) -> str:
    return stack.url


@pytest.fixture(autouse=True)
def fresh_stats(sim: SimView) -> None:
    sim.reset()


def test_hundred_threads_thousand_calls_one_bounded_pool(
    client_base_url: str, sim: SimView
) -> None:
    pool_size = 16
    failures: list[BaseException] = []
    done = [0]
    lock = threading.Lock()
    with Client(client_base_url, "sk-test", pool_size=pool_size, retries=0) as client:

        def worker(n: int) -> None:
            try:
                for i in range(10):
                    if (n + i) % 2:
                        text = "".join(client.chat_stream("hi", model="sim/tokens=3").text_deltas())
                    else:
                        text = client.chat("hi", model="sim/tokens=3").text or ""
                    assert len(text.split()) == 3
                    with lock:
                        done[0] += 1
            except BaseException as exc:  # collected for the assert below
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    stats = sim.stats()
    assert failures == []
    assert done[0] == 1000 and stats["requests"] == 1000
    assert stats["streams_completed"] == 500 and stats["streams_abandoned"] == 0
    assert stats["connections_accepted"] <= pool_size


def test_total_deadline_holds_across_retries(client_base_url: str, sim: SimView) -> None:
    policy = RetryPolicy(max_retries=1000, backoff_initial=0.05, backoff_max=0.2)
    spec = Timeout(connect=1, read=5, total=2.0)
    forever_503 = {"x-sim-fault": "503", "x-sim-retry-after": "0.2"}
    with Client(client_base_url, "k", retries=policy, timeout=spec) as client:
        started = time.monotonic()
        with pytest.raises((ServiceUnavailableError, DeadlineExceeded)) as info:
            client.chat("hi", model="m", extra_headers=forever_503)
        elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 0.5
    assert 3 <= info.value.attempts < 1000
    assert sim.stats()["requests"] == info.value.attempts


def test_fail_then_succeed_reports_attempts(client_base_url: str, sim: SimView) -> None:
    flaky = {
        "x-sim-fault": "503",
        "x-sim-fail-times": "2",
        "x-sim-fail-key": "flaky-1",
        "x-sim-retry-after": "0.05",
    }
    with Client(client_base_url, "k", retries=QUICK) as client:
        result = client.chat("hi", model="sim/tokens=2", extra_headers=flaky)
    assert result.attempts == 3 and result.text
    assert sim.stats()["requests"] == 3


def test_stream_is_never_retried_after_it_started(client_base_url: str, sim: SimView) -> None:
    with Client(client_base_url, "k", retries=QUICK) as client:
        stream = client.chat_stream(
            "hi", model="sim/tokens=50", extra_headers={"x-sim-fault": "reset"}
        )
        # The gateway turns the upstream's reset into a final error event.
        with pytest.raises((IncompleteStreamError, StreamError)):
            list(stream)
    assert sim.stats()["requests"] == 1


def test_breaking_out_of_a_stream_releases_the_connection(
    client_base_url: str, sim: SimView
) -> None:
    with Client(client_base_url, "k", pool_size=1, timeout=10) as client:
        received = []
        for piece in client.chat_stream("hi", model="sim/tokens=2000,tps=100").text_deltas():
            received.append(piece)
            if len(received) == 3:
                break
        assert wait_for(lambda: sim.stats()["streams_abandoned"] == 1)
        # the only pooled connection is free again: this does not wait for the old stream
        assert client.chat("hi", model="sim/tokens=2", timeout=3).text
    stats = sim.stats()
    assert stats["streams_completed"] == 0 and stats["connections_accepted"] <= 2


def test_idle_timeout_on_a_stalled_stream(client_base_url: str, sim: SimView) -> None:
    spec = Timeout(connect=1, read=0.5, total=10)
    with Client(client_base_url, "k", timeout=spec) as client:
        stream = client.chat_stream(
            "hi", model="sim/tokens=20", extra_headers={"x-sim-fault": "stall-after"}
        )
        started = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            list(stream)
        assert time.monotonic() - started < 3
    assert not isinstance(info.value, DeadlineExceeded)
    assert stream.text  # tokens before the stall did arrive
    assert wait_for(lambda: sim.stats()["streams_abandoned"] == 1)


def test_map_keeps_order_reports_errors_and_bounds_workers(
    client_base_url: str, sim: SimView
) -> None:
    requests = []
    for n in range(40):
        model = "sim/fault=500" if n % 9 == 4 else f"sim/tokens={1 + n % 5},ttft_ms={40 - n}"
        requests.append({"model": model, "messages": [{"role": "user", "content": f"q{n}"}]})
    progress: list[int] = []
    with Client(client_base_url, "k", pool_size=32, retries=QUICK) as client:
        outcomes = client.map(requests, max_workers=4, progress=lambda d, t, o: progress.append(d))
    assert [o.index for o in outcomes] == list(range(40))
    for n, outcome in enumerate(outcomes):
        if n % 9 == 4:
            assert isinstance(outcome.error, InternalServerError) and outcome.attempts == 1
        else:
            assert outcome.ok and outcome.result is not None
            assert len((outcome.result.text or "").split()) == 1 + n % 5
    assert progress == list(range(1, 41))
    assert sim.stats()["connections_accepted"] <= 4


def test_map_deadline_stops_new_work(client_base_url: str, sim: SimView) -> None:
    slow = {"model": "sim/ttft_ms=300,tokens=1", "messages": [{"role": "user", "content": "x"}]}
    with Client(client_base_url, "k", pool_size=2) as client:
        started = time.monotonic()
        outcomes = client.map([slow] * 20, deadline=0.8)
        assert time.monotonic() - started < 0.8 + 1.0
    started_calls = [o for o in outcomes if o.attempts > 0]
    assert len(outcomes) == 20 and 2 <= len(started_calls) < 20
    assert all(isinstance(o.error, DeadlineExceeded) for o in outcomes if o.attempts == 0)
    assert sim.stats()["requests"] == len(started_calls)


def _cli_env(base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGATE_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), OPENAI_BASE_URL=base_url + "/v1", OPENAI_API_KEY="sk-x")
    return env


def test_cli_chat_streams_incrementally(client_base_url: str, sim: SimView) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgate_client", "chat", "hello", "--model", "sim/tokens=6,tps=4"],
        env=_cli_env(client_base_url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    arrivals: list[tuple[float, bytes]] = []
    while data := os.read(proc.stdout.fileno(), 4096):
        arrivals.append((time.monotonic(), data))
    proc.wait(timeout=10)
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == 0, stderr
    words = b"".join(d for _, d in arrivals).split()
    assert len(words) == 6
    # six tokens at 4 tokens/s: about 1.25 s between the first and the last on the server
    assert len(arrivals) >= 4
    assert arrivals[-1][0] - arrivals[0][0] > 0.6
    assert sim.stats()["streams_completed"] == 1


def test_cli_batch_against_the_simulator(
    client_base_url: str, sim: SimView, tmp_path: Path
) -> None:
    lines = []
    for n in range(25):
        model = "sim/fault=401" if n == 7 else "sim/tokens=2"
        lines.append(
            json.dumps({"model": model, "messages": [{"role": "user", "content": str(n)}]})
        )
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "llmgate_client", "batch", str(src), str(dst), "--workers", "5"],
        env=_cli_env(client_base_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    records = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, 26))
    assert [r["ok"] for r in records] == [n != 7 for n in range(25)]
    assert records[7]["error"]["status"] == 401
    assert "ok=24 failed=1" in proc.stderr and "p95=" in proc.stderr
    assert sim.stats()["connections_accepted"] <= 5
