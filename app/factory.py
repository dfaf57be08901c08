"""The app factory: builds every per-worker object inside the worker, after gevent patched.

gunicorn loads ``app.factory:create_app()`` in each worker (no preload), so the urllib3
PoolManager and everything holding sockets are created once per worker, never at import.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from flask import Flask

from app.admission import Gate, Limits
from app.cache import build_answer_cache
from app.config import Settings, SettingsError
from app.gateway import Gateway
from app.metrics import Metrics
from app.routes import api, register_error_handlers
from app.statuspage import status_page
from app.upstream import Upstream


def create_app(settings: Settings | None = None, environ: Mapping[str, str] | None = None) -> Flask:
    settings = settings or Settings.from_env(os.environ if environ is None else environ)
    if not settings.upstream_url:
        raise SettingsError("LLMGATE_UPSTREAM_URL is not set (make run starts a simulator).")
    app = Flask("llmgate")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # Built here, inside the worker: the pool, the cache client and the metrics.
    metrics = Metrics()
    app.extensions["llmgate"] = Gateway(
        settings,
        Upstream(settings, metrics=metrics),
        build_answer_cache(settings, metrics),
        metrics,
    )
    # This worker's admission limits (app/admission.py), taken by each API call's ticket.
    app.extensions["llmgate.admission"] = Gate(
        Limits(settings.max_requests_per_worker, settings.max_streams_per_worker),
        metrics.observe_admission,
    )
    app.register_blueprint(api)
    app.register_blueprint(status_page)
    register_error_handlers(app)
    _log_to_stderr()
    return app


def _log_to_stderr() -> None:
    """One JSON line per request on stderr (gunicorn's error log shares it)."""
    logger = logging.getLogger("llmgate")
    logger.setLevel(logging.INFO)
    if not any(getattr(h, "llmgate", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.llmgate = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
