"""The app factory: builds every per-worker object inside the worker, after gevent patched.

gunicorn loads ``app.factory:create_app()`` in each worker (no preload), so the urllib3
PoolManager and everything holding sockets are created once per worker, never at import.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from flask import Flask

from app.cache import build_answer_cache
from app.core.admission import Gate, Limits
from app.core.config import Settings, SettingsError
from app.core.names import install as install_names
from app.edge import lane
from app.edge.routes import STARTED, api, register_error_handlers, register_operator_guard
from app.edge.status_data import history_sample, status_document
from app.edge.status_history import DIRECTORY, History, record
from app.edge.status_page import status_page
from app.gateway import Gateway
from app.observe import access_log
from app.observe.metrics import Metrics
from app.observe.tracing import Tracer
from app.patches import http_headers
from app.store import build_resume_store, build_spend_ledger
from app.tenancy.access import Access
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import KeysFileError
from app.tenancy.limits import Counters, MemoryCounters
from app.tenancy.prices import PriceTable
from app.upstream import catalog as upstreams
from app.upstream.breaker import BreakerPolicy
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import Upstream


def create_app(settings: Settings | None = None, environ: Mapping[str, str] | None = None) -> Flask:
    environ = os.environ if environ is None else environ
    settings = settings or Settings.from_env(environ)
    specs, prices = load_upstreams(settings, environ)
    # The upstream answers' headers parsed without the email package (same messages).
    http_headers.install()
    # New connections' addresses: numbers never looked up, a name's answer kept a while
    # (app/core/names.py): a burst of connects no longer waits on gevent's lookup threads.
    install_names(settings.dns_ttl_s)
    app = Flask("llmgate")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # Built here, inside the worker: the pool, the cache client and the metrics.
    metrics = Metrics()
    app.extensions["llmgate"] = Gateway(
        settings,
        Upstream(settings, specs, metrics=metrics, breaker_policy=breaker_policy(settings)),
        build_answer_cache(settings, metrics),
        metrics,
        build_access(settings, metrics, prices),
        build_tracer(settings, metrics),
        prices,
        build_resume_store(settings, metrics),
    )
    # This worker's admission limits (app/core/admission.py), taken by each API call's ticket.
    app.extensions["llmgate.admission"] = Gate(
        Limits(settings.max_requests_per_worker, settings.max_streams_per_worker),
        metrics.observe_admission,
    )
    # Werkzeug would answer `/v1//models` with an HTML 308 to `/v1/models` (routing redirects
    # bypass the error handlers): no redirects, a doubled slash is refused (app/request/paths.py).
    app.url_map.merge_slashes = False
    app.extensions["llmgate.history"] = start_history(settings, metrics)
    # Closed by gunicorn's worker_exit hook (gunicorn.conf.py): what is queued is written.
    access = app.extensions["llmgate"].access
    app.extensions["llmgate.ledger"] = access.ledger if access is not None else None
    app.register_blueprint(api)
    app.register_blueprint(status_page)
    register_error_handlers(app)
    register_operator_guard(app)
    # The API's calls past Flask's per-request machinery (app/edge/lane.py): the last
    # wrapper, so it sees every request first.
    lane.install(app)
    _log_to_stderr()
    return app


def build_access(
    settings: Settings, metrics: Metrics, prices: PriceTable | None = None
) -> Access | None:
    """Gateway keys and their limits, when LLMGATE_KEYS_FILE is set: counted in Memcached
    when there is one (shared by every worker and instance), else in this worker."""
    if not settings.keys_file:
        return None
    from app.store import memcached_client
    from app.store.counters import MemcachedCounters

    # The same nodes as the answer cache, fixed and found by DNS alike (Kubernetes names
    # its Memcached pods by a headless service): a key's limits are one count for every
    # worker and instance, never one per worker.
    client = memcached_client(settings, "limits", metrics=metrics)
    counters: Counters = MemoryCounters() if client is None else MemcachedCounters(client)
    try:
        source = KeySource(settings.keys_file)
    except (OSError, KeysFileError) as exc:
        raise SettingsError(f"LLMGATE_KEYS_FILE: {exc}") from None
    return Access(
        source,
        counters,
        ledger=build_spend_ledger(settings, metrics),
        fail_open=settings.limits_fail == "open",
        # A stream lasts at most the deadline, and its last writes to a slow caller each
        # wait at most the send timeout (app/streams/flight.py).
        stream_hold_s=settings.deadline_s + settings.send_timeout_s,
        prices=prices,
        default_output_tokens=settings.default_max_output_tokens,
        on_usage=lambda key, usage, cost: metrics.observe_key_usage(
            key.name, usage.prompt if usage else None, usage.output if usage else None, cost
        ),
        on_counter_error=metrics.limit_counter_errors.inc,
    )


def start_history(settings: Settings, metrics: Metrics) -> History | None:
    """The status page's history (app/edge/status_history.py), and this worker's greenlet taking its
    turns at sampling: only with the metrics directory that every worker shares."""
    if not settings.status_sample_s or not metrics.multiproc_dir:
        return None
    import gevent

    history = History(Path(metrics.multiproc_dir) / DIRECTORY, settings.status_sample_s)

    def take(now: float) -> dict:
        return history_sample(status_document(metrics.snapshot(), now=now, started=STARTED))

    gevent.spawn(record, history, take, sleep=gevent.sleep)
    return history


def build_tracer(settings: Settings, metrics: Metrics) -> Tracer | None:
    """Traces over OTLP/HTTP when LLMGATE_OTEL_ENDPOINT is set; otherwise None, and
    OpenTelemetry is never imported (app/observe/tracing.py)."""
    if not settings.otel_endpoint:
        return None
    from app.observe.otel import build_tracer as otel_tracer

    return otel_tracer(settings, on_drop=metrics.trace_spans_dropped.inc)


def breaker_policy(settings: Settings) -> BreakerPolicy:
    return BreakerPolicy(
        failures_to_open=settings.breaker_failures,
        cooldown_s=settings.breaker_cooldown_s,
        cooldown_max_s=settings.breaker_cooldown_max_s,
    )


def load_upstreams(
    settings: Settings, environ: Mapping[str, str]
) -> tuple[list[UpstreamSpec], PriceTable | None]:
    """The upstreams and prices from LLMGATE_CONFIG's file, else the one upstream of
    LLMGATE_UPSTREAM_URL and no prices."""
    if settings.config_file:
        try:
            text = Path(settings.config_file).read_text()
        except OSError as exc:
            message = f"LLMGATE_CONFIG: cannot read {settings.config_file}: {exc}"
            raise SettingsError(message) from None
        specs = upstreams.load(text, environ, path=settings.config_file)
        return specs, upstreams.prices_of(text, path=settings.config_file)
    if not settings.upstream_url:
        raise SettingsError(
            "Neither LLMGATE_CONFIG nor LLMGATE_UPSTREAM_URL is set (make run starts a simulator)."
        )
    return upstreams.from_environment(settings.upstream_url, settings.upstream_api_key), None


def _log_to_stderr() -> None:
    """One JSON line per request on stderr (gunicorn's error log shares it)."""
    logger = logging.getLogger("llmgate")
    logger.setLevel(logging.INFO)
    if not any(getattr(h, "llmgate", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(access_log.BARE))  # its lines written as given
        handler.llmgate = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
