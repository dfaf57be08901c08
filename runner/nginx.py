"""Renders nginx/llmgate.conf.template. Pure apart from reading the template file.

`python -m runner.nginx` (`make nginx-conf`) prints a config rendered from the current
LLMGATE_* environment, a starting point for /etc/nginx: its listeners, upstream servers and
certificate are those the settings name (``main``); the paths may need adjusting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.config import Settings, SettingsError, worker_connections
from runner.sizing import FD_SPARE, LISTEN_BACKLOG, Sizing, nginx_conn_limit, size_for

__all__ = ["NginxParams", "nginx_conn_limit", "render_nginx", "start_nginx", "write_nginx_conf"]

TEMPLATE = Path(__file__).resolve().parent.parent / "nginx" / "llmgate.conf.template"
# nginx's own answers while the runner drains: /readyz as the app words it (app/edge/routes.py),
# and a call gunicorn no longer takes as the app's gateway_shutdown (app/streams/drain.py).
DRAINING_READYZ = '{"ready":false,"checks":{"draining":true}}'
DRAINING_502 = (
    '{"error":{"message":"The gateway instance is shutting down; retry the request.",'
    '"type":"api_error","param":null,"code":"gateway_shutdown"}}'
)
# The same on the Messages door, in Anthropic's shape (a 503 there is overloaded_error).
DRAINING_502_ANTHROPIC = (
    '{"type":"error","error":{"type":"overloaded_error",'
    '"message":"The gateway instance is shutting down; retry the request."}}'
)
_FIELD = re.compile(r"\{\{ (\w+) \}\}")


@dataclass(frozen=True)
class NginxParams:
    listen: str
    app_servers: tuple[str, ...]
    max_body_bytes: int
    read_timeout_s: float
    send_timeout_s: float = 60.0
    worker_processes: int | str = "auto"
    worker_connections: int = 16384
    # worker_rlimit_nofile; 0: worker_connections + FD_SPARE, capped at our hard limit.
    rlimit_nofile: int = 0
    access_log: str = "off"
    # limit_conn over API requests in progress (0: none); for_settings derives it.
    conn_limit: int = 0
    # Passive health checks: after max_fails failed connects within fail_timeout, a server
    # gets nothing for fail_timeout (nginx ignores both when the block has one server).
    max_fails: int = 1
    fail_timeout_s: int = 5
    # Servers marked `down` (a rolling restart takes them out before stopping them).
    down: tuple[str, ...] = ()
    # Who may read /metrics, /status, /status.json and /admin/* (LLMGATE_OPS_ALLOW).
    ops_allow: tuple[str, ...] = ("127.0.0.1", "::1")
    # HTTPS with HTTP/2 on a second listener of the same server (empty: none); absolute
    # paths (a relative ssl_certificate is looked up next to nginx.conf).
    tls_listen: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # The runner's drain file (an absolute path; empty: none): while it exists nginx answers
    # /readyz 503 itself and a refused connect to gunicorn as a 503 gateway_shutdown.
    drain_file: str = ""

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        *,
        listen: str,
        app_servers: list[str],
        read_timeout_s: float | None = None,
        app_workers: int = 2,
        sizing: Sizing | None = None,
        **kw: Any,
    ) -> NginxParams:
        """``sizing`` (runner/sizing.py) sets nginx's workers, connections, descriptors and
        limit_conn from the gateway's capacity; without it, ``kw`` or the defaults do."""
        # nginx must never cut what the gateway still allows: its read timeout sits above
        # the gateway's total deadline (and so above the idle and first-byte timeouts).
        if read_timeout_s is None:
            read_timeout_s = (
                max(settings.deadline_s, settings.idle_timeout_s, settings.first_byte_timeout_s)
                + 30
            )
        sized: dict[str, Any] = {
            "conn_limit": nginx_conn_limit(settings.max_requests_per_worker, app_workers)
        }
        if sizing is not None:
            sized = {
                "conn_limit": sizing.conn_limit,
                "worker_processes": sizing.nginx_workers,
                "worker_connections": sizing.nginx_connections,
                "rlimit_nofile": sizing.nginx_nofile,
            }
        return cls(
            listen=listen,
            app_servers=tuple(app_servers),
            max_body_bytes=settings.max_body_bytes,
            read_timeout_s=read_timeout_s,
            send_timeout_s=settings.send_timeout_s,
            ops_allow=settings.ops_allow_list,
            **{**sized, **kw},
        )

    def with_down(self, down: tuple[str, ...]) -> NginxParams:
        return dataclasses.replace(self, down=down)

    def values(self) -> dict[str, str]:
        rlimit = self.rlimit_nofile
        if not rlimit:
            # One descriptor per connection (caller's or gunicorn's alike) and a few of
            # nginx's own; above the hard limit nginx fails with EPERM.
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = self.worker_connections + FD_SPARE
            rlimit = want if hard == resource.RLIM_INFINITY else min(want, hard)
        return {
            # As root the workers drop to nobody; as anyone else the directive is moot.
            "user_line": "user nobody nogroup;" if os.geteuid() == 0 else "",
            "worker_processes": str(self.worker_processes),
            "worker_rlimit_nofile": str(rlimit),
            "worker_connections": str(self.worker_connections),
            "access_log": self.access_log
            if self.access_log == "off"
            else f"{self.access_log} llmgate_json",
            "app_servers": "\n        ".join(self._server_line(s) for s in self.app_servers),
            "listen": self.listen,
            "max_body": str(self.max_body_bytes),
            "max_body_bytes": str(self.max_body_bytes),
            "read_timeout": f"{round(self.read_timeout_s * 1000)}ms",
            "send_timeout": f"{round(self.send_timeout_s * 1000)}ms",
            "ops_allow": " ".join(f"allow {a};" for a in self.ops_allow) or "# none allowed",
            "tls": self._tls(),
            **self._drain(),
            "limit_conn": f"limit_conn llmgate_admission {self.conn_limit};"
            if self.conn_limit
            else "# no limit_conn: LLMGATE_MAX_REQUESTS_PER_WORKER is 0 (no limit)",
        }

    def _tls(self) -> str:
        if not self.tls_listen:
            return "# no HTTPS listener (LLMGATE_TLS_PORT 0)"
        # nginx 1.22 names HTTP/2 on the listen line (the `http2` directive came in 1.25.1).
        # An SSE stream over HTTP/2 is one h2 stream: proxy_buffering off still sends each
        # event as a DATA frame when it arrives, and nginx speaks HTTP/1.1 to gunicorn.
        lines = [
            f"listen {self.tls_listen} ssl http2 reuseport backlog={LISTEN_BACKLOG};",
            f"ssl_certificate {self.tls_cert};",
            f"ssl_certificate_key {self.tls_key};",
            "ssl_protocols TLSv1.2 TLSv1.3;",
            # Resumed sessions skip the full handshake for callers that reconnect.
            "ssl_session_cache shared:llmgate_tls:10m;",
            "ssl_session_timeout 1h;",
            # nginx's default, written out: 100 concurrent streams from one client fit.
            "http2_max_concurrent_streams 128;",
        ]
        return "\n        ".join(lines)

    def _drain(self) -> dict[str, str]:
        if not self.drain_file:
            none = "# no drain file: nginx answers nothing itself"
            return {"drain_readyz": none, "drain_502": none, "drain_502_anthropic": none}
        # `if` with a `return` is the one use of it nginx documents as safe in a location.
        test = f"if (-f {json.dumps(self.drain_file, ensure_ascii=False)})"
        return {
            "drain_readyz": f"{test} {{ return 503 '{DRAINING_READYZ}\\n'; }}\n"
            "            default_type application/json;",
            "drain_502": f"{test} {{ return 503 '{DRAINING_502}\\n'; }}",
            "drain_502_anthropic": f"{test} {{ return 503 '{DRAINING_502_ANTHROPIC}\\n'; }}",
        }

    def _server_line(self, address: str) -> str:
        checks = f"max_fails={self.max_fails} fail_timeout={self.fail_timeout_s}s"
        return f"server {address} {checks}{' down' if address in self.down else ''};"


