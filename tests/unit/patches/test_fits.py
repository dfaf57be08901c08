"""Each patch of a dependency's internals (app/patches/) fits the versions requirements.txt
pins, and steps aside, with one warning, where the internals it relies on moved: the
library's own path then runs. The behaviour of each patched path against the library's own
is in the other files of this folder."""

from __future__ import annotations

import http.client
import logging
from collections.abc import Iterator
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import values
from prometheus_client.metrics import MetricWrapperBase

from app import patches
from app.patches import chunked_reads, http_headers, prometheus_labels, prometheus_values
from tests.conftest import ROOT

# The libraries whose internals app/patches/ reads or replaces: pinned exactly.
PATCHED = ("urllib3", "prometheus_client")


@pytest.fixture(autouse=True)
def _fresh_refusals(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(patches, "_refused", set())
    chunked_reads.usable.cache_clear()
    yield
    chunked_reads.usable.cache_clear()


def test_every_patch_fits_the_pinned_versions() -> None:
    """Fails first when a new version of a library moves what a patch relies on."""
    assert http_headers.fits() is None
    assert prometheus_values.fits(values.MultiProcessValue()) is None
    assert prometheus_values.writes_fit() is None
    assert prometheus_labels.fits() is None
    assert chunked_reads.fits() is None


def test_the_patched_libraries_are_pinned_to_what_is_installed() -> None:
    """requirements.txt names the exact versions the patches were checked against, and the
    environment the tests run in has them."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower().replace("-", "_")] = version.split()[0]
    for library in PATCHED:
        assert library in pins, f"requirements.txt must pin {library} exactly (==)"
        assert metadata.version(library) == pins[library]


def test_a_moved_header_reader_leaves_http_clients_own_parser(monkeypatch, caplog) -> None:
    original = http.client.parse_headers
    monkeypatch.setattr(http.client, "parse_headers", original)
    monkeypatch.delattr(http.client, "_read_headers")
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        http_headers.install()
        http_headers.install()
    assert http.client.parse_headers is original
    (record,) = caplog.records
    assert "http_headers" in record.getMessage() and "_read_headers" in record.getMessage()


def test_a_value_class_that_updates_more_is_left_as_it_is(monkeypatch, caplog) -> None:
    class Richer:
        _multiprocess = True
        _file: Any
        _key: str

        def inc(self, amount: float) -> None:
            self._value = amount
            self._timestamp = 0.0
            self._dirty = True  # a field the lean value would not keep
            self._file.write_value(self._key, amount, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            self.inc(value)

    monkeypatch.setattr(values, "ValueClass", Richer)
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        prometheus_values.use_lean_values()
    assert values.ValueClass is Richer
    assert "_dirty" in caplog.records[0].getMessage()


def test_labels_kept_elsewhere_are_looked_up_each_time(monkeypatch, caplog) -> None:
    def labels(self: Any, *values: str) -> Any:  # keeps no _metrics
        return (self, values)

    monkeypatch.setattr(MetricWrapperBase, "labels", labels)
    metric = SimpleNamespace(labels=lambda *v: v)
    own = metric.labels
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        prometheus_labels.remember_children(metric)
    assert metric.labels is own and len(caplog.records) == 1


def test_chunked_reads_that_do_not_fit_read_through_urllib3(monkeypatch, caplog) -> None:
    monkeypatch.setattr(chunked_reads, "fits", lambda: "moved")
    fp = http.client.HTTPResponse.__new__(http.client.HTTPResponse)
    fp.chunked = True
    raw = SimpleNamespace(_fp=fp, headers={}, read1=lambda size: b"")
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        assert chunked_reads.body_reader(raw) == raw.read1
        assert chunked_reads.chunked_beneath(raw) is None
    assert len(caplog.records) == 1 and patches.refused() == {"chunked_reads"}
