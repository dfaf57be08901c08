"""One setting sizes the whole stack: gunicorn's connections make nginx's. No I/O here.

``LLMGATE_WORKER_CONNECTIONS`` (gunicorn's ``worker_connections``) times the gunicorn workers is
the gateway's capacity; the app's admission limits are shares of it
(app/core/config_reading.py, ``admission_defaults``) and nginx is sized from those:

- ``limit_conn`` (nginx's outer guard): the app's request limit over every worker plus
  headroom (``nginx_conn_limit``), so the app refuses first;
- nginx's connections: each proxied request holds two (the caller's and gunicorn's), spread
  over ``worker_processes`` (one per core, ``listen … reuseport`` gives each its own accept
  queue) with room for the busier worker and nginx's idle keep-alive connections;
- ``worker_rlimit_nofile``: one descriptor per connection plus a few of nginx's own.

A process cannot raise its descriptor limit above the hard limit (nginx fails with EPERM),
so when the hard limit is lower, nginx gets what fits and its ``limit_conn`` shrinks to what
its connections can carry: callers beyond it get nginx's JSON 429, never a dropped
connection. ``Sizing.capped`` says so and runner/limits.py warns.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.config import Settings

# nginx's idle keep-alive connections to gunicorn, per nginx worker (`keepalive` in
# nginx/llmgate.conf.template's upstream block). Idle ones are never more than the worker's
# busiest moment had; the cap keeps them all through a lull, so the next burst reuses them
# instead of opening hundreds of connections that wait in gunicorn's accept queue (a gevent
# worker of several takes one a turn of its loop): 128 made the tail of 800 callers wait
# seconds there (docs/performance.md, "The public method").
NGINX_KEEPALIVE = 1024
# reuseport spreads connections over nginx's workers by a hash of the caller's address and
# port: even on average, not exactly; the busier worker gets this much room.
NGINX_SPREAD = 1.1
# Descriptors a process holds besides its connections: listeners, logs, the pid file, files
# of Python's imports, Memcached connections.
FD_SPARE = 256
# The listen backlog of nginx (nginx/llmgate.conf.template) and gunicorn (gunicorn.conf.py);
# the kernel cuts it to net.core.somaxconn (tests/unit/runner/test_sizing.py holds them equal).
LISTEN_BACKLOG = 4096


def nginx_conn_limit(requests_per_worker: int, app_workers: int) -> int:
    """nginx's outer guard: the app's request limit over all its workers plus 1/10 (at least
    8) of headroom, so the app, which answers per worker and per kind, refuses first. The
    headroom covers what nginx counts and the app does not: bodies still being uploaded,
    answers still draining to slow callers, callers spread unevenly over the workers.
    0 (no app limit) is no nginx limit either."""
    if requests_per_worker <= 0:
        return 0
    total = requests_per_worker * max(1, app_workers)
    return total + max(8, -(-total // 10))


@dataclass(frozen=True)
class Sizing:
    app_workers: int  # gunicorn workers over every instance
    worker_connections: int  # gunicorn's, per worker
    requests: int  # the app's request limit over every worker (0: none)
    streams: int  # the app's stream limit over every worker (0: bounded by requests only)
    nginx_workers: int
    nginx_connections: int  # nginx's worker_connections, per nginx worker
    nginx_nofile: int  # nginx's worker_rlimit_nofile
    conn_limit: int  # nginx's limit_conn over API requests (0: none)
    gunicorn_nofile: int  # descriptors a gunicorn worker may need at its limits
    wanted_nginx_nofile: int  # what nginx would take without the hard limit
    capped: bool  # the hard descriptor limit made nginx (and limit_conn) smaller
    # Requests every gunicorn worker together can hold under the hard descriptor limit (a
    # request holds its caller's connection and its upstream one); 0: the limit is not lower.
    gunicorn_fits: int = 0

    @property
    def request_capacity(self) -> int:
        """API requests (streams among them) the stack admits at once: the app's limit, or
        gunicorn's connections without one, within nginx's guard and the descriptors."""
        return self._within(self.requests or self.app_workers * self.worker_connections)

    @property
    def stream_capacity(self) -> int:
        """Streams the stack admits at once: the app's stream limit (its request limit
        without one), within nginx's guard and the descriptors. The banner of `make run`
        says it, with ``request_capacity``."""
        return self._within(self.streams or self.request_capacity)

    def _within(self, app: int) -> int:
        bounds = [app] + [b for b in (self.conn_limit, self.gunicorn_fits) if b]
        return min(bounds)


def size(
    *,
    app_workers: int,
    worker_connections: int,
    requests_per_worker: int,
    streams_per_worker: int,
    cpus: int,
    nofile_hard: int | None,
) -> Sizing:
    """The stack's sizes for ``app_workers`` gunicorn workers (over every instance) on
    ``cpus`` cores with a hard descriptor limit of ``nofile_hard`` (None: unlimited)."""
    app_workers = max(1, app_workers)
    nginx_workers = max(1, cpus)
    conn_limit = nginx_conn_limit(requests_per_worker, app_workers)
    # With no request limit gunicorn's connections are the bound.
    proxied = conn_limit or app_workers * worker_connections
    connections = -(-int(2 * proxied * NGINX_SPREAD) // nginx_workers) + NGINX_KEEPALIVE
    wanted = connections + FD_SPARE
    nofile, capped = wanted, False
    if nofile_hard is not None and wanted > nofile_hard:
        nofile, capped = nofile_hard, True
        connections = max(NGINX_KEEPALIVE + 2, nofile_hard - FD_SPARE)
        fits = int((connections - NGINX_KEEPALIVE) * nginx_workers / (2 * NGINX_SPREAD))
        conn_limit = min(conn_limit, fits) if conn_limit else fits
    # A gunicorn worker: its callers' connections, an upstream one per request in progress.
    upstream = requests_per_worker if requests_per_worker > 0 else worker_connections
    gunicorn_nofile = worker_connections + upstream + FD_SPARE
    gunicorn_fits = 0
    if nofile_hard is not None and nofile_hard < gunicorn_nofile:
        gunicorn_fits = max(1, (nofile_hard - FD_SPARE) // 2) * app_workers
    return Sizing(
        app_workers=app_workers,
        worker_connections=worker_connections,
        requests=max(0, requests_per_worker) * app_workers,
        streams=max(0, streams_per_worker) * app_workers,
        nginx_workers=nginx_workers,
        nginx_connections=connections,
        nginx_nofile=nofile,
        conn_limit=conn_limit,
        gunicorn_nofile=gunicorn_nofile,
        wanted_nginx_nofile=wanted,
        capped=capped,
        gunicorn_fits=gunicorn_fits,
    )


def size_for(
    settings: Settings,
    worker_connections: int,
    app_workers: int,
    cpus: int,
    nofile_hard: int | None,
) -> Sizing:
    """``size`` with the admission limits of ``settings``."""
    return size(
        app_workers=app_workers,
        worker_connections=worker_connections,
        requests_per_worker=settings.max_requests_per_worker,
        streams_per_worker=settings.max_streams_per_worker,
        cpus=cpus,
        nofile_hard=nofile_hard,
    )
