"""The last bodies read in a worker (app/request/body_readings.py): bounded by count and by bytes,
the oldest out first, a large body never kept."""

from __future__ import annotations

from app.request import routes
from app.request.body_readings import BodyReading, BodyReadings


def _reading(raw: bytes) -> BodyReading:
    return BodyReading({"raw": raw.decode()}, raw, False)


def _keep(readings: BodyReadings, raw: bytes, route: str = "chat", path: str = "/p") -> BodyReading:
    return readings.keep(routes.of_name(route), path, raw, _reading(raw))


def test_a_kept_reading_is_found_by_its_route_path_and_bytes_only() -> None:
    readings = BodyReadings()
    kept = _keep(readings, b'{"a":1}')
    assert readings.get(routes.CHAT, "/p", b'{"a":1}') is kept
    assert readings.get(routes.CHAT, "/p", b'{"a": 1}') is None  # other bytes, the same JSON
    assert readings.get(routes.COMPLETIONS, "/p", b'{"a":1}') is None
    assert readings.get(routes.CHAT, "/q", b'{"a":1}') is None


def test_the_oldest_goes_first_past_the_count() -> None:
    readings = BodyReadings(max_readings=3)
    for n in range(5):
        _keep(readings, b"%d" % n)
    assert len(readings) == 3
    assert [readings.get(routes.CHAT, "/p", b"%d" % n) is not None for n in range(5)] == [
        False, False, True, True, True
    ]  # fmt: skip


def test_the_oldest_goes_first_past_the_bytes() -> None:
    readings = BodyReadings(max_bytes=10, max_body=10)
    for raw in (b"aaaa", b"bbbb", b"cc"):
        _keep(readings, raw)
    assert len(readings) == 3  # 10 bytes: at the bound, not past it
    _keep(readings, b"d")
    assert readings.get(routes.CHAT, "/p", b"aaaa") is None
    assert [readings.get(routes.CHAT, "/p", r) is not None for r in (b"bbbb", b"cc", b"d")] == [
        True
    ] * 3
    _keep(readings, b"e" * 10)  # room for it alone
    assert len(readings) == 1


def test_a_body_over_its_bound_is_read_each_time() -> None:
    readings = BodyReadings(max_body=4)
    large = _keep(readings, b"12345")
    assert large.body == {"raw": "12345"}  # handed back, not kept
    assert len(readings) == 0 and readings.get(routes.CHAT, "/p", b"12345") is None
    none = BodyReadings(max_readings=0)
    _keep(none, b"1")
    assert len(none) == 0


def test_a_body_kept_twice_keeps_the_first_and_counts_its_bytes_once() -> None:
    readings = BodyReadings(max_bytes=8, max_body=8)
    first = _keep(readings, b"aaaa")
    assert _keep(readings, b"aaaa") is first
    _keep(readings, b"bbbb")  # 8 bytes with the first counted once: both stay
    assert readings.get(routes.CHAT, "/p", b"aaaa") is first
    assert readings.get(routes.CHAT, "/p", b"bbbb") is not None
