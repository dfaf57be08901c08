"""Readiness probes: can this instance reach its upstreams and its Memcached nodes?

A plain TCP connect (plus Memcached's `version`) with a short timeout: it needs no
credentials and bills nothing. Memcached being down degrades the cache (every lookup is a
miss) but does not make the instance unready; no reachable upstream at all does. Every
target is probed at once (gevent sockets, a greenlet each), so the answer takes one probe's
timeout however many targets are silent: probed one after another, three silent ones would
outlast the orchestrator's probe timeout and take a healthy instance out of service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import gevent
from gevent import socket

from app.core.config import Settings
from app.store.discovery import resolve
from app.upstream.catalog import UpstreamSpec

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


def readiness(
    settings: Settings, upstreams: Sequence[UpstreamSpec], states: Mapping[str, str]
) -> tuple[bool, dict[str, Any]]:
    """Ready while at least one upstream answers a connect; each upstream's breaker state
    (``states``, by name) is shown beside it."""
    nodes = []
    # A dns+ name (LLMGATE_MEMCACHED) is probed as what it resolves to now.
    memcached = list(settings.memcached_nodes)
    for name, name_port in settings.memcached_dns:
        try:
            memcached += [node for node in resolve(name, name_port) if node not in memcached]
        except OSError as exc:
            nodes.append({"node": f"dns+{name}:{name_port}", "ok": False, "error": str(exc)})
    probes = [gevent.spawn(_probe, *spec.host) for spec in upstreams] + [
        gevent.spawn(_probe, host, node_port, b"version\r\n", b"VERSION")
        for host, node_port in memcached
    ]
    gevent.joinall(probes)
    errors = [probe.get() for probe in probes]  # a probe's own bug raises here
    targets = []
    for spec, error in zip(upstreams, errors[: len(upstreams)], strict=True):
        host, port = spec.host
        target = {"name": spec.name, "target": f"{host}:{port}", "ok": error is None}
        target["state"] = states.get(spec.name, "closed")
        if error:
            target["error"] = error
        targets.append(target)
    upstream_ok = any(t["ok"] for t in targets)
    checks: dict[str, Any] = {"upstream": {"ok": upstream_ok, "upstreams": targets}}
    for (host, node_port), error in zip(memcached, errors[len(upstreams) :], strict=True):
        node = {"node": f"{host}:{node_port}", "ok": error is None}
        if error:
            node["error"] = error
        nodes.append(node)
    if nodes:
        checks["memcached"] = {"ok": all(n["ok"] for n in nodes), "nodes": nodes}
    return upstream_ok, checks


def drain_requested(path: str) -> bool:
    """True while the operator's drain file (LLMGATE_DRAIN_FILE) exists."""
    return bool(path) and os.path.exists(path)
