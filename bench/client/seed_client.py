"""The seed table's client: one row's calls in a process of its own, its numbers as JSON.

`python -m bench.client.seed_client '<spec JSON>'` prints one JSON object. A fresh process per row
keeps its peak RSS and tracemalloc's view to the client alone: the fault proxy, the TLS
front and the orchestration live in the parent. It imports requests, nothing of llmgate.

The naive client is what `requests.post()` does (requests/api.py): a Session per call,
closed when the call returns, so every call opens a new connection (TCP, then TLS over
https). The pooled client keeps one Session. Both verify the certificate against
``ca_bundle`` (the system's roots plus the bench's own), loaded per connection as requests
does, so a naive call also pays for reading the roots.

Order: the sequential calls (timed), the concurrent ones (timed), then a few calls with
tracemalloc on, untimed, since tracing slows every allocation.
"""

from __future__ import annotations

import collections
import json
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter

_KEEP = 3  # tracemalloc lines reported
# The gateway's cache is per tenant (the caller's key): the one who stores must send the same.
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-seed"}


class Row:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.url: str = spec["url"]
        self.body = json.dumps(spec["body"]).encode()
        self.stream: bool = bool(spec["body"].get("stream"))
        self.pooled: bool = spec["client"] == "pooled"
        self.headers: dict[str, str] = spec.get("headers", {})
        self.verify: str | bool = spec.get("ca_bundle") or True
        self.session = requests.Session() if self.pooled else None
        concurrency = spec.get("concurrency", 1)
        if self.session is not None and concurrency > 10:  # requests keeps 10 per host
            adapter = HTTPAdapter(pool_maxsize=concurrency)
            self.session.mount("https://", adapter)
            self.session.mount("http://", adapter)
        self.tls_version: str | None = None
        self.cache: collections.Counter[str] = collections.Counter()  # X-LLMGate-Cache values

    def call(self, hold: Callable[[], None] | None = None) -> tuple[float, float | None]:
        """Seconds to the whole answer, and to the first content token of a stream."""
        session = self.session or requests.Session()
        try:
            started = time.perf_counter()
            resp = session.post(
                self.url,
                data=self.body,
                headers={**HEADERS, **self.headers},
                verify=self.verify,
                stream=True,  # holds the connection until read, so its TLS version can be read
                timeout=60,
            )
            self.cache[resp.headers.get("X-LLMGate-Cache") or "none"] += 1
            if self.tls_version is None:
                sock = getattr(resp.raw.connection, "sock", None)
                version = getattr(sock, "version", None)  # an ssl.SSLSocket's, over https
                self.tls_version = version() if version is not None else "plain"
            first = None
            if self.stream:
                seen = b""
                for chunk in resp.iter_content(chunk_size=None):
                    if first is None:
                        seen += chunk  # the role chunk's content is "", a token's is not
                        if b'"content":"' in seen.replace(b'"content":""', b""):
                            first = time.perf_counter() - started
            else:
                resp.content  # noqa: B018 - reads the body, as requests does without stream=True
            total = time.perf_counter() - started
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.content[:200]!r}")
            if hold is not None:
                hold()  # while this call's session and connection are still alive
            return total, first
        finally:
            if self.session is None:
                session.close()


def _where(stat: tracemalloc.Statistic) -> str:
    frame = stat.traceback[0]
    parts = Path(frame.filename).parts
    return f"{'/'.join(parts[-2:])}:{frame.lineno}"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    row = Row(spec)
    started = time.perf_counter()
    total, first = zip(*(row.call() for _ in range(spec["requests"])), strict=True)
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out: dict[str, Any] = {
        "total_s": list(total),
        "first_s": list(first) if row.stream else None,
        "wall_s": wall,
        "peak_rss_kib": peak_kib,
        "tls_version": row.tls_version,
    }
    out["cache"] = dict(row.cache)
    concurrency = spec.get("concurrency", 1)
    if concurrency > 1:  # the pooled client's one Session is shared by the threads
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda _: row.call()[0], range(spec["requests"])))
        out["concurrent"] = {
            "concurrency": concurrency,
            "total_s": results,
            "wall_s": time.perf_counter() - started,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }
    snapshot: list[tracemalloc.Snapshot] = []
    traced = spec.get("trace_calls", 5)
    tracemalloc.start()
    for n in range(traced):
        last = n == traced - 1
        row.call(hold=(lambda: snapshot.append(tracemalloc.take_snapshot())) if last else None)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if snapshot:
        stats = (
            snapshot[0]
            .filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<*>")]
            )
            .statistics("lineno")
        )
        out["top_allocations"] = [
            {"where": _where(s), "kib": s.size / 1024, "count": s.count} for s in stats[:_KEEP]
        ]
        out["traced_peak_kib"] = traced_peak / 1024
    return out


if __name__ == "__main__":
    json.dump(run(json.loads(sys.argv[1])), sys.stdout)
