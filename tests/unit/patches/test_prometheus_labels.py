"""Metrics keep each label set's child at hand (app/observe/metrics.py): the same child as
prometheus_client's own, so every count lands where it did, each label set on its own."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.observe.metrics import Metrics
from app.patches.prometheus_labels import CHILDREN


def _samples(metrics: Metrics, name: str) -> dict[tuple, float]:
    text = metrics.exposition()[0].decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_a_label_set_counts_in_its_own_child_however_often_it_is_asked(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics()
    for _ in range(3):
        metrics.requests.labels("chat", "200", "bypass").inc()
    metrics.requests.labels("chat", 200, "bypass").inc()  # a status given as a number
    metrics.requests.labels(route="chat", status="429", cache="bypass").inc(2)
    metrics.duration.labels("chat", "false").observe(0.2)
    counted = _samples(metrics, "llmgate_requests_total")
    assert counted[(("cache", "bypass"), ("route", "chat"), ("status", "200"))] == 4
    assert counted[(("cache", "bypass"), ("route", "chat"), ("status", "429"))] == 2
    observed = _samples(metrics, "llmgate_request_duration_seconds_count")
    assert observed == {(("route", "chat"), ("stream", "false")): 1}
    # A kept child is prometheus_client's own, and one is kept per label set.
    child = metrics.requests.labels("chat", "200", "bypass")
    assert child is metrics.requests.labels("chat", "200", "bypass")
    assert child is not metrics.requests.labels("chat", "500", "bypass")


def test_the_children_kept_are_bounded(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics()
    for n in range(CHILDREN + 50):
        metrics.key_requests.labels(f"key-{n}", "200").inc()
    info = metrics.key_requests.labels.cache_info()  # type: ignore[attr-defined]
    assert info.currsize == CHILDREN and info.misses == CHILDREN + 50
    assert len(_samples(metrics, "llmgate_key_requests_total")) == CHILDREN + 50
