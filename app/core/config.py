"""Settings: one frozen value read from the environment once. No I/O here.

Every field names its environment variable and says what it does; ``docs/configuration.md``
and the README table are checked against this list by a test, so a setting cannot exist
undocumented. Per-request variations are made with ``dataclasses.replace``, never by mutation.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


class SettingsError(ValueError):
    """A setting has a value the gateway cannot run with."""


def _setting(env: str, default: Any, help: str) -> Any:
    return field(default=default, metadata={"env": env, "help": help})


@dataclass(frozen=True)
class Settings:
    upstream_url: str = _setting(
        "LLMGATE_UPSTREAM_URL",
        "",
        "Base URL of the upstream API, with its version path, like OPENAI_BASE_URL "
        "(e.g. https://api.openai.com/v1). `make run` starts the simulator when empty.",
    )
    upstream_api_key: str = _setting(
        "LLMGATE_UPSTREAM_API_KEY",
        "",
        "Bearer key sent upstream for callers that send no Authorization header. Never logged.",
    )
    upstream_ca_bundle: str = _setting(
        "LLMGATE_UPSTREAM_CA_BUNDLE",
        "",
        "PEM file of the CAs to trust for an https upstream (a private CA in front of a "
        "self-hosted model); empty: the system's trust store. Certificates are always verified.",
    )
    config_file: str = _setting(
        "LLMGATE_CONFIG",
        "",
        "TOML file declaring several upstreams (keys, models, aliases, weights, priorities; "
        "see deploy/llmgate.example.toml). Empty: the one upstream of LLMGATE_UPSTREAM_URL.",
    )
    keys_file: str = _setting(
        "LLMGATE_KEYS_FILE",
        "",
        "TOML file of gateway keys (SHA-256 hashes, each with its models, upstreams, limits "
        "and budgets; docs/security.md). Set: every call needs one of its keys and callers' "
        "own credentials never go upstream. Re-read when it changes. Empty: keys are off.",
    )
    limits_fail: str = _setting(
        "LLMGATE_LIMITS_FAIL",
        "open",
        "open | closed: what a gateway key's limits do when Memcached cannot be reached: let "
        "calls pass uncounted (logged and counted), or refuse them with 503.",
    )
    default_max_output_tokens: int = _setting(
        "LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS",
        16384,
        "Output tokens a gateway key's token or money budget holds for a call that names no "
        "max_tokens, when neither the key's max_tokens nor the price table's max_output_tokens "
        "for the model says (app/request/bounds.py). Set it to the largest output "
        "of the models you serve: a model that writes more overspends by the difference.",
    )
    operator_token: str = _setting(
        "LLMGATE_OPERATOR_TOKEN",
        "",
        "Set: /metrics, /status, /status.json and /admin/* need 'Authorization: Bearer "
        "<token>' (or Basic auth with it as the password, for a browser). Never logged.",
    )
    ops_allow: str = _setting(
        "LLMGATE_OPS_ALLOW",
        "127.0.0.1,::1",
        "Comma-separated addresses or CIDR ranges nginx lets read /metrics, /status, "
        "/status.json and /admin/* (others get 403); `all` for anyone (then set "
        "LLMGATE_OPERATOR_TOKEN).",
    )
    pool_size: int = _setting(
        "LLMGATE_POOL_SIZE",
        6000,
        "Idle keep-alive upstream connections a worker keeps per upstream (urllib3 maxsize). "
        "Unset: LLMGATE_MAX_STREAMS_PER_WORKER (else 4/5 of LLMGATE_WORKER_CONNECTIONS), so a "
        "worker can keep a connection for every stream it may hold and steady load opens "
        "none; calls above it open extra connections that are closed after use.",
    )
    pool_spare_ratio: float = _setting(
        "LLMGATE_POOL_SPARE_RATIO",
        0.1,
        "When a call finds no idle upstream connection and opens one, the worker also opens "
        "spares behind it (TCP and TLS done, idle in the pool) up to this share of the "
        "connections in use: the next busier moment finds them ready. 0: no spares.",
    )
    connect_timeout_s: float = _setting(
        "LLMGATE_CONNECT_TIMEOUT_S", 5.0, "Seconds to open a TCP (+TLS) connection upstream."
    )
    first_byte_timeout_s: float = _setting(
        "LLMGATE_FIRST_BYTE_TIMEOUT_S",
        300.0,
        "Seconds from sending the request until the upstream's response headers. For a "
        "non-stream call this covers the whole generation, hence the large default.",
    )
    idle_timeout_s: float = _setting(
        "LLMGATE_IDLE_TIMEOUT_S",
        120.0,
        "Longest silence allowed between two reads of the upstream body (reasoning models "
        "think for minutes before their first token).",
    )
    deadline_s: float = _setting(
        "LLMGATE_DEADLINE_S",
        600.0,
        "Total seconds a request may take, retries and streaming included.",
    )
    heartbeat_s: float = _setting(
        "LLMGATE_HEARTBEAT_S",
        15.0,
        "Idle seconds after which a stream gets a `: ping` SSE comment (0 disables).",
    )
    retries: int = _setting(
        "LLMGATE_RETRIES",
        2,
        "Extra upstream attempts for failures that cannot have billed: connect errors, 429, "
        "502/503/504 before any byte reached the caller, within the deadline.",
    )
    retry_backoff_s: float = _setting(
        "LLMGATE_RETRY_BACKOFF_S", 0.5, "Base of the full-jitter exponential backoff."
    )
    retry_backoff_max_s: float = _setting(
        "LLMGATE_RETRY_BACKOFF_MAX_S", 8.0, "Cap of one backoff sleep."
    )
    retry_after_max_s: float = _setting(
        "LLMGATE_RETRY_AFTER_MAX_S",
        20.0,
        "Longest upstream retry-after the gateway waits out itself; longer ones go back to "
        "the caller with the upstream's answer.",
    )
    retry_budget_percent: float = _setting(
        "LLMGATE_RETRY_BUDGET_PERCENT",
        20.0,
        "Retries and failovers in flight in a worker may be at most this percent of its "
        "requests in flight (Envoy's retry budget; 100: no budget). Beyond it the upstream's "
        "answer or error goes back at once, so an outage does not multiply the load.",
    )
    retry_budget_min: int = _setting(
        "LLMGATE_RETRY_BUDGET_MIN",
        3,
        "Concurrent retries a worker may always make, whatever the percent (a quiet worker "
        "still retries a blip).",
    )
    breaker_failures: int = _setting(
        "LLMGATE_BREAKER_FAILURES",
        5,
        "Consecutive failed attempts (no connection, timeout, reset, 5xx, a stream broken off "
        "after its headers) that open an upstream's circuit breaker in a worker; more than "
        "half of the last 20 attempts (at least 10) failing opens it too.",
    )
    breaker_cooldown_s: float = _setting(
        "LLMGATE_BREAKER_COOLDOWN_S",
        5.0,
        "How long an open breaker keeps calls away before one probe goes through; doubled "
        "for each opening in a row, up to LLMGATE_BREAKER_COOLDOWN_MAX_S.",
    )
    breaker_cooldown_max_s: float = _setting(
        "LLMGATE_BREAKER_COOLDOWN_MAX_S", 300.0, "Longest cooldown of an open breaker."
    )
    stream_buffer_bytes: int = _setting(
        "LLMGATE_STREAM_BUFFER_BYTES",
        512 * 1024,
        "Bytes of a stream's events that may wait for a slow caller; beyond them the gateway "
        "stops reading the upstream until the caller catches up (memory per stream stays "
        "bounded).",
    )
    send_timeout_s: float = _setting(
        "LLMGATE_SEND_TIMEOUT_S",
        60.0,
        "A caller that takes no bytes of its stream for this long is dropped and its upstream "
        "closed; nginx's send_timeout is rendered from the same value.",
    )
    max_body_bytes: int = _setting(
        "LLMGATE_MAX_BODY_BYTES",
        20 * 1024 * 1024,
        "Largest request body accepted (413 above it); nginx's client_max_body_size is "
        "rendered from the same value.",
    )
    max_json_depth: int = _setting(
        "LLMGATE_MAX_JSON_DEPTH",
        64,
        "Deepest nesting of arrays/objects accepted in a JSON request body (400 invalid_json "
        "above it), checked before parsing; at most 512, below Python's recursion limit.",
    )
    max_json_array_items: int = _setting(
        "LLMGATE_MAX_JSON_ARRAY_ITEMS",
        1_000_000,
        "Most values in one JSON array of a request body (400 invalid_json above it). The "
        "longest real arrays are prompts given as token ids, up to a model's context.",
    )
    max_json_containers: int = _setting(
        "LLMGATE_MAX_JSON_CONTAINERS",
        100_000,
        "Most JSON arrays and objects in a request body (400 invalid_json above it), counted "
        "before parsing: each costs far more parsed than its two bytes (a body of `{},{},...` "
        "at the body size limit parses into ~500 MiB).",
    )
    max_event_bytes: int = _setting(
        "LLMGATE_MAX_EVENT_BYTES",
        8 * 1024 * 1024,
        "Largest single SSE event accepted from the upstream; a larger one ends the stream "
        "with an `upstream_event_too_large` error event. Bounds the memory one stream holds.",
    )
    max_requests_per_worker: int = _setting(
        "LLMGATE_MAX_REQUESTS_PER_WORKER",
        12000,
        "Most API requests one worker serves at once (0: no limit); beyond it the answer is "
        "an immediate 429 gateway_overloaded, never a queue. Unset: 4/5 of "
        "LLMGATE_WORKER_CONNECTIONS (gunicorn's worker_connections, 15000 -> 12000). Keep it "
        "below that: past worker_connections gunicorn stops accepting and callers wait unseen "
        "in its backlog; the rest is room for nginx's idle keep-alive connections and for "
        "health, metrics and status, which are never refused. nginx's limit_conn is rendered "
        "from it.",
    )
    max_streams_per_worker: int = _setting(
        "LLMGATE_MAX_STREAMS_PER_WORKER",
        6000,
        "Most streams (`stream: true`) one worker relays at once (0: no limit); a stream also "
        "takes a request slot. Unset: 2/5 of LLMGATE_WORKER_CONNECTIONS (15000 -> 6000), half "
        "the request slots, so long streams never take every slot from short calls.",
    )
    memcached: str = _setting(
        "LLMGATE_MEMCACHED",
        "",
        "Comma-separated Memcached nodes (the shared L2 cache, consistent hashing): host:port, "
        "or dns+name:port for every A/AAAA address of a name (a Kubernetes headless Service), "
        "re-resolved every LLMGATE_MEMCACHED_DNS_REFRESH_S; empty: the in-process L1 cache only.",
    )
    memcached_dns_refresh_s: float = _setting(
        "LLMGATE_MEMCACHED_DNS_REFRESH_S",
        15.0,
        "How often each worker re-resolves the dns+ names of LLMGATE_MEMCACHED; nodes that "
        "appear join the hash ring, nodes that disappear leave it (no restart).",
    )
    memcached_timeout_s: float = _setting(
        "LLMGATE_MEMCACHED_TIMEOUT_S",
        0.2,
        "Memcached operation timeout; a slower node is a miss, never an error.",
    )
    memcached_connect_timeout_s: float = _setting(
        "LLMGATE_MEMCACHED_CONNECT_TIMEOUT_S", 0.1, "Memcached connect timeout."
    )
    memcached_retry_s: float = _setting(
        "LLMGATE_MEMCACHED_RETRY_S",
        10.0,
        "After a Memcached node fails (a timeout, a refused or broken connection), each worker "
        "skips it for this long (the answers it holds are misses; the key limits it counts "
        "fail as LLMGATE_LIMITS_FAIL says), then lets one call try it again.",
    )
    cache_mode: str = _setting(
        "LLMGATE_CACHE_MODE",
        "deterministic",
        "off | deterministic (temperature 0, a seed, or embeddings) | all.",
    )
    cache_ttl_s: int = _setting("LLMGATE_CACHE_TTL_S", 3600, "Base lifetime of a cached answer.")
    cache_ttl_jitter_s: int = _setting(
        "LLMGATE_CACHE_TTL_JITTER_S",
        360,
        "Random extra lifetime in [0, this], so entries written together expire apart.",
    )
    cache_l1_ttl_s: int = _setting(
        "LLMGATE_CACHE_L1_TTL_S", 60, "Lifetime of the per-worker in-process copy (L1)."
    )
    cache_l1_bytes: int = _setting(
        "LLMGATE_CACHE_L1_BYTES", 64 * 1024 * 1024, "Size bound of the per-worker L1 cache."
    )
    cache_max_entry_bytes: int = _setting(
        "LLMGATE_CACHE_MAX_ENTRY_BYTES",
        8 * 1024 * 1024,
        "Largest answer cached (compressed); larger ones are served but not stored.",
    )
    log_memory_bytes: int = _setting(
        "LLMGATE_LOG_MEMORY_BYTES",
        64 * 1024 * 1024,
        "Memory a worker's kept event logs may hold together (the events of streams kept for "
        "the cache entry and coalesced followers, counted as Python objects: ~3x their bytes). "
        "Past it new streams keep no log: served, but neither stored nor joined. 0: none kept.",
    )
    cache_namespaces: str = _setting(
        "LLMGATE_CACHE_NAMESPACES",
        "",
        "Shared cache namespaces callers may name (comma-separated, * for any); empty: "
        "every entry is private to the caller's credential.",
    )
    cache_lease_s: float = _setting(
        "LLMGATE_CACHE_LEASE_S",
        30.0,
        "Across workers and instances, one caller per key computes while the others wait up "
        "to this long for its entry (0 disables the lease).",
    )
    cache_early_refresh_beta: float = _setting(
        "LLMGATE_CACHE_EARLY_REFRESH_BETA",
        0.0,
        "Opt-in probabilistic early refresh (XFetch): a hit recomputes the entry in the "
        "background when now - compute_time * beta * ln(rand) >= expiry. 0 disables; 1 is "
        "the usual value, larger refreshes earlier.",
    )
    cache_lease_streams: bool = _setting(
        "LLMGATE_CACHE_LEASE_STREAMS",
        True,
        "Whether stream requests wait behind another process's lease (off: streams that "
        "value first-token latency over cost go upstream at once).",
    )

    drain_file: str = _setting(
        "LLMGATE_DRAIN_FILE",
        "",
        "While this file exists, /readyz answers 503 (draining): a Kubernetes preStop hook or a "
        "deploy script creates it to take the instance out of its balancer before stopping it. "
        "Empty: only SIGTERM turns the instance unready (make run uses LLMGATE_RUN_DIR/draining "
        "and creates it on SIGTERM).",
    )

    status_sample_s: int = _setting(
        "LLMGATE_STATUS_SAMPLE_S",
        10,
        "Seconds between the samples of the instance's status the gateway keeps for 15 "
        "minutes, so that /status opens with that history (docs/observability.md). 0: none "
        "kept, the page charts only what it polls itself.",
    )

    log_prompts: bool = _setting(
        "LLMGATE_LOG_PROMPTS",
        False,
        "Add the request body to each request's log line. Off by default: prompts are "
        "data your users did not agree to have in logs.",
    )

    otel_endpoint: str = _setting(
        "LLMGATE_OTEL_ENDPOINT",
        "",
        "OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces): one span per "
        "request with the GenAI attributes, child spans for the cache lookup, each upstream "
        "attempt and the stream; W3C traceparent taken from the caller and sent upstream "
        "(docs/observability.md). Empty: tracing is off and OpenTelemetry is never imported.",
    )
    otel_service_name: str = _setting(
        "LLMGATE_OTEL_SERVICE_NAME",
        "llmgate",
        "The service.name of the gateway's spans.",
    )
    tls_port: int = _setting(
        "LLMGATE_TLS_PORT",
        8443,
        "Port of `make run`'s HTTPS listener at nginx (HTTP/2 and HTTP/1.1, same routes as "
        "LLMGATE_PORT); 0: no HTTPS listener.",
    )
    tls_cert: str = _setting(
        "LLMGATE_TLS_CERT",
        "",
        "PEM certificate (chain) nginx serves on LLMGATE_TLS_PORT. Empty: a self-signed one "
        "for localhost and 127.0.0.1, made with openssl in the run directory.",
    )
    tls_key: str = _setting(
        "LLMGATE_TLS_KEY",
        "",
        "PEM private key of LLMGATE_TLS_CERT (both or neither).",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None or raw.strip() == "":
                continue
            values[f.name] = _parse(f, raw.strip())
        values = {**admission_defaults(environ), **values}
        # A pool that never discards: a connection for every stream the worker may hold.
        streams, requests = values["max_streams_per_worker"], values["max_requests_per_worker"]
        values.setdefault("pool_size", streams or requests or 100)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.upstream_url:
            parts = urlsplit(self.upstream_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise SettingsError(
                    f"LLMGATE_UPSTREAM_URL must be an http(s) URL, got {self.upstream_url!r}"
                )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(f"{f.metadata['env']} must be a finite number, got {value}")
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "deadline_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_env(name)} must be > 0")
        # Nonsense that used to pass: a negative heartbeat or lease was taken as off, an
        # L1 TTL of 0 stopped every worker's boot (a traceback in each one's log).
        at_least_0 = ("heartbeat_s", "retry_backoff_s", "retry_backoff_max_s",
                      "retry_after_max_s", "cache_ttl_jitter_s", "cache_lease_s",
                      "cache_early_refresh_beta")  # fmt: skip
        above_0 = ("cache_ttl_s", "cache_l1_ttl_s", "cache_max_entry_bytes",
                   "memcached_timeout_s", "memcached_connect_timeout_s")  # fmt: skip
        for name in at_least_0:
            if getattr(self, name) < 0:
                raise SettingsError(f"{_env(name)} must be >= 0, got {getattr(self, name)}")
        for name in above_0:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_env(name)} must be > 0, got {getattr(self, name)}")
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
        if not 0 <= self.retry_budget_percent <= 100 or self.retry_budget_min < 0:
            raise SettingsError(
                "LLMGATE_RETRY_BUDGET_PERCENT must be between 0 and 100 and "
                "LLMGATE_RETRY_BUDGET_MIN >= 0"
            )
        if self.memcached_dns_refresh_s <= 0 or self.memcached_retry_s <= 0:
            raise SettingsError(
                "LLMGATE_MEMCACHED_DNS_REFRESH_S and LLMGATE_MEMCACHED_RETRY_S must be > 0"
            )
        _ = self.memcached_nodes, self.memcached_dns  # a malformed entry stops the start
        if self.otel_endpoint:
            parts = urlsplit(self.otel_endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise SettingsError(
                    f"LLMGATE_OTEL_ENDPOINT must be an http(s) URL, got {self.otel_endpoint!r}"
                )
        if bool(self.tls_cert) != bool(self.tls_key) or not 0 <= self.tls_port <= 65535:
            raise SettingsError(
                "LLMGATE_TLS_CERT and LLMGATE_TLS_KEY go together; LLMGATE_TLS_PORT is 0..65535"
            )
        if not 0 <= self.pool_spare_ratio <= 1:
            raise SettingsError("LLMGATE_POOL_SPARE_RATIO must be between 0 and 1")
        if self.pool_size < 1 or self.retries < 0 or self.max_body_bytes < 1:
            raise SettingsError(
                "LLMGATE_POOL_SIZE, LLMGATE_MAX_BODY_BYTES must be >= 1 and LLMGATE_RETRIES >= 0"
            )

    @property
    def ops_allow_list(self) -> tuple[str, ...]:
        """LLMGATE_OPS_ALLOW's entries (nginx checks their syntax when it starts)."""
        items = tuple(a.strip() for a in self.ops_allow.split(",") if a.strip())
        for item in items:
            if not re.fullmatch(r"all|[0-9A-Fa-f:.]+(/[0-9]{1,3})?", item):
                raise SettingsError(f"LLMGATE_OPS_ALLOW entry {item!r} is not an address or CIDR")
        return items

    @property
    def allowed_namespaces(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self.cache_namespaces.split(",") if n.strip())

    @property
    def memcached_nodes(self) -> list[tuple[str, int]]:
        """The host:port entries of LLMGATE_MEMCACHED (not the dns+ ones)."""
        return [node for node, by_dns in self._memcached_entries() if not by_dns]

    @property
    def memcached_dns(self) -> list[tuple[str, int]]:
        """The dns+name:port entries of LLMGATE_MEMCACHED, as (name, port)."""
        return [node for node, by_dns in self._memcached_entries() if by_dns]

    def _memcached_entries(self) -> list[tuple[tuple[str, int], bool]]:
        entries = []
        for item in filter(None, (s.strip() for s in self.memcached.split(","))):
            by_dns = item.startswith(DNS_PREFIX)
            host, _, port = item.removeprefix(DNS_PREFIX).rpartition(":")
            if not host or not port.isdigit():
                raise SettingsError(
                    f"LLMGATE_MEMCACHED entry {item!r} is not host:port or dns+name:port"
                )
            entries.append(((host.strip("[]"), int(port)), by_dns))
        return entries


