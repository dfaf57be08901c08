"""The gateway's own time by stage as a metric: ``llmgate_added_seconds{route,stage}``.

One observation per stage a call had (app/request/stages.py names them; the upstream's own
time is ``llmgate_upstream_ttft_seconds``, not this), and for a stream its per-event relay
time, the median and the longest (``relay``, ``relay_max``). Built by one line of
``Metrics.__init__`` (app/observe/metrics.py), documented in docs/metrics.md.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

# From a tenth of a millisecond (a stage that is a dictionary lookup) to seconds (a queue
# under overload): finer at the low end than the calls' own LATENCY_BUCKETS.
ADDED_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
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
)


def added_seconds(registry: CollectorRegistry) -> Histogram:
    """The histogram of the gateway's own time by route and stage."""
    return Histogram(
        "llmgate_added_seconds",
        "The gateway's own time by stage (queue, auth, cache, connect, work, gateway: the "
        "total it added; relay, relay_max: a stream's per-event relay time, its median and "
        "longest), as each answer's Server-Timing says it.",
        ["route", "stage"],
        buckets=ADDED_BUCKETS,
        registry=registry,
    )
