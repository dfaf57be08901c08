"""Every metric the gateway exports is in docs/metrics.md, with its labels."""

from __future__ import annotations

import re

from prometheus_client.metrics import MetricWrapperBase

from app.observe.metrics import Metrics
from tests.conftest import ROOT


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    rows = re.finditer(r"^\| `(\w+)` \| \w+ \| ([^|]*) \|", text, re.M)
    return {m.group(1): {x.strip() for x in m.group(2).split(",")} - {"—"} for m in rows}


def _exported() -> dict[str, set[str]]:
    out = {}
    for metric in vars(Metrics(multiproc_dir="")).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            out[metric._name + suffix] = set(metric._labelnames)
    return out


def test_every_metric_is_documented_with_its_labels() -> None:
    documented, exported = _documented(), _exported()
    assert len(exported) >= 15
    assert set(exported) == set(documented), "docs/metrics.md and app/observe/metrics.py differ"
    for name, labels in exported.items():
        assert labels == documented[name], f"{name}: labels {labels} vs {documented[name]}"


def test_metric_names_follow_the_convention() -> None:
    for name in _exported():
        assert re.fullmatch(r"llmgate_[a-z_]+", name), name
