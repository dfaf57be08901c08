"""The parts of an answer as a flight carries it: its head, its clean end, and the one way
a listener stops early (its caller left). No I/O here."""

from __future__ import annotations

from dataclasses import dataclass


class ClientGone(Exception):
    """The caller closed its connection; nobody is left to answer."""


@dataclass(frozen=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    attempts: int
    body: bytes | None  # None: an event stream follows
    upstream: str = ""  # the configured name of the upstream that answered


@dataclass(frozen=True)
class Finished:
    leftover: bytes  # bytes of an unterminated last event, if any
