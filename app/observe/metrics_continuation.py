"""The metrics of streams continued on another upstream (app/upstream/continuation.py), in a
module of their own: app/observe/metrics.py builds them with one line.

``llmgate_stream_continuations_total{upstream,outcome}`` counts each stream that broke after
it started and could have been continued, once per try, by the upstream whose stream broke
and what came of it (docs/metrics.md lists the outcomes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


def stream_continuations(registry: CollectorRegistry) -> Counter:
    return Counter(
        "llmgate_stream_continuations_total",
        "Streams that broke after they started, by the upstream that broke them and what "
        "came of it: continued on another upstream call, or why not.",
        ["upstream", "outcome"],
        registry=registry,
    )