def render_nginx(params: NginxParams, template: str | None = None) -> str:
    text = TEMPLATE.read_text() if template is None else template
    values = params.values()
    missing = set(_FIELD.findall(text)) - values.keys()
    if missing:
        raise KeyError(f"template fields without a value: {sorted(missing)}")
    return _FIELD.sub(lambda m: values[m.group(1)], text)


def write_nginx_conf(prefix: Path, params: NginxParams) -> Path:
    """Render ``params`` into ``prefix``/nginx.conf (for a start, or before a reload)."""
    for path in (prefix, prefix / "tmp", prefix / "logs"):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    conf = prefix / "nginx.conf"
    conf.write_text(render_nginx(params))
    return conf


def start_nginx(
    prefix: Path, params: NginxParams, *, log_path: Path, name: str = "nginx", stdout: bool = False
):
    """Render ``params`` into ``prefix`` and run nginx there until it answers on its port.

    The prefix holds the config, pid and temp files (nothing under /etc). As root nginx's
    workers run as nobody, so the prefix is made world-traversable.
    """
    from runner.procs import Proc, StartError, find_binary

    binary = find_binary("nginx")
    if binary is None:
        raise StartError("nginx is not installed (make setup installs it)")
    conf = write_nginx_conf(prefix, params)
    argv = [binary, "-p", str(prefix), "-c", str(conf), "-e", "stderr"]
    proc = Proc(name, argv, log_path=log_path, stdout=stdout)
    host, _, port = params.listen.rpartition(":")
    proc.wait_port(int(port), host or "127.0.0.1")
    return proc


