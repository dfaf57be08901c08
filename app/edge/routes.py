"""HTTP routes: turn a Flask request into a ``Call`` and a ``Reply`` into a response. Thin.

Every error leaves as OpenAI-shaped JSON, including Werkzeug's own (404, 405, 413) and
anything unexpected (500, logged with its traceback, never sent to the caller).
"""

from __future__ import annotations

import base64
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from app.core import errors
from app.core.admission import Held, Ticket
from app.edge.calls import answer
from app.edge.readiness import drain_requested, readiness
from app.edge.status_data import status_document
from app.gateway import Gateway
from app.request.call import Reply, error_reply
from app.request.routes import API, BY_PATH, PASSTHROUGH, RESUME, Route, door_of
from app.tenancy.keyring import same_secret
from app.tenancy.limits import period
from app.tenancy.spend import shaped_report

log = logging.getLogger("llmgate")
# One start time for every worker (gunicorn's master sets it before forking), so uptime on
# the status page does not depend on which worker answered.
STARTED = float(os.environ.get("LLMGATE_STARTED_AT") or time.time())
api = Blueprint("api", __name__)

_FORWARD_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# The endpoints we serve ourselves accept only their routes' methods (app/request/routes.py)
# and these; the catch-all must not forward others.
_METHODS = {**{route.path: list(route.methods) for route in API}, "/v1/models": ["GET"]}


def _gateway() -> Gateway:
    return current_app.extensions["llmgate"]


def api_call() -> Response:
    # GET on chat/completions and responses lists stored objects upstream: forwarded as is.
    route = BY_PATH[request.path] if request.method == "POST" else PASSTHROUGH
    return _forward(route)


for _route in API:  # each route's path, from the table
    assert _route.path is not None
    api.add_url_rule(_route.path, view_func=api_call, methods=list(_route.methods))


@api.route("/v1/streams/<stream_id>", methods=["GET", "DELETE"])
def resume_stream(stream_id: str) -> Response:
    """A resumable stream read again from after the caller's last event, or stopped
    (docs/streams.md); the gateway's own, never forwarded."""
    return _forward(RESUME)


@api.route("/v1/models", methods=_METHODS["/v1/models"])
@api.route("/v1/<path:rest>", methods=_FORWARD_METHODS)
def passthrough(rest: str = "") -> Response:
    allowed = _METHODS.get(request.path)
    if allowed is not None and request.method not in allowed:
        raise MethodNotAllowed(valid_methods=allowed)
    return _forward(PASSTHROUGH)


def _forward(route: Route) -> Response:
    ticket = current_app.extensions["llmgate.admission"].ticket()
    reply, body = answer(
        route,
        request.environ,
        request.path,
        _gateway(),
        ticket,
        current_app.config["MAX_CONTENT_LENGTH"],
    )
    return release_when_closed(lambda: to_response(reply, body), ticket)


def release_when_closed(respond: Callable[[], Response], ticket: Ticket) -> Response:
    """The response, whose body gives the call's admission slots back once the server has
    sent it or the caller left (the server closes it either way); at once if building the
    response fails."""
    try:
        response = respond()
    except BaseException:
        ticket.release()
        raise
    # The body is bytes: to_response builds it from a Reply.
    response.response = Held(cast(Iterable[bytes], response.response), ticket.release)
    return response


def to_response(reply: Reply, body: bytes | Iterator[bytes] | None = None) -> Response:
    """The response for ``reply``; ``body`` is what to send when it is not the reply's own
    bytes (a stream's joined batches, observe.finish)."""
    if body is None:
        assert isinstance(reply.body, bytes), "a stream is sent through observe.finish"
        body = reply.body
    # Bytes, or an iterator of bytes already: passed through as it is, without Werkzeug's
    # two wrappers (an encoder and a closer) around every write of a stream. Held
    # (release_when_closed) is the body the server closes.
    response = Response(body, status=reply.status, direct_passthrough=True)
    response.headers.clear()
    for name, value in reply.headers:
        response.headers.add(name, value)
    if isinstance(body, bytes):
        response.headers["Content-Length"] = str(len(body))
    return response


@api.route("/metrics", methods=["GET"])
def metrics() -> Response:
    registry = _gateway().metrics
    if registry is None:
        raise errors.NotFound("Metrics are not enabled.")
    body, content_type = registry.exposition()
    return Response(body, content_type=content_type)


@api.route("/status.json", methods=["GET"])
def status_json() -> Response:
    gateway = _gateway()
    if not gateway.metrics.watched:
        raise errors.NotFound("Metrics are not enabled.")
    now = time.time()
    document = status_document(gateway.metrics.snapshot(), now=now, started=STARTED)
    since = request.args.get("since")
    if since is not None:
        # The samples the gateway kept (app/edge/status_history.py) newer than the page's newest.
        after = _unix_time(since)
        history = current_app.extensions.get("llmgate.history")
        document["history"] = [] if history is None else history.since(after, now)
    response = jsonify(document)
    response.headers["Cache-Control"] = "no-cache"
    return response


