"""The kernel's limits that decide how many streams the stack can hold, checked at start.

Each one fails silently when it is too low: a descriptor limit caps a process (accepts fail
with EMFILE, nginx logs "worker_connections are not enough"), a listen backlog is cut to
``net.core.somaxconn`` (connects beyond it wait for SYN retries), loopback connections run
out of local ports (EADDRNOTAVAIL). We never change a sysctl; ``warnings`` names the limit,
its value and what to set in one line, and docs/operations.md (DOCS) says why and how; and
``raise_nofile`` raises our own soft descriptor limit to the hard one (the children inherit
it). ``read_kernel`` is the only reader of /proc and
``resource``; ``warnings`` is pure.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass
from pathlib import Path

from runner.sizing import LISTEN_BACKLOG, NGINX_KEEPALIVE, Sizing

SYSCTL = Path("/proc/sys")
# The local ports Linux uses by default (net.ipv4.ip_local_port_range 32768 60999).
WIDE_PORT_RANGE = "1024 65535"


@dataclass(frozen=True)
class Kernel:
    """The values read; None where this system has no such file."""

    nofile_soft: int
    nofile_hard: int | None  # None: unlimited
    somaxconn: int | None = None
    port_range: tuple[int, int] | None = None
    tw_reuse: int | None = None
    file_max: int | None = None

    @property
    def ports(self) -> int | None:
        """Local ports for the connections to one address (the kernel picks per 4-tuple)."""
        if self.port_range is None:
            return None
        low, high = self.port_range
        return high - low + 1


def _sysctl(name: str) -> list[int] | None:
    with contextlib.suppress(OSError, ValueError):
        return [int(v) for v in (SYSCTL / name.replace(".", "/")).read_text().split()]
    return None


def _one(name: str) -> int | None:
    values = _sysctl(name)
    return values[0] if values else None


def _nofile() -> tuple[int, int | None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, None if hard == resource.RLIM_INFINITY else hard


def raise_nofile() -> None:
    """Soft descriptor limit := hard (or fs.nr_open under an unlimited hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = (_sysctl("fs.nr_open") or [1048576])[0]
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def read_kernel() -> Kernel:
    soft, hard = _nofile()
    ports = _sysctl("net.ipv4.ip_local_port_range")
    return Kernel(
        nofile_soft=soft,
        nofile_hard=hard,
        somaxconn=_one("net.core.somaxconn"),
        port_range=(ports[0], ports[1]) if ports and len(ports) == 2 else None,
        tw_reuse=_one("net.ipv4.tcp_tw_reuse"),
        file_max=_one("fs.file-max"),
    )


# Where each warning's explanation and fix are written out (the heading of that section).
DOCS = "docs/operations.md#kernel-limits"


def warnings(kernel: Kernel, sizing: Sizing, *, instances: int = 1) -> list[str]:
    """What is too low for ``sizing`` (the stack of app/core/config.py's settings): one line each,
    with the value, what it costs, the figure or command to set and where the docs say why
    and how (DOCS)."""
    found = []
    hard, soft = kernel.nofile_hard, kernel.nofile_soft
    if hard is not None and soft < hard:
        found.append(
            f"RLIMIT_NOFILE soft limit {soft} is below the hard {hard} and was not raised: "
            f"set `ulimit -n {hard}`"
        )
    # Said in the banner's terms: API requests at once (streams among them), the capacity
    # being the smallest bound (runner/sizing.py).
    if hard is not None and sizing.gunicorn_fits:
        found.append(
            f"RLIMIT_NOFILE hard limit {hard} < {sizing.gunicorn_nofile} a gunicorn worker "
            f"needs (LLMGATE_WORKER_CONNECTIONS={sizing.worker_connections}): they hold "
            f"{sizing.gunicorn_fits} API requests at once; raise it"
        )
    if sizing.capped:
        found.append(
            f"RLIMIT_NOFILE hard limit {hard} < {sizing.wanted_nginx_nofile} nginx wants: it "
            f"admits {sizing.conn_limit} API requests at once, not "
            f"{sizing.requests or 'any number'}; raise it to {sizing.wanted_nginx_nofile}"
        )
    if kernel.somaxconn is not None and kernel.somaxconn < LISTEN_BACKLOG:
        found.append(
            f"net.core.somaxconn {kernel.somaxconn} < the listen backlog {LISTEN_BACKLOG}: "
            f"a burst of connects waits for SYN retries; set it to {LISTEN_BACKLOG}"
        )
    ports = kernel.ports
    # nginx opens every proxied request's connection to one gunicorn address, and a worker
    # its upstream connections to one upstream address: each needs a local port.
    per_instance = sizing.requests // max(1, instances) or (
        sizing.worker_connections * sizing.app_workers // max(1, instances)
    )
    need = per_instance + NGINX_KEEPALIVE * sizing.nginx_workers
    if ports is not None and ports < need:
        low, high = kernel.port_range or (0, 0)
        found.append(
            f"net.ipv4.ip_local_port_range {low} {high} has {ports} ports < {need} "
            f"connections to one address: connects fail; set it to '{WIDE_PORT_RANGE}'"
        )
    if kernel.tw_reuse == 0:
        found.append(
            "net.ipv4.tcp_tw_reuse is 0: each closed connection holds its local port for 60 s; "
            "set it to 2"
        )
    total = sizing.gunicorn_nofile * sizing.app_workers + sizing.nginx_nofile * sizing.nginx_workers
    if kernel.file_max is not None and kernel.file_max < total:
        found.append(
            f"fs.file-max {kernel.file_max} < {total} descriptors the stack may hold: "
            f"set it to {total * 2}"
        )
    return [f"{line} ({DOCS})" for line in found]
