"""A worker's metric values without a lock or a pid check per update
(app/patches/prometheus_values.py ``lean_values``): what they write is what /metrics reads from
the files, and a forked child writes into files of its own, never its parent's."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from app import patches
from app.patches import prometheus_values
from app.patches.prometheus_values import lean_values


def _lean_class(monkeypatch, tmp_path: Path) -> type:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    lean = lean_values(values.MultiProcessValue())
    monkeypatch.setattr(values, "ValueClass", lean)  # as the import of metrics.py does
    return lean


def _collected(tmp_path: Path) -> dict[tuple, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
    }


def _in_file(path: Path) -> dict[str, float]:
    kept = MmapedDict(str(path), read_mode=True)
    try:
        return {key: value for key, value, _ in kept.read_all_values()}
    finally:
        kept.close()


def test_what_lean_values_write_is_what_the_scrape_reads(monkeypatch, tmp_path) -> None:
    lean = _lean_class(monkeypatch, tmp_path)
    registry = CollectorRegistry()
    calls = Counter("t_calls", "calls", ["route"], registry=registry)
    held = Gauge("t_held", "held", ["kind"], multiprocess_mode="livesum", registry=registry)
    took = Histogram("t_took_seconds", "took", buckets=(0.1, 1), registry=registry)
    assert type(calls.labels("chat")._value) is lean
    calls.labels("chat").inc()
    calls.labels("chat").inc(2.5)
    calls.labels("embeddings").inc()
    held.labels("streams").set(7)
    held.labels("streams").set(3)
    took.observe(0.05)
    took.observe(0.5)
    found = _collected(tmp_path)
    assert found[("t_calls_total", (("route", "chat"),))] == 3.5
    assert found[("t_calls_total", (("route", "embeddings"),))] == 1
    assert found[("t_held", (("kind", "streams"),))] == 3
    assert found[("t_took_seconds_bucket", (("le", "0.1"),))] == 1
    assert found[("t_took_seconds_bucket", (("le", "1.0"),))] == 2
    assert found[("t_took_seconds_sum", ())] == 0.55
    assert found[("t_took_seconds_count", ())] == 2


def test_a_forked_child_counts_in_files_of_its_own(monkeypatch, tmp_path) -> None:
    _lean_class(monkeypatch, tmp_path)
    registry = CollectorRegistry()
    calls = Counter("t_forked", "calls", registry=registry)
    held = Gauge("t_forked_held", "held", multiprocess_mode="livesum", registry=registry)
    calls.inc()
    held.set(4)
    child = os.fork()
    if child == 0:  # the child: a value made before the fork, updated after it
        try:
            calls.inc(5)
            held.set(9)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent = os.getpid()
    assert _in_file(tmp_path / f"counter_{parent}.db") == {
        '["t_forked", "t_forked_total", {}, "calls"]': 1.0
    }
    assert list(_in_file(tmp_path / f"counter_{child}.db").values()) == [5.0]
    assert list(_in_file(tmp_path / f"gauge_livesum_{parent}.db").values()) == [4.0]
    assert list(_in_file(tmp_path / f"gauge_livesum_{child}.db").values()) == [9.0]
    calls.inc()  # the parent goes on in its own file
    assert _collected(tmp_path)[("t_forked_total", ())] == 7


def test_values_of_one_process_are_left_as_they_are() -> None:
    assert lean_values(values.MutexValue) is values.MutexValue
    lean = lean_values(values.MultiProcessValue())
    assert lean_values(lean) is lean


def test_values_written_in_place_survive_the_file_growing(monkeypatch, tmp_path) -> None:
    # The file's mmap is replaced when it grows past its size (64 KiB at first): the lean
    # value writes into the file's current one, never one it kept.
    _lean_class(monkeypatch, tmp_path)
    registry = CollectorRegistry()
    calls = Counter("t_grown", "calls", ["n"], registry=registry)
    calls.labels("first").inc()
    for n in range(1500):  # ~100 bytes a value: past 64 KiB
        calls.labels(str(n)).inc(n)
    calls.labels("first").inc(2)
    held = Gauge("t_grown_held", "held", multiprocess_mode="livesum", registry=registry)
    held.set(5)
    found = _collected(tmp_path)
    assert found[("t_grown_total", (("n", "first"),))] == 3
    assert found[("t_grown_total", (("n", "1499"),))] == 1499
    assert found[("t_grown_held", ())] == 5
    assert (tmp_path / f"counter_{os.getpid()}.db").stat().st_size > 65536


def test_a_moved_file_write_leaves_the_files_own(monkeypatch, tmp_path, caplog) -> None:
    own = MmapedDict.write_value
    written = []

    def write_value(self, key, value, timestamp):  # another version's write
        written.append(value)
        own(self, key, value, timestamp)

    monkeypatch.setattr(MmapedDict, "write_value", write_value)
    assert prometheus_values.writes_fit() is not None
    monkeypatch.setattr(patches, "_refused", set())
    _lean_class(monkeypatch, tmp_path)
    registry = CollectorRegistry()
    calls = Counter("t_moved", "calls", registry=registry)
    calls.inc(2)
    assert written[-1] == 2 and "prometheus_writes" in patches.refused()
    assert _collected(tmp_path)[("t_moved_total", ())] == 2