def _unix_time(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise errors.BadRequest("since must be a Unix time in seconds.", param="since")
    return value


@api.route("/admin/usage", methods=["GET"])
def admin_usage() -> Response:
    """Every gateway key's counts in the current windows, with its limits; with ``period``
    (a UTC day 2026-01-31 or month 2026-01), what each key spent then by model and upstream,
    from the spend ledger (operator only)."""
    access = _gateway().access
    if access is None:
        raise errors.NotFound("Gateway keys are off (LLMGATE_KEYS_FILE is not set).")
    asked = request.args.get("period")
    response = jsonify(access.usage() if asked is None else _spent(asked))
    response.headers["Cache-Control"] = "no-store"
    return response


def _spent(asked: str) -> dict:
    """A day's or month's spend from the ledger (app/tenancy/spend.py's report)."""
    ledger = current_app.extensions.get("llmgate.ledger")
    if ledger is None:
        raise errors.NotFound("The spend ledger is off (LLMGATE_LEDGER_URL is not set).")
    try:
        start, end = period(asked)
    except ValueError as exc:
        raise errors.BadRequest(f"period: {exc}.", param="period") from None
    sums = ledger.report(start, end)
    if sums is None:
        message = "The spend ledger cannot be read right now; retry shortly."
        raise errors.ServiceUnavailable(message, code="ledger_unavailable")
    return shaped_report(sums, start, end)


# What only the operator may read when LLMGATE_OPERATOR_TOKEN is set (nginx also limits
# them to the addresses of LLMGATE_OPS_ALLOW).
OPERATOR_PATHS = frozenset({"/metrics", "/status", "/status.json"})
OPERATOR_PREFIX = "/admin/"


def register_operator_guard(app: Flask) -> None:
    @app.before_request
    def operator_only() -> Response | None:
        path = request.path
        if path not in OPERATOR_PATHS and not path.startswith(OPERATOR_PREFIX):
            return None
        token = _gateway().settings.operator_token
        if not token or _operator_token_given(token):
            return None
        error = errors.OperatorTokenRequired(
            "This endpoint needs the operator token: 'Authorization: Bearer <token>'.",
            # A browser (the status page) asks for it as Basic auth, the token as password.
            headers={"WWW-Authenticate": 'Basic realm="llmgate operator", charset="UTF-8"'},
        )
        return to_response(error_reply(error))


def _operator_token_given(token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given.strip(), validate=True).decode().partition(":")[2]
        except ValueError:
            return False
    elif scheme.lower() != "bearer":
        return False
    return same_secret(given.strip(), token)


@api.route("/healthz", methods=["GET"])
def healthz() -> Response:
    return jsonify(status="ok")


@api.route("/readyz", methods=["GET"])
def readyz() -> Response:
    gateway = _gateway()
    ready, checks = readiness(gateway.settings, gateway.upstream.specs, gateway.upstream.states())
    if gateway.lifecycle.draining or drain_requested(gateway.settings.drain_file):
        # Stopping (SIGTERM), or about to (the drain file of a preStop hook): balancers must
        # send nothing new here, whatever the dependencies say.
        ready, checks["draining"] = False, True
    response = jsonify(ready=ready, checks=checks)
    response.status_code = 200 if ready else 503
    return response


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(errors.GatewayError)
    def gateway_error(exc: errors.GatewayError) -> Response:
        return to_response(error_reply(exc, _door()))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return to_response(error_reply(_translate(exc), _door()))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return to_response(error_reply(errors.GatewayError("Internal gateway error."), _door()))


def _door() -> str:
    """The door whose error shape a request outside the views gets (a 404 or 405 under
    /v1/messages is answered as Anthropic answers it)."""
    return door_of(request.path)


def _translate(exc: HTTPException) -> errors.GatewayError:
    if isinstance(exc, RequestEntityTooLarge):
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return errors.PayloadTooLarge(f"Request body is larger than the {limit} byte limit.")
    if exc.code == 404:
        return errors.NotFound(f"Unknown request URL: {request.method} {request.path}.")
    if exc.code == 405:
        allowed = ", ".join(getattr(exc, "valid_methods", None) or [])
        return errors.MethodNotAllowed(
            f"Method {request.method} is not allowed on {request.path}.",
            headers={"Allow": allowed} if allowed else None,
        )
    if exc.code == 400:
        return errors.BadRequest(exc.description or "Bad request.")
    return errors.GatewayError(exc.description or exc.name, status=exc.code or 500, code=None)
