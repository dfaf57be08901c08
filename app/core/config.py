"""Settings: one frozen value read from the environment once. No I/O here.

Every field names its environment variable and says what it does; ``docs/configuration.md``
and the README table are checked against this list by a test, so a setting cannot exist
undocumented. Per-request variations are made with ``dataclasses.replace``, never by mutation.

The fields are declared in two tables by area: a call's way (app/core/config_calls.py) and
what the instance keeps and how it is run (app/core/config_instance.py); how a setting is
declared and its text read is app/core/config_reading.py. This module joins the two into
``Settings``, reads it from the environment and checks it whole, and is where the rest of
the code imports the settings' names from.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.core.config_calls import CallSettings
from app.core.config_instance import InstanceSettings
from app.core.config_reading import (
    WORKER_CONNECTIONS,
    SettingsError,
    admission_defaults,
    memcached_entries,
    ops_allow_entries,
    parse,
    worker_connections,
)

__all__ = [
    "WORKER_CONNECTIONS",
    "Settings",
    "SettingsError",
    "admission_defaults",
    "documented_settings",
    "worker_connections",
]


@dataclass(frozen=True)
class Settings(InstanceSettings, CallSettings):
    """Every setting of the gateway. A dataclass takes the fields of its last base first, so
    the order is a call's settings, then the instance's: the order of ``documented_settings``
    and of the checks that report a bad value."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None or raw.strip() == "":
                continue
            values[f.name] = parse(f, raw.strip())
        values = {**admission_defaults(environ), **values}
        # A pool that never discards: a connection for every stream the worker may hold.
        streams, requests = values["max_streams_per_worker"], values["max_requests_per_worker"]
        values.setdefault("pool_size", streams or requests or 100)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """SettingsError naming the variable of the first value the gateway cannot run with,
        the checks taken in this order."""
        _check_url("LLMGATE_UPSTREAM_URL", self.upstream_url)
        self._check_numbers()
        self._check_choices_and_floors()
        self._check_call_bounds()
        self._check_memcached_tracing_tls()
        self._check_pool_retries_body()
        self._check_ledger()

    def _check_numbers(self) -> None:
        """Every number finite; the timeouts, lifetimes and durations on the right side of 0."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(f"{f.metadata['env']} must be a finite number, got {value}")
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "deadline_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_env(name)} must be > 0")
        # Nonsense that used to pass: a negative heartbeat or lease was taken as off, an
        # L1 TTL of 0 stopped every worker's boot (a traceback in each one's log).
        at_least_0 = (
            "heartbeat_s",
            "retry_backoff_s",
            "retry_backoff_max_s",
            "retry_after_max_s",
            "cache_ttl_jitter_s",
            "cache_lease_s",
            "cache_early_refresh_beta",
            "dns_ttl_s",
        )
        above_0 = (
            "cache_ttl_s",
            "cache_l1_ttl_s",
            "cache_max_entry_bytes",
            "memcached_timeout_s",
            "memcached_connect_timeout_s",
        )
        for name in at_least_0:
            if getattr(self, name) < 0:
                raise SettingsError(f"{_env(name)} must be >= 0, got {getattr(self, name)}")
        for name in above_0:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_env(name)} must be > 0, got {getattr(self, name)}")

    def _check_choices_and_floors(self) -> None:
        if self.limits_fail not in ("open", "closed"):
            raise SettingsError("LLMGATE_LIMITS_FAIL must be open or closed")
        if self.default_max_output_tokens < 1:
            raise SettingsError("LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS must be >= 1")
        if self.cache_mode not in ("off", "deterministic", "all"):
            raise SettingsError("LLMGATE_CACHE_MODE must be off, deterministic or all")
        if self.cache_l1_bytes < 1024:
            raise SettingsError("LLMGATE_CACHE_L1_BYTES must be >= 1024")
        if self.status_sample_s < 0:
            raise SettingsError("LLMGATE_STATUS_SAMPLE_S must be >= 0 (0: no history kept)")
        if self.log_memory_bytes < 0:
            raise SettingsError("LLMGATE_LOG_MEMORY_BYTES must be >= 0 (0: no logs kept)")
        if self.resume_window_s < 0 or not 0 < self.resume_stream_bytes <= (
            self.resume_memcached_bytes
        ):
            raise SettingsError(
                "LLMGATE_RESUME_WINDOW_S must be >= 0 and 0 < LLMGATE_RESUME_STREAM_BYTES <= "
                "LLMGATE_RESUME_MEMCACHED_BYTES"
            )

    def _check_call_bounds(self) -> None:
        """The breakers, a stream's buffer and events, a body's JSON, admission, retries."""
        if self.breaker_failures < 1 or not 0 < self.breaker_cooldown_s <= (
            self.breaker_cooldown_max_s
        ):
            raise SettingsError(
                "LLMGATE_BREAKER_FAILURES must be >= 1 and 0 < LLMGATE_BREAKER_COOLDOWN_S <= "
                "LLMGATE_BREAKER_COOLDOWN_MAX_S"
            )
        if self.stream_buffer_bytes < 1024 or self.send_timeout_s <= 0:
            raise SettingsError(
                "LLMGATE_STREAM_BUFFER_BYTES must be >= 1024 and LLMGATE_SEND_TIMEOUT_S > 0"
            )
        if self.max_event_bytes < 1024:
            raise SettingsError("LLMGATE_MAX_EVENT_BYTES must be >= 1024")
        if not 1 <= self.max_json_depth <= 512:
            # Deeper, json.loads (and json.dumps of the cache key) would recurse past
            # Python's recursion limit: the RecursionError this setting exists to prevent.
            raise SettingsError("LLMGATE_MAX_JSON_DEPTH must be between 1 and 512")
        if self.max_json_array_items < 1 or self.max_json_containers < 1:
            raise SettingsError(
                "LLMGATE_MAX_JSON_ARRAY_ITEMS and LLMGATE_MAX_JSON_CONTAINERS must be >= 1"
            )
        if self.max_requests_per_worker < 0 or self.max_streams_per_worker < 0:
            raise SettingsError(
                "LLMGATE_MAX_REQUESTS_PER_WORKER and LLMGATE_MAX_STREAMS_PER_WORKER must be "
                ">= 0 (0: no limit)"
            )
        if self.routing not in ("affine", "weighted") or self.routing_epsilon < 0:
            raise SettingsError(
                "LLMGATE_ROUTING must be affine or weighted and LLMGATE_ROUTING_EPSILON >= 0"
            )
        if not 0 <= self.retry_budget_percent <= 100 or self.retry_budget_min < 0:
            raise SettingsError(
                "LLMGATE_RETRY_BUDGET_PERCENT must be between 0 and 100 and "
                "LLMGATE_RETRY_BUDGET_MIN >= 0"
            )

    def _check_memcached_tracing_tls(self) -> None:
        if self.memcached_dns_refresh_s <= 0 or self.memcached_retry_s <= 0:
            raise SettingsError(
                "LLMGATE_MEMCACHED_DNS_REFRESH_S and LLMGATE_MEMCACHED_RETRY_S must be > 0"
            )
        memcached_entries(self.memcached)  # a malformed entry stops the start
        if self.otel_endpoint:
            _check_url("LLMGATE_OTEL_ENDPOINT", self.otel_endpoint)
        if bool(self.tls_cert) != bool(self.tls_key) or not 0 <= self.tls_port <= 65535:
            raise SettingsError(
                "LLMGATE_TLS_CERT and LLMGATE_TLS_KEY go together; LLMGATE_TLS_PORT is 0..65535"
            )

    def _check_pool_retries_body(self) -> None:
        if not 0 <= self.pool_spare_ratio <= 1:
            raise SettingsError("LLMGATE_POOL_SPARE_RATIO must be between 0 and 1")
        if self.pool_size < 1 or self.retries < 0 or self.max_body_bytes < 1:
            raise SettingsError(
                "LLMGATE_POOL_SIZE, LLMGATE_MAX_BODY_BYTES must be >= 1 and LLMGATE_RETRIES >= 0"
            )

    def _check_ledger(self) -> None:
        scheme = self.ledger_url.partition("://")[0] if "://" in self.ledger_url else ""
        if scheme not in ("", "sqlite", "postgresql", "postgres"):
            raise SettingsError(
                "LLMGATE_LEDGER_URL must be a file path, sqlite:///path or postgresql://..., "
                f"got a {scheme}:// URL"
            )
        if self.ledger_flush_s <= 0 or self.ledger_read_timeout_s <= 0:
            raise SettingsError(
                "LLMGATE_LEDGER_FLUSH_S and LLMGATE_LEDGER_READ_TIMEOUT_S must be > 0"
            )
        if not 1 <= self.ledger_batch <= self.ledger_queue:
            raise SettingsError("LLMGATE_LEDGER_BATCH must be >= 1 and <= LLMGATE_LEDGER_QUEUE")
        if self.ledger_retention_days != 0 and self.ledger_retention_days < 32:
            raise SettingsError(
                "LLMGATE_LEDGER_RETENTION_DAYS must be 0 (keep every row) or at least 32, got "
                f"{self.ledger_retention_days}"
            )

    @property
    def ledger(self) -> str:
        """The ledger's URL, or "" when there is none (LLMGATE_LEDGER_URL empty or off)."""
        return "" if self.ledger_url.strip().lower() in ("", "off") else self.ledger_url.strip()

    @property
    def ops_allow_list(self) -> tuple[str, ...]:
        """LLMGATE_OPS_ALLOW's entries (nginx checks their syntax when it starts)."""
        return ops_allow_entries(self.ops_allow)

    @functools.cached_property
    def allowed_namespaces(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self.cache_namespaces.split(",") if n.strip())

    @property
    def memcached_nodes(self) -> list[tuple[str, int]]:
        """The host:port entries of LLMGATE_MEMCACHED (not the dns+ ones)."""
        return [node for node, by_dns in memcached_entries(self.memcached) if not by_dns]

    @property
    def memcached_dns(self) -> list[tuple[str, int]]:
        """The dns+name:port entries of LLMGATE_MEMCACHED, as (name, port)."""
        return [node for node, by_dns in memcached_entries(self.memcached) if by_dns]


def _check_url(env: str, url: str) -> None:
    """An empty URL passes (the setting is off or filled in elsewhere); any other must be
    http(s) with a host."""
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"{env} must be an http(s) URL, got {url!r}")


def _env(name: str) -> str:
    return next(f.metadata["env"] for f in dataclasses.fields(Settings) if f.name == name)


def documented_settings() -> list[tuple[str, Any, str]]:
    """(env name, default, help) for every setting, in declaration order."""
    return [
        (f.metadata["env"], f.default, f.metadata["help"]) for f in dataclasses.fields(Settings)
    ]
