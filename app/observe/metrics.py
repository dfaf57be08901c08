"""Prometheus metrics: prometheus_client is imported here (and patched by app/patches/).

Under gunicorn every worker writes its samples to `PROMETHEUS_MULTIPROC_DIR` (set, and wiped
at start, by gunicorn.conf.py; a dead worker is marked there so its live gauges drop out) and
`/metrics` aggregates all workers' files. Without that directory (a single process, tests)
the metrics live in a private registry. Names are `llmgate_<thing>_<unit>`; labels are
bounded: no prompt text, no keys, model names are not labels at all. docs/metrics.md lists
every metric with its labels; a test fails when they differ.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from app.core.admission import KINDS, Load
from app.core.causes import ERROR_CAUSES
from app.observe import metrics_continuation, metrics_ledger, metrics_prompt_cache, metrics_stages
from app.observe.labels import CACHE_OUTCOMES
from app.patches.prometheus_labels import remember_children
from app.patches.prometheus_values import use_lean_values

use_lean_values()  # before any metric is made
# LLM calls range from a cache hit (ms) to a long reasoning stream (minutes).
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
)
RATE_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
CACHE_OP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class Metrics:
    """Every metric of the gateway, built once per worker by the app factory (the
    observer of a stage built without it: app/observe/unobserved.py)."""

    watched = True  # /metrics and /status.json have something to show

    def __init__(self, multiproc_dir: str | None = None) -> None:
        self.multiproc_dir = (
            multiproc_dir
            if multiproc_dir is not None
            else os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
        )
        # In multiprocess mode values go to the mmap files whatever the registry; a private
        # registry keeps several apps in one process (tests) from colliding.
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry

        self.requests = Counter(
            "llmgate_requests_total",
            "API requests answered, by route, HTTP status and cache outcome.",
            ["route", "status", "cache"],
            registry=reg,
        )
        self.duration = Histogram(
            "llmgate_request_duration_seconds",
            "Time from request to the last byte sent.",
            ["route", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "llmgate_ttft_seconds",
            "Time to first token as the caller sees it: request to the "
            "first data event of a stream (a Responses stream: its first output delta).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.upstream_ttft = Histogram(
            "llmgate_upstream_ttft_seconds",
            "The upstream's own time to first byte: sending the "
            "request to its headers (and first event of a stream).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.tokens_per_second = Histogram(
            "llmgate_stream_tokens_per_second",
            "Data events per second over a stream, first "
            "to last event (one event is about one token).",
            ["route"],
            buckets=RATE_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "llmgate_prompt_tokens_total",
            "Prompt (input) tokens the upstream reported for calls it answered for this "
            "gateway (cache hits and coalesced followers add none).",
            ["route"],
            registry=reg,
        )
        self.prompt_cached_tokens = Counter(
            "llmgate_prompt_cached_tokens_total",
            "Of those, the prompt tokens the provider served from its own prompt cache "
            "(usage.prompt_tokens_details / input_tokens_details.cached_tokens).",
            ["route"],
            registry=reg,
        )
        self.prompt_cache_tokens = metrics_prompt_cache.prompt_cache_tokens(reg)
        self.upstream_errors = Counter(
            "llmgate_upstream_errors_total",
            "Failed upstream calls and callers that left, by cause.",
            ["cause"],
            registry=reg,
        )
        self.retries = Counter(
            "llmgate_upstream_retries_total", "Upstream attempts beyond the first.", registry=reg
        )
        self.upstream_attempts = Counter(
            "llmgate_upstream_attempts_total",
            "Attempts per upstream (by its configured name, never its key) and result, one "
            "each: ok, rate_limited (429), failed (no connection, timeout, 5xx, or a 2xx "
            "answer broken off or malformed after its headers), cancelled (given up by the "
            "gateway's side: its caller left, a hedge lost).",
            ["upstream", "result"],
            registry=reg,
        )
        self.failovers = Counter(
            "llmgate_upstream_failovers_total",
            "Calls moved to another upstream before any byte reached the caller.",
            registry=reg,
        )
        self.hedges = Counter(
            "llmgate_hedges_total",
            "Backup requests sent because a stream's first event was late (hedge_after), by "
            "the upstream first chosen and which one streamed first (primary, backup, or "
            "failed: neither). Each is one extra upstream call until the loser was closed.",
            ["upstream", "winner"],
            registry=reg,
        )
        self.key_requests = Counter(
            "llmgate_key_requests_total",
            "Calls made with each gateway key (its name, never the key), by HTTP status.",
            ["key", "status"],
            registry=reg,
        )
        self.key_tokens = Counter(
            "llmgate_key_tokens_total",
            "Tokens the upstream billed for each gateway key's calls, from their usage: "
            "prompt or completion (cache hits and coalesced followers add none).",
            ["key", "kind"],
            registry=reg,
        )
        self.key_cost = Counter(
            "llmgate_key_cost_usd_total",
            "What each gateway key's calls cost, in USD, from their usage and the config "
            "file's price table (only with one; cache hits and coalesced followers add none).",
            ["key"],
            registry=reg,
        )
        self.limit_counter_errors = Counter(
            "llmgate_limit_counter_errors_total",
            "Limit checks that could not reach the shared counters (Memcached); the call "
            "passed uncounted or was refused, as LLMGATE_LIMITS_FAIL says.",
            registry=reg,
        )
        self.retry_budget_exhausted = Counter(
            "llmgate_retry_budget_exhausted_total",
            "Retries and failovers not made because the worker's retry budget was spent "
            "(LLMGATE_RETRY_BUDGET_PERCENT / _MIN): the answer or error went back as it was.",
            registry=reg,
        )
        self.upstream_state = Gauge(
            "llmgate_upstream_state",
            "Circuit breaker per upstream: 0 closed, 1 half-open, 2 open (the worst of the "
            "live workers: breakers are per worker).",
            ["upstream"],
            multiprocess_mode="livemax",
            registry=reg,
        )
        self.connections_opened = Counter(
            "llmgate_upstream_connections_opened_total",
            "TCP connections opened to the upstream; flat under steady load when keep-alive works.",
            registry=reg,
        )
        self.connections_spare = Counter(
            "llmgate_upstream_connections_spare_total",
            "Of those, the spares opened ahead of need (LLMGATE_POOL_SPARE_RATIO).",
            registry=reg,
        )
        self.pool = Gauge(
            "llmgate_upstream_pool_connections",
            "Upstream connections in use and idle in the pools, summed over live workers.",
            ["state"],
            multiprocess_mode="livesum",
            registry=reg,
        )
        self.active_streams = Gauge(
            "llmgate_active_streams",
            "Streams being relayed now.",
            multiprocess_mode="livesum",
            registry=reg,
        )
        self.admission_rejected = Counter(
            "llmgate_admission_rejected_total",
            "Calls refused with 429 gateway_overloaded because their worker was at a limit, "
            "by the limit that was full (requests or streams).",
            ["kind"],
            registry=reg,
        )
        self.admission_in_flight = Gauge(
            "llmgate_admission_in_flight",
            "Calls holding an admission slot now, by kind (a stream holds both), summed over "
            "live workers.",
            ["kind"],
            multiprocess_mode="livesum",
            registry=reg,
        )
        for kind in KINDS:
            self.admission_rejected.labels(kind)
            self.admission_in_flight.labels(kind)
        self.trace_spans_dropped = Counter(
            "llmgate_trace_spans_dropped_total",
            "Ended spans dropped, never exported, because the worker's export queue was full "
            "(OTEL_BSP_MAX_QUEUE_SIZE): a collector slower than the traffic, or none.",
            registry=reg,
        )
        self.resumable_streams = Counter(
            "llmgate_resumable_streams_total",
            "Streams that asked to be resumable (docs/streams.md), by what they got: yes, or "
            "why not (disabled, log_memory, budget, joined_late, cached, store).",
            ["result"],
            registry=reg,
        )
        self.resume_logs = Counter(
            "llmgate_resume_logs_total",
            "Resumable streams' logs at their end, by how it ended: complete (the answer's "
            "end logged), abandoned (the caller was gone a whole window and nobody resumed: "
            "the upstream call was stopped), deleted (its owner deleted it after leaving: "
            "stopped too), overflow (past LLMGATE_RESUME_STREAM_BYTES), withdrawn (lost "
            "by Memcached, not kept to write again), failed (the writer was dropped).",
            ["how"],
            registry=reg,
        )
        self.resumes = Counter(
            "llmgate_resumes_total",
            "Reconnects with Last-Event-ID or to /v1/streams/{id}, by outcome: resumed, "
            "deleted (DELETE /v1/streams/{id}), not_found (unknown, expired, made-up or "
            "another caller's id: one answer for all), unavailable (Memcached could not say).",
            ["outcome"],
            registry=reg,
        )
        self.resume_events_replayed = Counter(
            "llmgate_resume_events_replayed_total",
            "Events resumes sent from a log as it stood when they reconnected (the live rest "
            "is not counted).",
            registry=reg,
        )
        for result in ("yes", "disabled", "log_memory", "budget", "joined_late", "cached", "store"):
            self.resumable_streams.labels(result)
        for how in ("complete", "abandoned", "deleted", "overflow", "withdrawn", "failed"):
            self.resume_logs.labels(how)
        for outcome in ("resumed", "deleted", "not_found", "unavailable"):
            self.resumes.labels(outcome)
        self.heartbeats = Counter(
            "llmgate_heartbeats_total", "`: ping` comments sent on idle streams.", registry=reg
        )
        self.cache_requests = Counter(
            "llmgate_cache_requests_total",
            "Cache outcomes of API requests.",
            ["outcome"],
            registry=reg,
        )
        self.cache_stored_bytes = Counter(
            "llmgate_cache_stored_bytes_total",
            "Bytes of entries written to the cache.",
            registry=reg,
        )
        self.cache_not_stored = Counter(
            "llmgate_cache_not_stored_total",
            "Complete answers not stored, by reason.",
            ["reason"],
            registry=reg,
        )
        self.event_log_bytes = Gauge(
            "llmgate_event_log_bytes",
            "Memory held by the event logs flights keep for the cache and coalesced followers "
            "(Python objects, estimated), summed over live workers.",
            multiprocess_mode="livesum",
            registry=reg,
        )
        self.event_logs_refused = Counter(
            "llmgate_event_logs_refused_total",
            "Streams that kept no event log because their worker's log memory budget was full "
            "(LLMGATE_LOG_MEMORY_BYTES): from the start, or given up while running. Neither "
            "stored nor joined by identical requests.",
            ["when"],
            registry=reg,
        )
        for when in ("start", "running"):
            self.event_logs_refused.labels(when)
        self.cache_errors = Counter(
            "llmgate_cache_errors_total",
            "Cache backend failures (each one served as a miss).",
            registry=reg,
        )
        self.memcached_node_events = Counter(
            "llmgate_memcached_node_events_total",
            "Changes of a Memcached node as each worker's clients (l2, limits, resume) saw "
            "them: dropped (it closed our connections), failed (skipped), back (answering).",
            ["client", "event"],
            registry=reg,
        )
        self.cache_op = Histogram(
            "llmgate_cache_op_seconds",
            "Cache operation latency (L1 then Memcached).",
            ["op"],
            buckets=CACHE_OP_BUCKETS,
            registry=reg,
        )
        self.stream_continuations = metrics_continuation.stream_continuations(reg)
        self.added = metrics_stages.added_seconds(reg)  # the gateway's own time by stage
        self.ledger_rows, self.ledger_lag, self.ledger_batch, self.ledger_rebuilt = (
            metrics_ledger.ledger(reg)
        )
        for cause in ERROR_CAUSES:
            self.upstream_errors.labels(cause)
        for outcome in CACHE_OUTCOMES:
            self.cache_requests.labels(outcome)
        for state in ("in_use", "idle"):
            self.pool.labels(state)
        for metric in vars(self).values():
            if isinstance(metric, Counter | Gauge | Histogram) and metric._labelnames:
                remember_children(metric)

    def observe_key_usage(
        self, key: str, prompt: Any, completion: Any, picodollars: int = 0
    ) -> None:
        """A call of gateway key ``key`` ended: its billed prompt and completion tokens, as
        the provider sent them (app/request/usage.py), and what they cost
        (app/tenancy/prices.py)."""
        if picodollars > 0:
            self.key_cost.labels(key).inc(picodollars / 1e12)
        for kind, count in (("prompt", prompt), ("completion", completion)):
            if isinstance(count, int) and count > 0:
                self.key_tokens.labels(key, kind).inc(count)

    def observe_admission(self, kind: str, event: str, load: Load) -> None:
        """The observer of app/core/admission.py's gate: refusals counted, slots in use shown."""
        if event == "rejected":
            self.admission_rejected.labels(kind).inc()
        else:
            self.admission_in_flight.labels(kind).set(getattr(load, kind))

    def observe_log_memory(self, what: str, held: int) -> None:
        """The observer of app/streams/log_memory.py's budget: refusals counted, bytes held
        shown."""
        if what.startswith("refused_"):
            self.event_logs_refused.labels(what.removeprefix("refused_")).inc()
        self.event_log_bytes.set(held)

    def exposition(self) -> tuple[bytes, str]:
        """The text format for /metrics: every worker's samples when multiprocess."""
        if self.multiproc_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiproc_dir)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def snapshot(self) -> dict[str, Any]:
        """The aggregated samples as {name: [(labels, value), ...]} (for /status.json)."""
        if self.multiproc_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiproc_dir)
        else:
            registry = self.registry
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in registry.collect():
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out


def mark_process_dead(pid: int) -> None:
    """gunicorn's child_exit hook: drop a dead worker's live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)
