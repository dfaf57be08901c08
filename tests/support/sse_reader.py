"""Reads an SSE response as the caller sees it: each event with the moment it arrived."""

from __future__ import annotations

import json
import socket
import time
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
