"""Reads an SSE response as the caller sees it: each event with the moment it arrived
(``read_events``), the events that carry data up to a count (``read_data``), or every event
of one chat stream posted to a gateway (``chat_stream``)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass

import urllib3

from llmgate_wire import sse


@dataclass
class Arrival:
    at: float
    event: sse.Event


def read_events(resp: urllib3.BaseHTTPResponse, limit: int | None = None) -> list[Arrival]:
    """Events in arrival order, read with read1 so nothing waits for a full buffer."""
    decoder = sse.Decoder()
    out: list[Arrival] = []
    while limit is None or len(out) < limit:
        chunk = resp.read1(65536)
        if not chunk:
            break
        now = time.monotonic()
        out += [Arrival(now, e) for e in decoder.feed(chunk)]
    return out


def content_of(arrivals: list[Arrival]) -> str:
    text = []
    for a in arrivals:
        if a.event.data and a.event.data.startswith("{"):
            for choice in json.loads(a.event.data).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def read_data(
    resp: urllib3.BaseHTTPResponse,
    n: int | None,
    *,
    cut: bool = False,
    skip: Collection[str] = (),
) -> list[sse.Event]:
    """The events that carry data (comments skipped, and events whose data is in ``skip``),
    read until ``n`` of them or the end. What the last read brought beyond ``n`` is kept,
    unless ``cut``: then it is as if never read."""
    decoder, out = sse.Decoder(), list[sse.Event]()
    while n is None or len(out) < n:
        chunk = resp.read1(65536)
        if not chunk:
            break
        out += [e for e in decoder.feed(chunk) if not e.is_comment and e.data not in skip]
    return out[:n] if cut and n is not None else out


def text_of(events: list[sse.Event]) -> str:
    """The text a chat stream's events carry, their deltas' content joined."""
    out = []
    for event in events:
        if event.data and event.data.startswith("{"):
            for choice in json.loads(event.data).get("choices", []):
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def data_events(arrivals: list[Arrival]) -> list[Arrival]:
    return [a for a in arrivals if not a.event.is_comment]


def drop(resp: urllib3.BaseHTTPResponse) -> None:
    """Close the caller's connection abruptly: the gateway sees the caller leave."""
    conn = getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)
    resp.release_conn()
    if conn is not None:
        conn.close()


def chat_stream(
    http: urllib3.PoolManager,
    base_url: str,
    body: dict,
    headers: dict[str, str],
    path: str = "/v1/chat/completions",
) -> list[sse.Event]:
    """Every event (comments too) of the chat stream ``body`` asks ``base_url`` for (or the
    stream of another ``path``: /v1/messages), as the caller's bytes decode; the answer must
    be a 200."""
    resp = http.request(
        "POST",
        base_url + path,
        body=json.dumps(body),
        headers=headers,
        preload_content=False,
    )
    assert resp.status == 200, resp.data
    decoder, out = sse.Decoder(), list[sse.Event]()
    while chunk := resp.read1(65536):
        out += decoder.feed(chunk)
    resp.release_conn()
    return out