# LLMGATE_MEMCACHED's prefix for a name whose every address is a node (Thanos and Cortex
# spell their DNS discovery the same way).
DNS_PREFIX = "dns+"


# gunicorn.conf.py's default worker_connections (LLMGATE_WORKER_CONNECTIONS); a test holds
# the two equal. The admission limits' defaults are shares of it, and nginx is sized from
# those (runner/sizing.py): 2 workers of 15,000 connections admit 12,000 streams, so
# `make run` holds 10,000 with room for the kernel spreading accepts unevenly over the
# workers (measured 5,100 / 4,900 at 10,000: docs/operations.md, "Capacity").
WORKER_CONNECTIONS = 15000


def worker_connections(environ: Mapping[str, str]) -> int:
    """LLMGATE_WORKER_CONNECTIONS, the one setting the stack's capacity follows."""
    raw = (environ.get("LLMGATE_WORKER_CONNECTIONS") or "").strip()
    try:
        connections = int(raw) if raw else WORKER_CONNECTIONS
    except ValueError:
        raise SettingsError(f"LLMGATE_WORKER_CONNECTIONS={raw!r} is not a valid int") from None
    if connections < 1:
        raise SettingsError("LLMGATE_WORKER_CONNECTIONS must be >= 1")
    return connections


def admission_defaults(environ: Mapping[str, str]) -> dict[str, int]:
    """The admission limits sized from LLMGATE_WORKER_CONNECTIONS: 4/5 of the worker's
    connections for requests, 2/5 for streams (Settings' defaults are these for 15000)."""
    connections = worker_connections(environ)
    return {
        "max_requests_per_worker": max(1, connections * 4 // 5),
        "max_streams_per_worker": max(1, connections * 2 // 5),
    }


def _env(name: str) -> str:
    return next(f.metadata["env"] for f in dataclasses.fields(Settings) if f.name == name)


def _parse(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    try:
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise SettingsError(f"{f.metadata['env']}={raw!r} is not a valid {kind}") from None
    return raw


def documented_settings() -> list[tuple[str, Any, str]]:
    """(env name, default, help) for every setting, in declaration order."""
    return [
        (f.metadata["env"], f.default, f.metadata["help"]) for f in dataclasses.fields(Settings)
    ]
