"""bench/load/compare.py sends each door the call it means: the route, stream or not, its
headers."""

from __future__ import annotations

import json

import pytest

from bench.load import compare


@pytest.mark.parametrize("door", list(compare.DOORS))
@pytest.mark.parametrize("stream", [False, True])
def test_each_door_gets_its_own_call(door: str, stream: bool) -> None:
    raw = compare.request(door, stream, {"Authorization": "Bearer k"})
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == f"POST {compare.DOORS[door][0]} HTTP/1.1"
    assert "Authorization: Bearer k" in lines
    assert ("anthropic-version: 2023-06-01" in lines) == (door == "messages")
    sent = json.loads(body)
    assert sent["stream"] is stream and sent["model"] == "sim-small"
