"""Before the start: does each upstream's host name resolve? A warning, never a refusal.

A name that does not resolve (a typo, a private name outside its network, no DNS in a
container) lets the stack start and answer /healthz, then fails every call with a 502
``upstream_unreachable`` whose message only a caller sees. `make run` looks the names up
once, all at once and within LOOKUP_S, and says so in one line per name
(docs/troubleshooting.md). A lookup still running after LOOKUP_S is reported as slow,
not waited for. ``targets`` is pure; ``unresolved`` does the lookups.
"""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.core.config import Settings
from app.upstream.catalog import ConfigError, UpstreamSpec, from_environment, load

LOOKUP_S = 3.0
DOCS = "docs/troubleshooting.md#an-upstream-that-cannot-be-reached"

Lookup = Callable[[str, int], object]


def targets(settings: Settings, environ: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """(upstream name, host, port) for every upstream with a fixed host name. None for the
    simulator, a host made from the model ({model}), or an upstreams file that does not
    load (gunicorn refuses that one at start with its line and field)."""
    specs: Sequence[UpstreamSpec]
    if settings.config_file:
        try:
            specs = load(Path(settings.config_file).read_text(), environ, path="config")
        except (OSError, ConfigError):
            return []
    elif settings.upstream_url:
        specs = from_environment(settings.upstream_url, "")
    else:
        return []
    found = []
    for spec in specs:
        host, port = spec.host
        if host and "{model}" not in spec.base_url.split("/")[2]:
            found.append((spec.name, host, port))
    return found


def _lookup(host: str, port: int) -> object:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def unresolved(
    found: Sequence[tuple[str, str, int]], lookup: Lookup = _lookup, wait_s: float = LOOKUP_S
) -> list[str]:
    """One warning line for each host that did not resolve within ``wait_s``."""
    if not found:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(found)))
    try:
        futures = [pool.submit(lookup, host, port) for _, host, port in found]
        concurrent.futures.wait(futures, timeout=wait_s)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    lines = []
    for (name, host, _), future in zip(found, futures, strict=True):
        if not future.done():
            why = f"no answer within {wait_s:g} s"
        elif isinstance(future.exception(), OSError):
            error = future.exception()
            why = getattr(error, "strerror", None) or str(error)
        else:
            continue
        lines.append(
            f"upstream {name}: host {host} does not resolve ({why}); its calls will fail "
            f"with 502 upstream_unreachable ({DOCS})"
        )
    return lines
