"""Readiness probes: can this instance reach its upstream and its Memcached nodes?

A plain TCP connect (plus Memcached's `version`) with a short timeout: it needs no
credentials and bills nothing. Memcached being down degrades the cache (every lookup is a
miss) but does not make the instance unready; an unreachable upstream does.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from app.config import Settings

_PROBE_TIMEOUT_S = 1.0


def _probe(host: str, port: int, payload: bytes = b"", expect: bytes = b"") -> str | None:
    """None when the node answers, else the reason it did not."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as sock:
            if payload:
                sock.sendall(payload)
                if not sock.recv(64).startswith(expect):
                    return "unexpected reply"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def readiness(settings: Settings) -> tuple[bool, dict[str, Any]]:
    parts = urlsplit(settings.upstream_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    upstream_error = _probe(parts.hostname or "", port)
    checks: dict[str, Any] = {
        "upstream": {"ok": upstream_error is None, "target": f"{parts.hostname}:{port}"}
    }
    if upstream_error:
        checks["upstream"]["error"] = upstream_error
    nodes = []
    for host, node_port in settings.memcached_nodes:
        error = _probe(host, node_port, b"version\r\n", b"VERSION")
        node = {"node": f"{host}:{node_port}", "ok": error is None}
        if error:
            node["error"] = error
        nodes.append(node)
    if nodes:
        checks["memcached"] = {"ok": all(n["ok"] for n in nodes), "nodes": nodes}
    return upstream_error is None, checks
