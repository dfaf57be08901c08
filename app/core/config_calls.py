"""The settings of a call's way, a declarative table: the upstream and its credentials, who
may call (gateway keys, the operator's endpoints), the connections, the timeouts, retries and
breakers, and the bounds on a body, a stream and a worker's admission. No I/O here.

Declarations only: ``Settings`` (app/core/config.py) joins this table with the instance's
(app/core/config_instance.py), reads it from the environment and checks it. Each field names
its variable and says what it does (app/core/config_reading.py, ``setting``); the docs are
checked against that text.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.config_reading import setting


@dataclass(frozen=True)
class CallSettings:
    """The settings of a call's way (see the module docstring)."""

    upstream_url: str = setting(
        "LLMGATE_UPSTREAM_URL",
        "",
        "Base URL of the upstream API, with its version path, like OPENAI_BASE_URL "
        "(e.g. https://api.openai.com/v1). `make run` starts the simulator when empty.",
    )
    upstream_api_key: str = setting(
        "LLMGATE_UPSTREAM_API_KEY",
        "",
        "Bearer key sent upstream for callers that send no Authorization header. Never logged.",
    )
    upstream_ca_bundle: str = setting(
        "LLMGATE_UPSTREAM_CA_BUNDLE",
        "",
        "PEM file of the CAs to trust for an https upstream (a private CA in front of a "
        "self-hosted model); empty: the system's trust store. Certificates are always verified.",
    )
    config_file: str = setting(
        "LLMGATE_CONFIG",
        "",
        "TOML file declaring several upstreams (keys, models, aliases, weights, priorities; "
        "see deploy/llmgate.example.toml). Empty: the one upstream of LLMGATE_UPSTREAM_URL.",
    )
    keys_file: str = setting(
        "LLMGATE_KEYS_FILE",
        "",
        "TOML file of gateway keys (SHA-256 hashes, each with its models, upstreams, limits "
        "and budgets; docs/security.md). Set: every call needs one of its keys and callers' "
        "own credentials never go upstream. Re-read when it changes. Empty: keys are off.",
    )
    limits_fail: str = setting(
        "LLMGATE_LIMITS_FAIL",
        "open",
        "open | closed: what a gateway key's limits do when Memcached cannot be reached: let "
        "calls pass uncounted (logged and counted), or refuse them with 503.",
    )
    default_max_output_tokens: int = setting(
        "LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS",
        16384,
        "Output tokens a gateway key's token or money budget holds for a call that names no "
        "max_tokens, when neither the key's max_tokens nor the price table's max_output_tokens "
        "for the model says (app/request/bounds.py). Set it to the largest output "
        "of the models you serve: a model that writes more overspends by the difference.",
    )
    operator_token: str = setting(
        "LLMGATE_OPERATOR_TOKEN",
        "",
        "Set: /metrics, /status, /status.json and /admin/* need 'Authorization: Bearer "
        "<token>' (or Basic auth with it as the password, for a browser). Never logged.",
    )
    ops_allow: str = setting(
        "LLMGATE_OPS_ALLOW",
        "127.0.0.1,::1",
        "Comma-separated addresses or CIDR ranges nginx lets read /metrics, /status, "
        "/status.json and /admin/* (others get 403); `all` for anyone (then set "
        "LLMGATE_OPERATOR_TOKEN).",
    )
    pool_size: int = setting(
        "LLMGATE_POOL_SIZE",
        6000,
        "Idle keep-alive upstream connections a worker keeps per upstream (urllib3 maxsize). "
        "Unset: LLMGATE_MAX_STREAMS_PER_WORKER (else 4/5 of LLMGATE_WORKER_CONNECTIONS), so a "
        "worker can keep a connection for every stream it may hold and steady load opens "
        "none; calls above it open extra connections that are closed after use.",
    )
    pool_spare_ratio: float = setting(
        "LLMGATE_POOL_SPARE_RATIO",
        0.1,
        "When a call finds no idle upstream connection and opens one, the worker also opens "
        "spares behind it (TCP and TLS done, idle in the pool) until it holds this share "
        "more connections than that moment had in use: the next busier moment finds them "
        "ready. 0: no spares.",
    )
    dns_ttl_s: float = setting(
        "LLMGATE_DNS_TTL_S",
        30.0,
        "Seconds a worker keeps a host name's addresses for new connections (upstreams, "
        "Memcached, the trace collector); an address written as numbers is never "
        "looked up. 0: every new connection looks its name up.",
    )
    connect_timeout_s: float = setting(
        "LLMGATE_CONNECT_TIMEOUT_S", 5.0, "Seconds to open a TCP (+TLS) connection upstream."
    )
    first_byte_timeout_s: float = setting(
        "LLMGATE_FIRST_BYTE_TIMEOUT_S",
        300.0,
        "Seconds from sending the request until the upstream's response headers. For a "
        "non-stream call this covers the whole generation, hence the large default.",
    )
    idle_timeout_s: float = setting(
        "LLMGATE_IDLE_TIMEOUT_S",
        120.0,
        "Longest silence allowed between two reads of the upstream body (reasoning models "
        "think for minutes before their first token).",
    )
    deadline_s: float = setting(
        "LLMGATE_DEADLINE_S",
        600.0,
        "Total seconds a request may take, retries and streaming included.",
    )
    heartbeat_s: float = setting(
        "LLMGATE_HEARTBEAT_S",
        15.0,
        "Idle seconds after which a stream gets a `: ping` SSE comment (0 disables).",
    )
    retries: int = setting(
        "LLMGATE_RETRIES",
        2,
        "Extra upstream attempts for failures that cannot have billed: connect errors, 429, "
        "502/503/504/529 before any byte reached the caller, within the deadline.",
    )
    retry_backoff_s: float = setting(
        "LLMGATE_RETRY_BACKOFF_S", 0.5, "Base of the full-jitter exponential backoff."
    )
    retry_backoff_max_s: float = setting(
        "LLMGATE_RETRY_BACKOFF_MAX_S", 8.0, "Cap of one backoff sleep."
    )
    retry_after_max_s: float = setting(
        "LLMGATE_RETRY_AFTER_MAX_S",
        20.0,
        "Longest upstream retry-after the gateway waits out itself; longer ones go back to "
        "the caller with the upstream's answer.",
    )
    retry_budget_percent: float = setting(
        "LLMGATE_RETRY_BUDGET_PERCENT",
        20.0,
        "Retries and failovers in flight in a worker may be at most this percent of its "
        "requests in flight (Envoy's retry budget; 100: no budget). Beyond it the upstream's "
        "answer or error goes back at once, so an outage does not multiply the load.",
    )
    retry_budget_min: int = setting(
        "LLMGATE_RETRY_BUDGET_MIN",
        3,
        "Concurrent retries a worker may always make, whatever the percent (a quiet worker "
        "still retries a blip).",
    )
    routing: str = setting(
        "LLMGATE_ROUTING",
        "affine",
        "How a call picks among upstreams of one priority: affine (a conversation returns to "
        "the upstream whose prompt cache holds its prefix: rendezvous hashing of its affinity "
        "key over the weights, within a bounded load) | weighted (at random by weight).",
    )
    routing_epsilon: float = setting(
        "LLMGATE_ROUTING_EPSILON",
        0.25,
        "Affine routing's bounded load: no upstream takes a call while it has (1 + this) "
        "times its weighted share of the worker's calls in flight; the call goes to its "
        "key's next choice. 0: shares kept exactly, least locality.",
    )
    breaker_failures: int = setting(
        "LLMGATE_BREAKER_FAILURES",
        5,
        "Consecutive failed attempts (no connection, timeout, reset, 5xx, a stream broken off "
        "after its headers) that open an upstream's circuit breaker in a worker; more than "
        "half of the last 20 attempts (at least 10) failing opens it too.",
    )
    breaker_cooldown_s: float = setting(
        "LLMGATE_BREAKER_COOLDOWN_S",
        5.0,
        "How long an open breaker keeps calls away before one probe goes through; doubled "
        "for each opening in a row, up to LLMGATE_BREAKER_COOLDOWN_MAX_S.",
    )
    breaker_cooldown_max_s: float = setting(
        "LLMGATE_BREAKER_COOLDOWN_MAX_S", 300.0, "Longest cooldown of an open breaker."
    )
    stream_buffer_bytes: int = setting(
        "LLMGATE_STREAM_BUFFER_BYTES",
        512 * 1024,
        "Bytes of a stream's events that may wait for a slow caller; beyond them the gateway "
        "stops reading the upstream until the caller catches up (memory per stream stays "
        "bounded).",
    )
    send_timeout_s: float = setting(
        "LLMGATE_SEND_TIMEOUT_S",
        60.0,
        "A caller that takes no bytes of its stream for this long is dropped and its upstream "
        "closed; nginx's send_timeout is rendered from the same value.",
    )
    max_body_bytes: int = setting(
        "LLMGATE_MAX_BODY_BYTES",
        20 * 1024 * 1024,
        "Largest request body accepted (413 above it); nginx's client_max_body_size is "
        "rendered from the same value.",
    )
    max_json_depth: int = setting(
        "LLMGATE_MAX_JSON_DEPTH",
        64,
        "Deepest nesting of arrays/objects accepted in a JSON request body (400 invalid_json "
        "above it), checked before parsing; at most 512, below Python's recursion limit.",
    )
    max_json_array_items: int = setting(
        "LLMGATE_MAX_JSON_ARRAY_ITEMS",
        1_000_000,
        "Most values in one JSON array of a request body (400 invalid_json above it). The "
        "longest real arrays are prompts given as token ids, up to a model's context.",
    )
    max_json_containers: int = setting(
        "LLMGATE_MAX_JSON_CONTAINERS",
        100_000,
        "Most JSON arrays and objects in a request body (400 invalid_json above it), counted "
        "before parsing: each costs far more parsed than its two bytes (a body of `{},{},...` "
        "at the body size limit parses into ~500 MiB).",
    )
    max_event_bytes: int = setting(
        "LLMGATE_MAX_EVENT_BYTES",
        8 * 1024 * 1024,
        "Largest single SSE event accepted from the upstream; a larger one ends the stream "
        "with an `upstream_event_too_large` error event. Bounds the memory one stream holds.",
    )
    max_requests_per_worker: int = setting(
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
    max_streams_per_worker: int = setting(
        "LLMGATE_MAX_STREAMS_PER_WORKER",
        6000,
        "Most streams (`stream: true`) one worker relays at once (0: no limit); a stream also "
        "takes a request slot. Unset: 2/5 of LLMGATE_WORKER_CONNECTIONS (15000 -> 6000), half "
        "the request slots, so long streams never take every slot from short calls.",
    )
