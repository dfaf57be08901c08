"""Patch: each metric's ``labels`` lookup, answered from a dict for a label set it has seen
(0.14 us against 1.6: prometheus_client converts every value and takes a lock per call, a
dozen times a request; bench/HISTORY.md, "The metrics' updates").

The child ``labels`` returns is the metric's own, kept in its ``_metrics`` dict under its
label values, and a child is dropped only by ``remove`` or ``clear``, which the gateway never
calls: so the child remembered is the one prometheus_client would return. It fits
(``fits``) a ``labels`` that keeps its children in ``_metrics`` (prometheus_client 0.20 to
0.26); elsewhere each lookup is prometheus_client's own.
"""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from app.patches import refuse

# Children (one label set's value) each metric keeps at hand, past which the least recently
# used is looked up again: far more than the label sets of a worker's routes and statuses.
CHILDREN = 4096


def fits() -> str | None:
    """None when ``labels`` keeps its children in the metric's ``_metrics`` dict."""
    code = getattr(MetricWrapperBase.labels, "__code__", None)
    if code is None or "_metrics" not in code.co_names:
        return "MetricWrapperBase.labels keeps its children elsewhere"
    return None


def remember_children(metric: Any) -> None:
    """``metric.labels`` answers a label set it has seen from a dict, when it fits."""
    reason = fits()
    if reason is None:
        metric.labels = functools.lru_cache(maxsize=CHILDREN)(metric.labels)
    else:
        refuse("prometheus_labels", reason)
