"""Kept event logs are bounded per worker in memory, measured from outside: the worker's RSS
from /proc while 20 large streams run at once, and what the simulator saw of a no-store call.

Scaled down from the case that found it (20 streams of 21-27 MB, the 8 MiB entry limit: the
worker grew by 710 MiB) so that it takes seconds: streams of ~2.6 MB, above a 2 MiB entry
limit as those were above theirs, and a 64 KiB stream buffer so that what every stream holds
anyway (its unread events) is small.

The margin: beyond the log budget, 20 streams hold their unread events (up to
LLMGATE_STREAM_BUFFER_BYTES of payload each, ~3x that in Python: ~4 MiB) and the allocator's
slack. With no logs at all (LLMGATE_LOG_MEMORY_BYTES=0, or no-store) the worker grew by 9-11
MiB here, and by 10-19 MiB with the 8 MiB budget; MARGIN_MIB is 20. Without the budget these
streams grew it by ~110 MiB.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import urllib3

MiB = 1024 * 1024
STREAMS = 20
TOKENS = 12_000  # ~2.6 MB of chat chunks from the simulator
BUDGET = 8 * MiB
MARGIN_MIB = 20
STATUS = "X-LLMGate-Cache"
SCALED = {
    "LLMGATE_CACHE_MODE": "all",
    "LLMGATE_CACHE_MAX_ENTRY_BYTES": str(2 * MiB),
    "LLMGATE_STREAM_BUFFER_BYTES": str(64 * 1024),
}


def _worker(gw) -> int:
    master = gw.stack.proc("gunicorn").popen.pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _status_kb(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith(field)).split()[1])


def _stream(http: urllib3.PoolManager, url: str, prompt: str, headers: dict) -> tuple:
    body = {"model": "sim-model", "stream": True, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    resp = http.request(
        "POST",
        url + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "x-sim-tps": "1000000",
            "x-sim-ttft-ms": "0",
            **headers,
        },
        preload_content=False,
    )
    size, tail = 0, b""
    for chunk in resp.stream(65536):
        size += len(chunk)
        tail = (tail + chunk)[-64:]
    return resp.status, resp.headers.get(STATUS), size, tail


@pytest.mark.slow
@pytest.mark.parametrize(
    ("budget", "headers", "bound_mib"),
    [
        pytest.param(BUDGET, {}, BUDGET // MiB + MARGIN_MIB, id="past-the-budget"),
        # A budget that would hold every log: no-store streams must keep none anyway.
        pytest.param(1 << 30, {"Cache-Control": "no-store"}, MARGIN_MIB, id="no-store"),
    ],
)
def test_20_large_streams_grow_the_worker_by_the_log_budget_at_most(
    make_stack, budget: int, headers: dict, bound_mib: int
) -> None:
    gw = make_stack(workers=1, memcached=False,
                    env={**SCALED, "LLMGATE_LOG_MEMORY_BYTES": str(budget)})  # fmt: skip
    gw.sim_reset()
    http = urllib3.PoolManager(maxsize=STREAMS, retries=False)
    _stream(http, gw.url, f"warm {uuid.uuid4().hex}", headers)  # the worker's own growth
    pid = _worker(gw)
    time.sleep(0.3)
    before = _status_kb(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts from now
    barrier = threading.Barrier(STREAMS)

    def one(i: int) -> tuple:
        barrier.wait(10)
        return _stream(http, gw.url, f"big {i} {uuid.uuid4().hex}", headers)

    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(one, range(STREAMS)))
    grown_mib = (_status_kb(pid, "VmHWM") - before) / 1024
    print(f"\nworker peak RSS grew {grown_mib:.1f} MiB over {STREAMS} streams of "
          f"{results[0][2] / MiB:.1f} MiB (bound {bound_mib} MiB)")  # fmt: skip
    assert all(r[0] == 200 and r[1] == "MISS" and r[3].endswith(b"data: [DONE]\n\n")
               for r in results), [r[:3] for r in results]  # fmt: skip
    assert all(r[2] > 2 * MiB for r in results)  # larger than an entry may be, as in the issue
    assert gw.sim_stats()["streams_completed"] == STREAMS + 1
    assert grown_mib <= bound_mib, f"worker peak RSS grew {grown_mib:.1f} MiB"
    if not headers:
        # The budget was what stopped the logs (none of these fits the entry limit either).
        refused = gw.metric("llmgate_event_logs_refused_total", default=0.0)
        assert refused >= 1, refused


def _chat(prompt: str) -> dict:
    return {"model": "sim-model", "stream": True, "temperature": 0, "max_tokens": 30,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip


def _call(gw, body: dict, headers: dict) -> tuple[str | None, bytes]:
    resp = gw.post("/v1/chat/completions", body, headers={"x-sim-tps": "20", **headers})
    return resp.headers.get(STATUS), resp.data


@pytest.mark.parametrize("no_store", [True, False], ids=["no-store", "control"])
def test_an_identical_request_does_not_join_a_no_store_stream(make_stack, no_store) -> None:
    """A no-store stream (1.5 s) and, 0.3 s into it, the same request without no-store: two
    upstream calls, the second a MISS of its own. The control (no no-store): it joins."""
    gw = make_stack(workers=1, memcached=False)
    gw.sim_reset()
    body = _chat(f"private {uuid.uuid4().hex}")
    first_headers = {"Cache-Control": "no-store"} if no_store else {}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_call, gw, body, first_headers)
        time.sleep(0.3)  # the first is streaming now
        second = pool.submit(_call, gw, body, {})
        (first_status, first_body), (second_status, second_body) = first.result(), second.result()
    assert first_body.endswith(b"data: [DONE]\n\n") and second_body.endswith(b"data: [DONE]\n\n")
    assert first_status == "MISS"
    if no_store:
        assert second_status == "MISS"
        assert gw.sim_stats()["requests"] == 2
    else:
        assert second_status == "COALESCED"
        assert gw.sim_stats()["requests"] == 1
