"""The values that cross between the web layer and the orchestration. No I/O here."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

SSE_HEADERS = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; never reaches anyone


@dataclass(frozen=True)
class Call:
    route: str
    method: str
    path: str  # as received, e.g. "/v1/chat/completions"
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    client_socket: socket.socket | None = None


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes | Iterator[bytes]