def main() -> None:
    """`make nginx-conf`: the config for the current LLMGATE_* environment, listening where
    `make run` would (LLMGATE_HOST, LLMGATE_PORT, LLMGATE_TLS_PORT) and proxying to gunicorn
    where it listens (LLMGATE_BIND, else gunicorn.conf.py's 127.0.0.1:8000)."""
    from runner.settings import RunnerSettings, with_values

    try:
        runner = RunnerSettings.from_env(os.environ)
        settings = Settings.from_env(os.environ)
        connections = worker_connections(os.environ)
    except SettingsError as exc:
        raise SystemExit(f"llmgate: {with_values(str(exc), os.environ)}") from None
    # A system nginx starts as root and may raise its own descriptor limit: sized uncapped.
    sizing = size_for(settings, connections, runner.workers, os.cpu_count() or 1, None)
    # HTTPS with the operator's certificate, else the self-signed one `make run` keeps
    # (runner/tls.py); none with LLMGATE_TLS_PORT 0.
    made = (runner.run_dir / "tls").absolute()
    tls_listen = f"{runner.host}:{runner.tls_port}" if runner.tls_port else ""
    print(
        render_nginx(
            NginxParams.for_settings(
                settings,
                listen=f"{runner.host}:{runner.port}",
                app_servers=app_servers(runner.bind),
                app_workers=runner.workers,
                sizing=sizing,
                access_log="/var/log/nginx/llmgate.access.log",
                tls_listen=tls_listen,
                tls_cert=(settings.tls_cert or str(made / "llmgate.crt")) if tls_listen else "",
                tls_key=(settings.tls_key or str(made / "llmgate.key")) if tls_listen else "",
            )
        )
    )


def app_servers(bind: tuple[tuple[str, int], ...]) -> list[str]:
    """nginx's upstream servers for gunicorn's LLMGATE_BIND: each address it listens on, a
    wildcard one reached on loopback; gunicorn.conf.py's default when none is given."""
    wildcard = ("0.0.0.0", "", "*")
    servers = [f"{'127.0.0.1' if host in wildcard else host}:{port}" for host, port in bind]
    return servers or ["127.0.0.1:8000"]


if __name__ == "__main__":
    main()
