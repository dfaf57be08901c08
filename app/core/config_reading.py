"""How a setting is declared and how its text is read: the machinery under ``Settings``
(app/core/config.py). No I/O here: the environment comes in as a mapping.

A setting is a dataclass field whose metadata names its environment variable and says what
it does (``setting``); the text of a variable is parsed by the field's declared type
(``parse``). The settings whose text holds a list (LLMGATE_MEMCACHED, LLMGATE_OPS_ALLOW)
are split and checked here, and LLMGATE_WORKER_CONNECTIONS, which is not a field of
``Settings`` but sizes the admission limits' defaults, is read here too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any


class SettingsError(ValueError):
    """A setting has a value the gateway cannot run with."""


def setting(env: str, default: Any, help: str) -> Any:
    """A field of ``Settings``: its environment variable, its default and what it does (the
    text the documentation is checked against)."""
    return dataclasses.field(default=default, metadata={"env": env, "help": help})


def parse(f: dataclasses.Field[Any], raw: str) -> Any:
    """The value of ``raw``, the text of ``f``'s variable, as ``f``'s declared type."""
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    try:
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise SettingsError(f"{f.metadata['env']}={raw!r} is not a valid {kind}") from None
    return raw


# LLMGATE_MEMCACHED's prefix for a name whose every address is a node (Thanos and Cortex
# spell their DNS discovery the same way).
DNS_PREFIX = "dns+"


def memcached_entries(text: str) -> list[tuple[tuple[str, int], bool]]:
    """LLMGATE_MEMCACHED's entries as ((host, port), by_dns), in the order given."""
    entries = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        by_dns = item.startswith(DNS_PREFIX)
        host, _, port = item.removeprefix(DNS_PREFIX).rpartition(":")
        if not host or not port.isdigit():
            raise SettingsError(
                f"LLMGATE_MEMCACHED entry {item!r} is not host:port or dns+name:port"
            )
        entries.append(((host.strip("[]"), int(port)), by_dns))
    return entries


def ops_allow_entries(text: str) -> tuple[str, ...]:
    """LLMGATE_OPS_ALLOW's entries (nginx checks their syntax when it starts)."""
    items = tuple(a.strip() for a in text.split(",") if a.strip())
    for item in items:
        if not re.fullmatch(r"all|[0-9A-Fa-f:.]+(/[0-9]{1,3})?", item):
            raise SettingsError(f"LLMGATE_OPS_ALLOW entry {item!r} is not an address or CIDR")
    return items


# gunicorn.conf.py's default worker_connections (LLMGATE_WORKER_CONNECTIONS); a test holds
# the two equal. The admission limits' defaults are shares of it, and nginx is sized from
# those (runner/sizing.py): 2 workers of 15,000 connections admit 12,000 streams, so
# `make run` holds 10,000 with room for the kernel spreading accepts unevenly over the
# workers (measured 5,100 / 4,900 at 10,000: docs/operations.md, "Capacity").
WORKER_CONNECTIONS = 15000


def worker_connections(environ: Mapping[str, str]) -> int:
    """LLMGATE_WORKER_CONNECTIONS, the one setting the stack's capacity follows."""
    raw = (environ.get("LLMGATE_WORKER_CONNECTIONS") or "").strip()
    try:
        connections = int(raw) if raw else WORKER_CONNECTIONS
    except ValueError:
        raise SettingsError(f"LLMGATE_WORKER_CONNECTIONS={raw!r} is not a valid int") from None
    if connections < 1:
        raise SettingsError("LLMGATE_WORKER_CONNECTIONS must be >= 1")
    return connections


def admission_defaults(environ: Mapping[str, str]) -> dict[str, int]:
    """The admission limits sized from LLMGATE_WORKER_CONNECTIONS: 4/5 of the worker's
    connections for requests, 2/5 for streams (Settings' defaults are these for 15000)."""
    connections = worker_connections(environ)
    return {
        "max_requests_per_worker": max(1, connections * 4 // 5),
        "max_streams_per_worker": max(1, connections * 2 // 5),
    }
