"""The overhead section's five paths to one simulator, started together and stopped together.

    direct        caller → simulator
    nginx-only    caller → nginx → simulator             (the same nginx template, no app)
    floor         caller → nginx → gunicorn → simulator  (the same shape, bench/floor/app.py)
    gateway       caller → nginx → gunicorn → simulator  (`make run`'s shape, cache off)
    gateway+keys  the gateway with its features on: a keys file whose key has per-key limits,
                  counted in Memcached; the caller sends that key

Every path reaches the one simulator the gateway's stack starts, so the upstream's own cost
is the same for all. The gateway runs with its metrics on and its JSON line per request off
(LLMGATE_LOG_REQUESTS=false: issue 25's "keys, limits and logs off"); gateway+keys as in
production: the line on, and the key's check and its limits' grant and settlement in
Memcached.
A path's CPU is that of its ``roots``' process trees (nginx, gunicorn); Memcached's is
counted apart (``memcached``), as it would run on another machine in a cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from app.core.config import Settings
from bench.floor import FLOOR_APP
from bench.kit.report import Config
from bench.load.compare import write_keys
from runner.nginx import NginxParams, start_nginx
from runner.procs import Proc, free_port
from runner.stack import Stack, StackOptions

# The key gateway+keys' callers send (its hash is all the keys file holds).
SECRET = "llmg-bench-overhead-secret"


@dataclass(frozen=True)
class Route:
    """Where one path is called, what its callers add, which processes are its own."""

    url: str
    roots: list[int]  # pids whose process trees' CPU is the path's: nginx, gunicorn
    headers: dict[str, str] = field(default_factory=dict)  # gateway+keys: the key
    memcached: list[int] = field(default_factory=list)  # counted apart from the path's CPU


@dataclass(frozen=True)
class Paths:
    stacks: dict[str, Stack]  # floor, gateway, gateway+keys
    routes: dict[str, Route]
    procs: list[Proc]  # every process started here: "ours" for machine.Others

    @property
    def gateway(self) -> Stack:
        """The gateway's stack: its simulator serves every path."""
        return self.stacks["gateway"]


def sizing(stack: Stack) -> dict[str, int]:
    """The stack's nginx and gunicorn sizes, as started (runner/sizing.py)."""
    found = getattr(stack, "sizing", None)
    keys = ("worker_connections", "streams", "nginx_workers", "nginx_connections")
    return {k: getattr(found, k) for k in keys if hasattr(found, k)}


def start_nginx_only(
    sim_url: str, run_dir: Path, workers: int = 1, connections: int = 8192
) -> tuple[Proc, str]:
    """The same nginx template with the simulator in place of gunicorn."""
    port = free_port()
    params = NginxParams.for_settings(
        Settings(),
        listen=f"127.0.0.1:{port}",
        app_servers=[sim_url.removeprefix("http://")],
        worker_processes=workers,
        worker_connections=connections,
    )
    proc = start_nginx(
        run_dir / "nginx-only",
        params,
        log_path=run_dir / "logs" / "nginx-only.log",
        name="nginx-only",
    )
    return proc, f"http://127.0.0.1:{port}"


def _roots(stack: Stack) -> list[int]:
    return [stack.proc("nginx").popen.pid, stack.proc("gunicorn").popen.pid]


@contextmanager
def started(cfg: Config, run_dir: Path, options: StackOptions) -> Iterator[Paths]:
    """The five paths, up; stopped when the block ends, however it ends. ``options`` are the
    gateway's (no Memcached, cache off); the floor and gateway+keys are started from them."""
    with ExitStack() as running:

        def start(options: StackOptions) -> Stack:
            stack = Stack(options)
            running.callback(stack.stop)
            return stack.start()

        cfg.progress("overhead: starting simulator, gunicorn (2 workers), nginx")
        gateway = start(options)
        upstream = gateway.sim_url + "/v1"
        cfg.progress("overhead: starting the floor (the same stack serving bench/floor/app.py)")
        floor = start(
            dataclasses.replace(
                options, run_dir=run_dir / "floor", upstream_url=upstream, wsgi_app=FLOOR_APP
            )
        )
        cfg.progress("overhead: starting gateway+keys (a keys file, per-key limits in Memcached)")
        keys = write_keys(run_dir, SECRET)
        keyed = start(
            dataclasses.replace(
                options,
                run_dir=run_dir / "keys",
                upstream_url=upstream,
                memcached=True,
                env={**options.env, "LLMGATE_KEYS_FILE": str(keys), "LLMGATE_LOG_REQUESTS": "true"},
            )
        )
        # nginx-only sized as the gateway's nginx, so the two differ by the app alone.
        size = sizing(gateway)
        nginx_only, nginx_url = start_nginx_only(
            gateway.sim_url,
            run_dir,
            size.get("nginx_workers", 1),
            size.get("nginx_connections", 8192),
        )
        running.callback(nginx_only.stop)
        routes = {
            "direct": Route(gateway.sim_url, []),
            "nginx-only": Route(nginx_url, [nginx_only.popen.pid]),
            "floor": Route(floor.url, _roots(floor)),
            "gateway": Route(gateway.url, _roots(gateway)),
            "gateway+keys": Route(
                keyed.url,
                _roots(keyed),
                {"Authorization": f"Bearer {SECRET}"},
                [keyed.proc("memcached").popen.pid],
            ),
        }
        procs = [*gateway.procs, *floor.procs, *keyed.procs, nginx_only]
        stacks = {"floor": floor, "gateway": gateway, "gateway+keys": keyed}
        yield Paths(stacks, routes, procs)
