"""The /status.json document: the aggregated metrics reshaped for the status page. No I/O.

Cumulative since start; the page turns differences between two snapshots into rates, ratios
and percentiles (see docs/observability.md). The gateway keeps such snapshots of the last
15 minutes (app/edge/status_history.py) as ``history_sample``s: the document without what the
charts do not draw, so that a page opening on them is sent a few hundred kB at most.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from app.core.causes import ERROR_CAUSES
from app.observe.labels import CACHE_OUTCOMES

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _total(samples: Samples, name: str, **match: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if _matches(labels, match))


def _matches(labels: dict[str, str], match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def _histogram(samples: Samples, name: str) -> dict[str, Any]:
    buckets: dict[float, float] = {}
    for labels, value in samples.get(name + "_bucket", []):
        le = float(labels["le"])
        buckets[le] = buckets.get(le, 0.0) + value
    bounds = sorted(buckets)
    return {
        "le": [b if math.isfinite(b) else "+Inf" for b in bounds],
        "counts": [buckets[b] for b in bounds],
        "sum": _total(samples, name + "_sum"),
        "count": _total(samples, name + "_count"),
    }


def _by(samples: Samples, name: str, label: str, keys: Iterable[str]) -> dict[str, float]:
    return {key: _total(samples, name, **{label: key}) for key in keys}


_STATE_NAMES = {0: "closed", 1: "half_open", 2: "open"}


def _upstreams(samples: Samples) -> dict[str, dict[str, Any]]:
    """Each upstream's breaker state and attempts by result, by its configured name, and what
    its prompt cache did with the prompt tokens it was sent (``prompt_cache``: read, write,
    uncached, and the hit ratio, read over all three; only once it reported some)."""
    out: dict[str, dict[str, Any]] = {}
    for labels, value in samples.get("llmgate_upstream_state", []):
        name = labels.get("upstream", "")
        out.setdefault(name, {"attempts": {}})["state"] = _STATE_NAMES.get(int(value), "closed")
    for labels, value in samples.get("llmgate_upstream_attempts_total", []):
        entry = out.setdefault(labels.get("upstream", ""), {"attempts": {}, "state": "closed"})
        entry["attempts"][labels.get("result", "")] = value
    for labels, value in samples.get("llmgate_prompt_cache_tokens_total", []):
        entry = out.setdefault(labels.get("upstream", ""), {"attempts": {}, "state": "closed"})
        tokens = entry.setdefault("prompt_cache", {"read": 0.0, "write": 0.0, "uncached": 0.0})
        kind = labels.get("kind", "")
        if kind in tokens:
            tokens[kind] += value
    for entry in out.values():
        tokens = entry.get("prompt_cache")
        if tokens is not None:
            seen = tokens["read"] + tokens["write"] + tokens["uncached"]
            tokens["hit_ratio"] = tokens["read"] / seen if seen else None
    return out


def _keys(samples: Samples) -> dict[str, dict[str, float]]:
    """Each gateway key's calls, billed tokens and cost since start, by its name (the
    ``llmgate_key_*`` counters; absent when keys are off or no key made a call yet)."""
    out: dict[str, dict[str, float]] = {}

    def entry(labels: dict[str, str]) -> dict[str, float]:
        fields = ("requests", "not_2xx", "prompt_tokens", "completion_tokens", "cost_usd")
        return out.setdefault(labels.get("key", ""), dict.fromkeys(fields, 0.0))

    for labels, value in samples.get("llmgate_key_requests_total", []):
        row = entry(labels)
        row["requests"] += value
        if not labels.get("status", "").startswith("2"):
            row["not_2xx"] += value
    for labels, value in samples.get("llmgate_key_tokens_total", []):
        kind = labels.get("kind", "")
        if kind in ("prompt", "completion"):
            entry(labels)[f"{kind}_tokens"] += value
    for labels, value in samples.get("llmgate_key_cost_usd_total", []):
        entry(labels)["cost_usd"] += value
    return dict(sorted(out.items()))


# Not drawn by the charts, and growing with the upstreams and keys configured.
_NOT_CHARTED = ("upstreams", "keys")


def history_sample(document: dict[str, Any]) -> dict[str, Any]:
    """What the gateway keeps of a document for the page's history: what the charts draw."""
    return {k: v for k, v in document.items() if k not in _NOT_CHARTED}


def status_document(samples: Samples, *, now: float, started: float) -> dict[str, Any]:
    by_class: dict[str, float] = {"2xx": 0.0, "3xx": 0.0, "4xx": 0.0, "5xx": 0.0}
    for labels, value in samples.get("llmgate_requests_total", []):
        status = labels.get("status", "")
        cls = f"{status[:1]}xx"
        if cls in by_class:
            by_class[cls] += value
    return {
        "time": now,
        "started": started,
        "requests": {"total": _total(samples, "llmgate_requests_total"), "by_class": by_class},
        "errors": _by(samples, "llmgate_upstream_errors_total", "cause", ERROR_CAUSES),
        "cache": _by(samples, "llmgate_cache_requests_total", "outcome", CACHE_OUTCOMES),
        "streams_active": _total(samples, "llmgate_active_streams"),
        "heartbeats": _total(samples, "llmgate_heartbeats_total"),
        "retries": _total(samples, "llmgate_upstream_retries_total"),
        "pool": {
            "in_use": _total(samples, "llmgate_upstream_pool_connections", state="in_use"),
            "idle": _total(samples, "llmgate_upstream_pool_connections", state="idle"),
            "opened": _total(samples, "llmgate_upstream_connections_opened_total"),
        },
        "upstreams": _upstreams(samples),
        "keys": _keys(samples),
        "histograms": {
            "request_duration_seconds": _histogram(samples, "llmgate_request_duration_seconds"),
            "ttft_seconds": _histogram(samples, "llmgate_ttft_seconds"),
        },
    }
