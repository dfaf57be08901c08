"""The whole gateway on loopback: memcached, simulator, gunicorn (gevent) and nginx.

``Stack`` starts what is asked for, each on its own port, each waited on until it answers,
and stops everything in reverse order. `make run`, the integration tests and the benchmarks
all build the gateway through it.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app import upstreams
from app.config import Settings
from runner.nginx import NginxParams, start_nginx
from runner.procs import Proc, StartError, find_binary, free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class StackOptions:
    run_dir: Path
    port: int = 0  # public port (nginx, or gunicorn when nginx is off); 0 picks a free one
    workers: int = 2
    upstream_url: str = ""  # empty: start the simulator
    nginx: bool = True
    memcached: bool = True
    env: dict[str, str] = field(default_factory=dict)  # LLMGATE_* for the gateway
    nginx_read_timeout_s: float | None = None  # default: above the gateway's deadline
    nginx_worker_processes: int = 1
    nginx_worker_connections: int = 4096
    simulator_args: list[str] = field(default_factory=list)


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.procs: list[Proc] = []
        self.sim_url = ""
        self.memcached_addr = ""
        self.app_url = ""
        self.url = ""
        self.settings: Settings | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Stack:
        opts = self.options
        opts.run_dir.mkdir(parents=True, exist_ok=True)
        # nginx workers run as nobody when we are root: they must reach the prefix.
        os.chmod(opts.run_dir, 0o755)
        try:
            if opts.memcached:
                self._start_memcached()
            if not opts.upstream_url:
                self._start_simulator()
            self._start_gunicorn()
            if opts.nginx:
                self._start_nginx()
            else:
                self.url = self.app_url
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        while self.procs:
            self.procs.pop().stop()

    def reload(self) -> None:
        """Fresh gunicorn workers (re-reading LLMGATE_CONFIG) and a re-read nginx config,
        without failing a call: old workers drain (app/lifecycle.py). A wrong upstreams file
        raises ConfigError and nothing is reloaded."""
        config = self.options.env.get("LLMGATE_CONFIG", "").strip()
        if config:
            environ = {**os.environ, **self.options.env}
            upstreams.load(Path(config).read_text(), environ, path=config)
        self.proc("gunicorn").popen.send_signal(signal.SIGHUP)
        if self.options.nginx:
            self.proc("nginx").popen.send_signal(signal.SIGHUP)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    # -- parts -------------------------------------------------------------------------
    def _log(self, name: str) -> Path:
        return self.options.run_dir / "logs" / f"{name}.log"

    def _start_memcached(self) -> None:
        binary = find_binary("memcached")
        if binary is None:
            raise StartError("memcached is not installed (make setup installs it)")
        port = free_port()
        argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64", "-c", "4096"]
        if os.geteuid() == 0:
            argv += ["-u", "nobody"]
        proc = Proc("memcached", argv, log_path=self._log("memcached"))
        self.procs.append(proc)
        proc.wait_port(port)
        self.memcached_addr = f"127.0.0.1:{port}"

    def _start_simulator(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        proc = Proc(
            "simulator",
            argv + self.options.simulator_args,
            log_path=self._log("simulator"),
            cwd=ROOT,
        )
        self.procs.append(proc)
        self.sim_url = f"http://127.0.0.1:{port}"
        proc.wait_http(self.sim_url + "/healthz")

    def gateway_env(self, app_port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
        env.update(
            LLMGATE_UPSTREAM_URL=self.options.upstream_url or f"{self.sim_url}/v1",
            LLMGATE_BIND=f"127.0.0.1:{app_port}",
            LLMGATE_WORKERS=str(self.options.workers),
        )
        if self.memcached_addr:
            env["LLMGATE_MEMCACHED"] = self.memcached_addr
        env.update(self.options.env)
        env["PYTHONPATH"] = str(ROOT)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.options.run_dir / "metrics")
        return env

    def _start_gunicorn(self) -> None:
        opts = self.options
        app_port = free_port() if opts.nginx or not opts.port else opts.port
        env = self.gateway_env(app_port)
        self.settings = Settings.from_env(env)
        argv = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")]
        proc = Proc("gunicorn", argv, log_path=self._log("gunicorn"), env=env, cwd=ROOT)
        self.procs.append(proc)
        self.app_url = f"http://127.0.0.1:{app_port}"
        proc.wait_http(self.app_url + "/healthz")

    def _start_nginx(self) -> None:
        opts = self.options
        assert self.settings is not None
        port = opts.port or free_port()
        params = NginxParams.for_settings(
            self.settings,
            listen=f"127.0.0.1:{port}",
            app_servers=[self.app_url.removeprefix("http://")],
            worker_processes=opts.nginx_worker_processes,
            worker_connections=opts.nginx_worker_connections,
            read_timeout_s=opts.nginx_read_timeout_s,
            app_workers=opts.workers,
            access_log="logs/access.log",
        )
        self.procs.append(start_nginx(opts.run_dir / "nginx", params, log_path=self._log("nginx")))
        self.url = f"http://127.0.0.1:{port}"
        self.procs[-1].wait_http(self.url + "/healthz")
