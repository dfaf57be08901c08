"""Renders nginx/llmgate.conf.template. Pure apart from reading the template file.

`python -m runner.nginx` prints a config rendered from the current LLMGATE_* environment,
a starting point for /etc/nginx (adjust `listen`, the upstream servers and the paths).
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config import Settings

TEMPLATE = Path(__file__).resolve().parent.parent / "nginx" / "llmgate.conf.template"
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

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        *,
        listen: str,
        app_servers: list[str],
        read_timeout_s: float | None = None,
        app_workers: int = 2,
        **kw: Any,
    ) -> NginxParams:
        # nginx must never cut what the gateway still allows: its read timeout sits above
        # the gateway's total deadline (and so above the idle and first-byte timeouts).
        if read_timeout_s is None:
            read_timeout_s = (
                max(settings.deadline_s, settings.idle_timeout_s, settings.first_byte_timeout_s)
                + 30
            )
        return cls(
            listen=listen,
            app_servers=tuple(app_servers),
            max_body_bytes=settings.max_body_bytes,
            read_timeout_s=read_timeout_s,
            send_timeout_s=settings.send_timeout_s,
            conn_limit=nginx_conn_limit(settings.max_requests_per_worker, app_workers),
            ops_allow=settings.ops_allow_list,
            **kw,
        )

    def with_down(self, down: tuple[str, ...]) -> NginxParams:
        return dataclasses.replace(self, down=down)

    def values(self) -> dict[str, str]:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 2 * self.worker_connections + 64
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
            "limit_conn": f"limit_conn llmgate_admission {self.conn_limit};"
            if self.conn_limit
            else "# no limit_conn: LLMGATE_MAX_REQUESTS_PER_WORKER is 0 (no limit)",
        }

    def _server_line(self, address: str) -> str:
        checks = f"max_fails={self.max_fails} fail_timeout={self.fail_timeout_s}s"
        return f"server {address} {checks}{' down' if address in self.down else ''};"


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


if __name__ == "__main__":
    settings = Settings.from_env(os.environ)
    print(
        render_nginx(
            NginxParams.for_settings(
                settings,
                listen="8080",
                app_servers=["127.0.0.1:8000"],
                app_workers=int(os.environ.get("LLMGATE_WORKERS", "2")),
                access_log="/var/log/nginx/llmgate.access.log",
            )
        )
    )
