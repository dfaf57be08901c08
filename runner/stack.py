"""The whole gateway on loopback: memcached, simulator, gunicorn (gevent) and nginx.

``Stack`` starts what is asked for, each on its own port, each waited on until it answers,
and stops everything in reverse order. `make run`, `make run-cluster`, the container image
(deploy/Dockerfile), the integration tests and the benchmarks all build the gateway through
it. With ``instances`` > 1 it is a cluster: several gunicorns, each its own instance with
its own metrics, behind one nginx upstream block, sharing ``memcached_nodes`` Memcached
nodes (consistent hashing), as several machines or pods would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.core.config import Settings, worker_connections
from app.upstream import catalog as upstreams
from runner import limits, postgres
from runner.claims import Claims, Listener
from runner.nginx import NginxParams, start_nginx, write_nginx_conf
from runner.procs import Proc, StartError, find_binary, free_port
from runner.sizing import Sizing, size_for
from runner.tls import self_signed

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class StackOptions:
    run_dir: Path
    port: int = 0  # public port (nginx, or gunicorn when nginx is off); 0 picks a free one
    workers: int = 2
    upstream_url: str = ""  # empty (and no LLMGATE_CONFIG in env): start the simulator
    nginx: bool = True
    memcached: bool = True
    env: dict[str, str] = field(default_factory=dict)  # LLMGATE_* for the gateway
    nginx_read_timeout_s: float | None = None  # default: above the gateway's deadline
    # None: sized from the gateway's capacity (runner/sizing.py), as `make run` does.
    nginx_worker_processes: int | None = None
    nginx_worker_connections: int | None = None
    simulator_args: list[str] = field(default_factory=list)
    # Where nginx listens (LLMGATE_HOST): loopback, or 0.0.0.0 in a container.
    host: str = "127.0.0.1"
    # gunicorn's address (LLMGATE_BIND) when it must be fixed (a pod's metrics port);
    # empty: a free loopback port. One instance only.
    app_bind: str = ""
    # The children's output on our own stdout (a container's log) instead of run_dir/logs.
    logs_to_stdout: bool = False
    instances: int = 1  # gunicorn instances behind nginx (make run-cluster: 3)
    # nginx's HTTPS + HTTP/2 listener: None none, 0 a free port; with no tls_cert/tls_key
    # a self-signed certificate in run_dir/tls (runner/tls.py).
    tls_port: int | None = None
    tls_cert: str = ""
    tls_key: str = ""
    memcached_nodes: int = 1  # Memcached nodes started (make run-cluster: 2)
    # Where they listen: node i on memcached_port + i (LLMGATE_MEMCACHED_PORT), and the
    # simulator on simulator_port (LLMGATE_SIMULATOR_PORT); 0: free ports.
    memcached_port: int = 0
    simulator_port: int = 0
    # Another WSGI app for gunicorn to serve in the gateway's place (bench/floor/'s
    # measuring stick), as gunicorn's APP_MODULE argument; empty: the gateway.
    wsgi_app: str = ""
    # A PostgreSQL of the stack's own for the spend ledger, in run_dir/postgres
    # (runner/postgres.py; make run-cluster where it is installed). Without it, and without
    # LLMGATE_LEDGER_URL, the ledger is run_dir/spend.sqlite3.
    postgres: bool = False


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.procs: list[Proc] = []
        self.sim_url = ""
        self.memcached_addrs: list[str] = []
        self.app_urls: list[str] = []
        self.url = ""
        self.tls_url = ""
        self.tls_cert = ""
        self.settings: Settings | None = None
        self.down: set[int] = set()  # instances nginx sends nothing to (a rolling restart)
        self._nginx_params: NginxParams | None = None
        self.sizing: Sizing | None = None
        self.claims: Claims | None = None
        self.postgres_url = ""  # the stack's own PostgreSQL, when it started one

    @property
    def memcached_addr(self) -> str:
        """The Memcached nodes as LLMGATE_MEMCACHED spells them ("" without)."""
        return ",".join(self.memcached_addrs)

    @property
    def app_url(self) -> str:
        return self.app_urls[0] if self.app_urls else ""

    @property
    def drain_file(self) -> Path:
        """While it exists the instance is unready (gunicorn's and nginx's /readyz answer
        503) and serves on: LLMGATE_DRAIN_FILE (a preStop hook's), else one in the run
        directory. runner/drain.py creates it on SIGTERM."""
        given = self.options.env.get("LLMGATE_DRAIN_FILE", "").strip()
        return Path(given).absolute() if given else self.options.run_dir.absolute() / "draining"

    # -- lifecycle ---------------------------------------------------------------------
    def listeners(self) -> list[Listener]:
        """The fixed addresses this stack will listen on (ports 0 are picked free later)."""
        opts = self.options
        found = []
        if opts.port:
            host = opts.host if opts.nginx else "127.0.0.1"
            found.append(Listener(host, opts.port, "LLMGATE_PORT"))
        if opts.nginx and opts.tls_port:
            found.append(Listener(opts.host, opts.tls_port, "LLMGATE_TLS_PORT"))
        for item in filter(None, opts.app_bind.split(",")):
            host, _, port = item.strip().rpartition(":")
            found.append(Listener(host, int(port), "LLMGATE_BIND", host_setting="LLMGATE_BIND"))
        if opts.memcached and opts.memcached_port:
            last = opts.memcached_port + opts.memcached_nodes - 1
            if last > 65535:
                raise StartError(
                    f"LLMGATE_MEMCACHED_PORT {opts.memcached_port} leaves no port for "
                    f"{opts.memcached_nodes} Memcached nodes (the last would be {last}); "
                    f"set it to {65536 - opts.memcached_nodes} or lower"
                )
            for node_port in range(opts.memcached_port, last + 1):
                found.append(
                    Listener("127.0.0.1", node_port, "LLMGATE_MEMCACHED_PORT", host_setting="")
                )
        if self.starts_simulator and opts.simulator_port:
            found.append(
                Listener(
                    "127.0.0.1", opts.simulator_port, "LLMGATE_SIMULATOR_PORT", host_setting=""
                )
            )
        return found

    @property
    def starts_simulator(self) -> bool:
        """No upstream is given (LLMGATE_UPSTREAM_URL, LLMGATE_CONFIG): the simulator is it."""
        opts = self.options
        return not opts.upstream_url and not opts.env.get("LLMGATE_CONFIG", "").strip()

    def claim(self) -> None:
        """Take this stack's ports and run directory, or raise StartError saying which one
        is taken (runner/claims.py). ``start`` does it when it was not done before."""
        if self.claims is not None:
            return
        claims = Claims()
        try:
            seen: dict[int, str] = {}
            for listener in self.listeners():
                if listener.port in seen:
                    raise StartError(
                        f"{seen[listener.port]} and {listener.setting} are both "
                        f"{listener.port}; set one of them to another port"
                    )
                seen[listener.port] = listener.setting
                claims.port(listener)
            claims.run_dir(self.options.run_dir)
        except BaseException:
            claims.release()
            raise
        self.claims = claims

    def start(self) -> Stack:
        opts = self.options
        if opts.app_bind and opts.instances != 1:
            raise ValueError("app_bind names one gunicorn address: one instance only")
        try:
            self.claim()
            # Left by a previous run (or its preStop hook: an emptyDir outlives a container
            # restart), it would keep this fresh instance unready.
            self.drain_file.unlink(missing_ok=True)
            # nginx workers run as nobody when we are root: they must reach the prefix.
            os.chmod(opts.run_dir, 0o755)
            if opts.memcached:
                for _ in range(opts.memcached_nodes):
                    self._start_memcached()
            if opts.postgres:
                self.start_postgres()
            if self.starts_simulator:
                self._start_simulator()
            for index in range(opts.instances):
                self.start_instance(index)
            if opts.nginx:
                self._start_nginx()
            else:
                self.url = self.app_url
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, graceful: bool = True) -> None:
        """Graceful: each process, last started first, gets SIGTERM and is waited for, so
        nginx stops taking calls before gunicorn drains its own and the upstream goes last
        (about 1.2 s for a gunicorn). Otherwise every process group is killed at once: for a
        stack whose stopping nobody observes, such as the tests' shared stacks at the end of
        the run. Each process is reaped before this returns; a gunicorn's workers, killed
        with it, may hold its port a moment longer."""
        if not graceful:
            for proc in self.procs:
                with contextlib.suppress(ProcessLookupError):  # gone already
                    proc.send_signal(signal.SIGKILL)
        while self.procs:
            proc = self.procs.pop()
            if graceful:
                proc.stop()
            else:
                proc.kill()
        if self.claims is not None:
            self.claims.release()
            self.claims = None

    def reload(self) -> None:
        """Fresh gunicorn workers (re-reading LLMGATE_CONFIG) and a re-read nginx config,
        without failing a call: old workers drain (app/streams/drain.py). A wrong upstreams file
        raises ConfigError and nothing is reloaded."""
        config = self.options.env.get("LLMGATE_CONFIG", "").strip()
        if config:
            environ = {**os.environ, **self.options.env}
            upstreams.load(Path(config).read_text(), environ, path=config)
        for index in range(self.options.instances):
            self.proc(self.instance_name(index)).popen.send_signal(signal.SIGHUP)
        if self.options.nginx:
            self.proc("nginx").popen.send_signal(signal.SIGHUP)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    # -- instances ---------------------------------------------------------------------
    def instance_name(self, index: int) -> str:
        return "gunicorn" if self.options.instances == 1 else f"gunicorn-{index}"

    def start_instance(self, index: int) -> Proc:
        """Start (or start again, on its old port) the gunicorn of instance ``index``."""
        opts = self.options
        if index < len(self.app_urls):
            app_port = int(self.app_urls[index].rsplit(":", 1)[1])
        elif opts.app_bind:
            app_port = int(opts.app_bind.rsplit(":", 1)[1])
        else:
            app_port = free_port() if opts.nginx or not opts.port else opts.port
        name = self.instance_name(index)
        env = self.gateway_env(app_port, instance=index)
        self.settings = Settings.from_env(env)
        argv = gunicorn_argv() + ([opts.wsgi_app] if opts.wsgi_app else [])
        log_path = self._log(name)
        proc = Proc(name, argv, log_path=log_path, env=env, cwd=ROOT, stdout=opts.logs_to_stdout)
        self.procs = [p for p in self.procs if p.name != name]
        self.procs.append(proc)
        url = f"http://127.0.0.1:{app_port}"
        if index < len(self.app_urls):
            self.app_urls[index] = url
        else:
            self.app_urls.append(url)
        proc.wait_http(url + "/healthz")
        return proc

    def stop_instance(self, index: int, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Stop instance ``index``'s gunicorn: SIGTERM drains it, SIGKILL is a crash."""
        proc = self.proc(self.instance_name(index))
        proc.stop(timeout=timeout, sig=sig)

    def set_down(self, index: int, down: bool) -> None:
        """Take instance ``index`` out of (or back into) nginx's upstream block and reload
        nginx: new requests go elsewhere, its open ones finish (old nginx workers keep them)."""
        if down:
            self.down.add(index)
        else:
            self.down.discard(index)
        assert self._nginx_params is not None
        self._nginx_params = self._nginx_params.with_down(
            tuple(self.app_urls[i].removeprefix("http://") for i in sorted(self.down))
        )
        write_nginx_conf(self.options.run_dir / "nginx", self._nginx_params)
        self.proc("nginx").popen.send_signal(signal.SIGHUP)

    # -- parts -------------------------------------------------------------------------
    def _log(self, name: str) -> Path:
        return self.options.run_dir / "logs" / f"{name}.log"

    def memcached_argv(self, port: int) -> list[str]:
        binary = find_binary("memcached")
        if binary is None:
            raise StartError("memcached is not installed (make setup installs it)")
        argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64", "-c", "4096"]
        if os.geteuid() == 0:
            argv += ["-u", "nobody"]
        return argv

    def _start_memcached(self) -> None:
        index = len(self.memcached_addrs)
        port = self.options.memcached_port + index if self.options.memcached_port else free_port()
        name = "memcached" if self.options.memcached_nodes == 1 else f"memcached-{index}"
        proc = Proc(
            name,
            self.memcached_argv(port),
            log_path=self._log(name),
            stdout=self.options.logs_to_stdout,
        )
        self.procs.append(proc)
        proc.wait_port(port)
        self.memcached_addrs.append(f"127.0.0.1:{port}")

    def start_postgres(self, port: int = 0) -> None:
        """The stack's own PostgreSQL (runner/postgres.py), on ``port`` when given (a restart
        where it was: its cluster is kept in the run directory)."""
        if port == 0 and self.postgres_url:
            port = int(self.postgres_url.rsplit(":", 1)[1].split("/")[0])
        port = port or free_port()
        proc = postgres.start(
            self.options.run_dir / "postgres",
            port,
            self._log("postgres"),
            stdout=self.options.logs_to_stdout,
        )
        self.procs.append(proc)
        self.postgres_url = postgres.url(port)

    @property
    def ledger_url(self) -> str:
        """The spend ledger's URL as the gateway is given it (LLMGATE_LEDGER_URL): the one set,
        else the stack's PostgreSQL, else a SQLite file in the run directory."""
        given = self.options.env.get("LLMGATE_LEDGER_URL", "").strip()
        default = str(self.options.run_dir.absolute() / "spend.sqlite3")
        return given or self.postgres_url or default

    def _start_simulator(self) -> None:
        port = self.options.simulator_port or free_port()
        argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        proc = Proc(
            "simulator",
            argv + self.options.simulator_args,
            log_path=self._log("simulator"),
            cwd=ROOT,
            stdout=self.options.logs_to_stdout,
        )
        self.procs.append(proc)
        self.sim_url = f"http://127.0.0.1:{port}"
        proc.wait_http(self.sim_url + "/healthz")

    def gateway_env(self, app_port: int, instance: int = 0) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
        env.update(
            LLMGATE_BIND=self.options.app_bind or f"127.0.0.1:{app_port}",
            LLMGATE_WORKERS=str(self.options.workers),
        )
        if self.sim_url:
            env["LLMGATE_UPSTREAM_URL"] = f"{self.sim_url}/v1"
        if self.options.upstream_url:
            env["LLMGATE_UPSTREAM_URL"] = self.options.upstream_url
        if self.memcached_addr:
            env["LLMGATE_MEMCACHED"] = self.memcached_addr
        env.update(self.options.env)
        env["LLMGATE_LEDGER_URL"] = self.ledger_url
        if self.options.app_bind:
            env["LLMGATE_BIND"] = self.options.app_bind
        env["LLMGATE_DRAIN_FILE"] = str(self.drain_file)
        env["PYTHONPATH"] = str(ROOT)
        # Each instance has its own metrics (gunicorn wipes the directory when it starts).
        metrics = "metrics" if self.options.instances == 1 else f"metrics-{instance}"
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.options.run_dir / metrics)
        return env

    def size(self) -> Sizing:
        """The stack's capacity from LLMGATE_WORKER_CONNECTIONS, the workers, this machine's
        cores and our hard descriptor limit (nginx's workers inherit it)."""
        env = self.gateway_env(0)
        return size_for(
            Settings.from_env(env),
            worker_connections(env),
            self.options.workers * self.options.instances,
            len(os.sched_getaffinity(0)),
            limits.read_kernel().nofile_hard,
        )

    def _start_nginx(self) -> None:
        opts = self.options
        assert self.settings is not None
        port = opts.port or free_port()
        self.sizing = self.size()
        explicit = {
            k: v
            for k, v in (
                ("worker_processes", opts.nginx_worker_processes),
                ("worker_connections", opts.nginx_worker_connections),
            )
            if v is not None
        }
        tls: dict[str, str] = {}
        if opts.tls_port is not None:
            tls_port = opts.tls_port or free_port()
            cert, key = opts.tls_cert, opts.tls_key
            if not cert:
                made = self_signed(opts.run_dir / "tls")
                cert, key = str(made[0]), str(made[1])
            tls = {
                "tls_listen": f"{opts.host}:{tls_port}",
                "tls_cert": str(Path(cert).resolve()),
                "tls_key": str(Path(key).resolve()),
            }
            self.tls_url, self.tls_cert = f"https://127.0.0.1:{tls_port}", tls["tls_cert"]
        params = NginxParams.for_settings(
            self.settings,
            listen=f"{opts.host}:{port}",
            app_servers=[u.removeprefix("http://") for u in self.app_urls],
            read_timeout_s=opts.nginx_read_timeout_s,
            app_workers=opts.workers * opts.instances,
            sizing=None if explicit else self.sizing,
            access_log="/dev/stdout" if opts.logs_to_stdout else "logs/access.log",
            drain_file=str(self.drain_file),
            **explicit,
            **tls,
        )
        self._nginx_params = params
        nginx = start_nginx(
            opts.run_dir / "nginx", params, log_path=self._log("nginx"), stdout=opts.logs_to_stdout
        )
        self.procs.append(nginx)
        self.url = f"http://127.0.0.1:{port}"
        nginx.wait_http(self.url + "/healthz")


def gunicorn_argv() -> list[str]:
    """The command that runs one gateway instance: gunicorn with our config file."""
    return [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")]
