"""The settings of what the instance keeps and how it is run, a declarative table: the
cache (Memcached, the in-process level, leases, early refresh), the memory of event logs, the
drain file, the status history, request logs, tracing, and the TLS listener. No I/O here.

Declarations only: ``Settings`` (app/core/config.py) joins this table with a call's
(app/core/config_calls.py), reads it from the environment and checks it. Each field names
its variable and says what it does (app/core/config_reading.py, ``setting``); the docs are
checked against that text.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.config_reading import setting


@dataclass(frozen=True)
class InstanceSettings:
    """The settings of what the instance keeps and how it is run (see the module docstring)."""

    memcached: str = setting(
        "LLMGATE_MEMCACHED",
        "",
        "Comma-separated Memcached nodes (the shared L2 cache, consistent hashing): host:port, "
        "or dns+name:port for every A/AAAA address of a name (a Kubernetes headless Service), "
        "re-resolved every LLMGATE_MEMCACHED_DNS_REFRESH_S; empty: the in-process L1 cache only.",
    )
    memcached_dns_refresh_s: float = setting(
        "LLMGATE_MEMCACHED_DNS_REFRESH_S",
        15.0,
        "How often each worker re-resolves the dns+ names of LLMGATE_MEMCACHED; nodes that "
        "appear join the hash ring, nodes that disappear leave it (no restart).",
    )
    memcached_timeout_s: float = setting(
        "LLMGATE_MEMCACHED_TIMEOUT_S",
        0.2,
        "Memcached operation timeout; a slower node is a miss, never an error.",
    )
    memcached_connect_timeout_s: float = setting(
        "LLMGATE_MEMCACHED_CONNECT_TIMEOUT_S", 0.1, "Memcached connect timeout."
    )
    memcached_retry_s: float = setting(
        "LLMGATE_MEMCACHED_RETRY_S",
        10.0,
        "After a Memcached node fails (a timeout, a refused or broken connection), each worker "
        "skips it for a quarter of a second, then twice as long after each failed try, up to "
        "this long (the answers it holds are misses; the key limits it counts fail as "
        "LLMGATE_LIMITS_FAIL says), then lets one call try it again.",
    )
    cache_mode: str = setting(
        "LLMGATE_CACHE_MODE",
        "deterministic",
        "off | deterministic (temperature 0, a seed, or embeddings) | all.",
    )
    cache_ttl_s: int = setting("LLMGATE_CACHE_TTL_S", 3600, "Base lifetime of a cached answer.")
    cache_ttl_jitter_s: int = setting(
        "LLMGATE_CACHE_TTL_JITTER_S",
        360,
        "Random extra lifetime in [0, this], so entries written together expire apart.",
    )
    cache_l1_ttl_s: int = setting(
        "LLMGATE_CACHE_L1_TTL_S", 60, "Lifetime of the per-worker in-process copy (L1)."
    )
    cache_l1_bytes: int = setting(
        "LLMGATE_CACHE_L1_BYTES", 64 * 1024 * 1024, "Size bound of the per-worker L1 cache."
    )
    cache_max_entry_bytes: int = setting(
        "LLMGATE_CACHE_MAX_ENTRY_BYTES",
        8 * 1024 * 1024,
        "Largest answer cached (compressed); larger ones are served but not stored.",
    )
    log_memory_bytes: int = setting(
        "LLMGATE_LOG_MEMORY_BYTES",
        64 * 1024 * 1024,
        "Memory a worker's kept event logs may hold together (the events of streams kept for "
        "the cache entry and coalesced followers, counted as Python objects: ~3x their bytes). "
        "Past it new streams keep no log: served, but neither stored nor joined. 0: none kept.",
    )
    resume_window_s: int = setting(
        "LLMGATE_RESUME_WINDOW_S",
        0,
        "Resumable streams (docs/streams.md): a stream that asks (X-LLMGate-Resumable: true) "
        "is logged to Memcached and can be resumed with Last-Event-ID until this many seconds "
        "after its end; a stream whose caller left is stopped once nobody resumed it for this "
        "long. 0: off.",
    )
    resume_stream_bytes: int = setting(
        "LLMGATE_RESUME_STREAM_BYTES",
        4 * 1024 * 1024,
        "What one resumable stream's log may hold in Memcached (reserved from the worker's "
        "LLMGATE_RESUME_MEMCACHED_BYTES at its start); a longer stream stops being logged.",
    )
    resume_memcached_bytes: int = setting(
        "LLMGATE_RESUME_MEMCACHED_BYTES",
        512 * 1024 * 1024,
        "The Memcached memory a worker's resumable logs may reserve together until they "
        "expire; past it new streams are served but not resumable (said in their headers).",
    )
    cache_namespaces: str = setting(
        "LLMGATE_CACHE_NAMESPACES",
        "",
        "Shared cache namespaces callers may name (comma-separated, * for any); empty: "
        "every entry is private to the caller's credential.",
    )
    cache_lease_s: float = setting(
        "LLMGATE_CACHE_LEASE_S",
        30.0,
        "Across workers and instances, one caller per key computes while the others wait up "
        "to this long for its entry (0 disables the lease).",
    )
    cache_early_refresh_beta: float = setting(
        "LLMGATE_CACHE_EARLY_REFRESH_BETA",
        0.0,
        "Opt-in probabilistic early refresh (XFetch): a hit recomputes the entry in the "
        "background when now - compute_time * beta * ln(rand) >= expiry. 0 disables; 1 is "
        "the usual value, larger refreshes earlier.",
    )
    cache_lease_streams: bool = setting(
        "LLMGATE_CACHE_LEASE_STREAMS",
        True,
        "Whether stream requests wait behind another process's lease (off: streams that "
        "value first-token latency over cost go upstream at once).",
    )

    drain_file: str = setting(
        "LLMGATE_DRAIN_FILE",
        "",
        "While this file exists, /readyz answers 503 (draining): a Kubernetes preStop hook or a "
        "deploy script creates it to take the instance out of its balancer before stopping it. "
        "Empty: only SIGTERM turns the instance unready (make run uses LLMGATE_RUN_DIR/draining "
        "and creates it on SIGTERM).",
    )

    ledger_url: str = setting(
        "LLMGATE_LEDGER_URL",
        "",
        "Where the spend ledger keeps every settled call of a gateway key (docs/security.md): "
        "a SQLite file (a path, or sqlite:///path; one machine) or a PostgreSQL URL "
        "(postgresql://user:password@host:5432/db; several instances). Day and month budgets "
        "lost from Memcached are made again from it; /admin/usage and `python -m "
        "app.tenancy.spend` read it. Only with LLMGATE_KEYS_FILE. Empty or off: no ledger "
        "(`make run` then uses spend.sqlite3 in its run directory, `make run-cluster` a "
        "PostgreSQL of its own where installed; off stops that too). Its password is never "
        "logged.",
    )
    ledger_flush_s: float = setting(
        "LLMGATE_LEDGER_FLUSH_S",
        1.0,
        "Each worker writes its settled calls to the ledger at least this often, in batches of "
        "up to LLMGATE_LEDGER_BATCH rows (sooner when a batch is full): a worker killed with "
        "SIGKILL loses at most this window's rows.",
    )
    ledger_batch: int = setting(
        "LLMGATE_LEDGER_BATCH", 500, "Most rows the ledger's writer commits in one transaction."
    )
    ledger_queue: int = setting(
        "LLMGATE_LEDGER_QUEUE",
        50000,
        "Rows a worker keeps in memory for a ledger database that is slow or down (about "
        "half a kilobyte each); past it rows are dropped, counted and logged, and calls go on.",
    )
    ledger_retention_days: int = setting(
        "LLMGATE_LEDGER_RETENTION_DAYS",
        400,
        "Ledger rows older than this are deleted, 10,000 at a time, once an hour. 0: kept for "
        "ever; else at least 32 (a month's budget is made again from its month's rows).",
    )
    ledger_read_timeout_s: float = setting(
        "LLMGATE_LEDGER_READ_TIMEOUT_S",
        1.0,
        "The longest a call waits for the ledger when its day's or month's budget counter must "
        "be made again (and /admin/usage for a day or month); past it the count is taken as "
        "unreachable (LLMGATE_LIMITS_FAIL), and the ledger is not asked again for 5 s.",
    )

    status_sample_s: int = setting(
        "LLMGATE_STATUS_SAMPLE_S",
        10,
        "Seconds between the samples of the instance's status the gateway keeps for 15 "
        "minutes, so that /status opens with that history (docs/observability.md). 0: none "
        "kept, the page charts only what it polls itself.",
    )

    log_requests: bool = setting(
        "LLMGATE_LOG_REQUESTS",
        True,
        "One JSON line per request on stderr (its outcome, timings, usage and cost: the "
        "receipt to match with the provider's invoice; docs/observability.md). Off: no line "
        "is built or written, for a deployment that keeps nginx's access log and the metrics "
        "only; the benchmark's features-off row runs so.",
    )

    server_timing: bool = setting(
        "LLMGATE_SERVER_TIMING",
        True,
        "The gateway's own time by stage on every answer: a Server-Timing header (queue, "
        "auth, cache, connect, upstream, work and the total the gateway added), a stream's "
        "per-event relay time in a last SSE comment, the same figures in the log line, the "
        "llmgate_added_seconds histogram and the request's span (docs/observability.md). "
        "Off: none of them.",
    )

    log_prompts: bool = setting(
        "LLMGATE_LOG_PROMPTS",
        False,
        "Add the request body to each request's log line. Off by default: prompts are "
        "data your users did not agree to have in logs.",
    )

    otel_endpoint: str = setting(
        "LLMGATE_OTEL_ENDPOINT",
        "",
        "OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces): one span per "
        "request with the GenAI attributes, child spans for the cache lookup, each upstream "
        "attempt and the stream; W3C traceparent taken from the caller and sent upstream "
        "(docs/observability.md). Empty: tracing is off and OpenTelemetry is never imported.",
    )
    otel_service_name: str = setting(
        "LLMGATE_OTEL_SERVICE_NAME",
        "llmgate",
        "The service.name of the gateway's spans.",
    )
    tls_port: int = setting(
        "LLMGATE_TLS_PORT",
        8443,
        "Port of `make run`'s HTTPS listener at nginx (HTTP/2 and HTTP/1.1, same routes as "
        "LLMGATE_PORT); 0: no HTTPS listener.",
    )
    tls_cert: str = setting(
        "LLMGATE_TLS_CERT",
        "",
        "PEM certificate (chain) nginx serves on LLMGATE_TLS_PORT. Empty: a self-signed one "
        "for localhost and 127.0.0.1, made with openssl in the run directory.",
    )
    tls_key: str = setting(
        "LLMGATE_TLS_KEY",
        "",
        "PEM private key of LLMGATE_TLS_CERT (both or neither).",
    )
