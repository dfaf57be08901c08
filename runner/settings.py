"""The runner's own settings (the gateway's are app/core/config.py's): read once, checked at once.

`make run` reads these from LLMGATE_* variables before it starts anything; gunicorn.conf.py
reads some of them again in gunicorn, which must never be where a bad value is found (its
``int()`` would fail in a child, behind a traceback). A bad value is a ``SettingsError`` of
one line in app/core/config.py's style: the name, what is allowed, and the value given. No I/O
here: whether a port is free is runner/claims.py's question, asked later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.config import SettingsError

DEFAULT_RUN_DIR = Path(__file__).resolve().parent.parent / ".run"
# gunicorn's levels (anything else it would take silently as info).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# gunicorn.conf.py's default graceful timeout (the default LLMGATE_DEADLINE_S).
GRACEFUL_TIMEOUT_S = 600
# Seconds an instance answers /readyz 503 while still serving, before its drain begins: a
# balancer polling every 2-5 s and taking two failures sees it go (runner/drain.py).
DRAIN_DELAY_S = 5
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class RunnerSettings:
    port: int = 8080  # LLMGATE_PORT: nginx's public port (gunicorn's without nginx)
    host: str = "127.0.0.1"  # LLMGATE_HOST: where nginx listens
    # LLMGATE_BIND: gunicorn's fixed addresses as (host, port); empty: a free loopback port.
    bind: tuple[tuple[str, int], ...] = ()
    workers: int = 2  # LLMGATE_WORKERS
    tls_port: int = 8443  # LLMGATE_TLS_PORT: nginx's HTTPS port; 0: no HTTPS listener
    # LLMGATE_SIMULATOR_PORT, LLMGATE_MEMCACHED_PORT: where the runner's own simulator and
    # Memcached listen (the nodes of `make run-cluster`: this port and the next); 0: a free one.
    simulator_port: int = 0
    memcached_port: int = 0
    # LLMGATE_GRACEFUL_TIMEOUT_S, whole seconds as gunicorn takes it.
    graceful_timeout_s: int = GRACEFUL_TIMEOUT_S
    drain_delay_s: int = DRAIN_DELAY_S  # LLMGATE_DRAIN_DELAY_S, whole seconds
    log_level: str = "info"  # LLMGATE_LOG_LEVEL
    logs_to_stdout: bool = False  # LLMGATE_LOG_TO_STDOUT
    run_dir: Path = DEFAULT_RUN_DIR  # LLMGATE_RUN_DIR

    @property
    def bind_setting(self) -> str:
        """LLMGATE_BIND as gunicorn takes it ("" when unset)."""
        return ",".join(f"{host}:{port}" for host, port in self.bind)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RunnerSettings:
        def raw(name: str) -> str:
            return (environ.get(f"LLMGATE_{name}") or "").strip()

        host = raw("HOST") or cls.host
        if ":" in host or " " in host:
            # nginx's listen line is host:port; an IPv6 address would need brackets there.
            raise SettingsError(
                "LLMGATE_HOST must be an IPv4 address or a host name (IPv6 is not supported), "
                f"got {host!r}"
            )
        return cls(
            port=_int("LLMGATE_PORT", raw("PORT"), cls.port, 1, 65535),
            host=host,
            bind=_bind(raw("BIND")),
            workers=_int("LLMGATE_WORKERS", raw("WORKERS"), cls.workers, 1),
            tls_port=_int("LLMGATE_TLS_PORT", raw("TLS_PORT"), cls.tls_port, 0, 65535),
            simulator_port=_int("LLMGATE_SIMULATOR_PORT", raw("SIMULATOR_PORT"), 0, 0, 65535),
            memcached_port=_int("LLMGATE_MEMCACHED_PORT", raw("MEMCACHED_PORT"), 0, 0, 65535),
            graceful_timeout_s=_int(
                "LLMGATE_GRACEFUL_TIMEOUT_S", raw("GRACEFUL_TIMEOUT_S"), GRACEFUL_TIMEOUT_S, 1
            ),
            drain_delay_s=_int(
                "LLMGATE_DRAIN_DELAY_S", raw("DRAIN_DELAY_S"), DRAIN_DELAY_S, 0, 3600
            ),
            log_level=_choice("LLMGATE_LOG_LEVEL", raw("LOG_LEVEL"), LOG_LEVELS, cls.log_level),
            logs_to_stdout=_flag("LLMGATE_LOG_TO_STDOUT", raw("LOG_TO_STDOUT")),
            run_dir=Path(raw("RUN_DIR")) if raw("RUN_DIR") else DEFAULT_RUN_DIR,
        )


def with_values(message: str, environ: Mapping[str, str]) -> str:
    """A SettingsError's line with the values given to the settings it names, for the
    messages that name a setting and its rule but not what was set ("... must be > 0")."""
    if ", got " in message or re.search(r"LLMGATE_\w+=", message):
        return message
    named = dict.fromkeys(re.findall(r"LLMGATE_[A-Z0-9_]+", message))
    given = [f"{name}={environ[name].strip()!r}" for name in named if environ.get(name, "").strip()]
    return f"{message}; given {', '.join(given)}" if given else message


def _allowed(low: int, high: int | None) -> str:
    return f"between {low} and {high}" if high is not None else f">= {low}"


def _int(name: str, raw: str, default: int, low: int, high: int | None = None) -> int:
    """``raw`` as a whole number in [low, high]; ``default`` when empty."""
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(
            f"{name} must be a whole number {_allowed(low, high)}, got {raw!r}"
        ) from None
    if value < low or (high is not None and value > high):
        raise SettingsError(f"{name} must be {_allowed(low, high)}, got {value}")
    return value


def _choice(name: str, raw: str, choices: tuple[str, ...], default: str) -> str:
    if not raw:
        return default
    if raw.lower() not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw.lower()


def _flag(name: str, raw: str) -> bool:
    if raw.lower() in TRUE:
        return True
    if not raw or raw.lower() in FALSE:
        return False
    raise SettingsError(f"{name} must be true or false (1/0, yes/no, on/off), got {raw!r}")


def _bind(raw: str) -> tuple[tuple[str, int], ...]:
    """LLMGATE_BIND's comma-separated host:port entries. The runner waits for gunicorn on
    them, so each needs a port (gunicorn's unix: sockets are for gunicorn run by hand)."""
    entries = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise SettingsError(
                f"LLMGATE_BIND must be host:port entries with a port between 1 and 65535, "
                f"got {raw!r}"
            )
        entries.append((host, int(port)))
    return tuple(entries)
