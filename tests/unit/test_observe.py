"""The bounded labels and the cheap usage lookup behind the metrics and the log line."""

from __future__ import annotations

from app.calls import Reply, Trace
from app.observe import _server_timing, _usage_in_body, cache_outcome


def test_cache_outcome_labels_are_bounded() -> None:
    def outcome(value: str | None) -> str:
        headers = [("X-LLMGate-Cache", value)] if value else []
        return cache_outcome(Reply(200, headers, b""))

    assert outcome("HIT; level=l1") == "hit_l1"
    assert outcome("HIT; level=l2") == "hit_l2"
    assert [outcome(v) for v in ("MISS", "BYPASS", "REFRESH", "COALESCED")] == [
        "miss",
        "bypass",
        "refresh",
        "coalesced",
    ]
    assert outcome(None) == "bypass"


def test_usage_is_read_from_the_end_of_a_large_answer() -> None:
    floats = b",".join(b"0.123456" for _ in range(200_000))
    body = (
        b'{"data":[{"embedding":[' + floats + b']}],"usage":{"prompt_tokens":7,"total_tokens":7}}'
    )
    assert _usage_in_body(body) == {"prompt_tokens": 7, "total_tokens": 7}
    assert _usage_in_body(b'{"id": 1}') is None
    assert _usage_in_body(b'{"usage": null}') is None
    assert _usage_in_body(b'{"usage": {broken') is None


def test_server_timing_names_its_parts() -> None:
    trace = Trace(started=0.0, cache_s=0.002, upstream_ttfb_s=0.25)
    value = _server_timing(trace)
    assert value.startswith("cache;dur=2.0, upstream;dur=250.0, gateway;dur=")
    assert "upstream" not in _server_timing(Trace(cache_s=0.0))
