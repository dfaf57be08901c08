"""One API call from the WSGI environ to the reply and body the server sends.

Flask's views (app/edge/routes.py) and the hot routes' lane (app/edge/lane.py) both answer
through ``answer``, so a call is the same call whichever way it came in. Rule: nothing here
reads Flask's request or app context; everything comes from the environ and the objects the
app factory built. Every failure becomes a reply in the call's own error shape, and the
call's admission slots are given back however it ends (app/core/admission.py's ``Held``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from werkzeug.sansio.utils import get_content_length

from app.core import errors
from app.core.admission import Ticket
from app.edge.finish import finish
from app.gateway import Gateway
from app.request.call import Call, Reply, Trace, error_reply
from app.request.headers import environ_headers
from app.request.paths import forwarded_path
from app.request.routes import Route
from app.request.stages import queue_start

log = logging.getLogger("llmgate")
# No OpenAI-style API path or query comes near this; a longer one is refused here rather than
# sent upstream (nginx refuses request lines above its 8 KiB buffers itself, also as JSON).
MAX_TARGET_BYTES = 4096
_CUT_SHORT = "The request body was cut short: the connection closed before all of it arrived."


def answer(
    route: Route,
    environ: dict[str, Any],
    path: str,
    gateway: Gateway,
    ticket: Ticket,
    max_body: int,
) -> tuple[Reply, bytes | Iterator[bytes]]:
    """The call's reply with its last headers, and the body to send (bytes, or a stream's
    batches). ``ticket`` holds the call's admission slots: the caller gives them back when
    the server closes the body (``Held``); here only if the answer cannot be made."""
    method = environ["REQUEST_METHOD"]
    call = Call(
        route=route,
        method=method,
        path=path,
        query=environ.get("QUERY_STRING", ""),
        headers=environ_headers(environ),
        body=b"",
        client_socket=environ.get("gunicorn.socket"),
        trace=Trace(request_id=_request_id(environ)),
        admission=ticket,
    )
    if nginx_start := environ.get("HTTP_X_REQUEST_START"):
        # When nginx took the call (nginx/llmgate.conf.template): the queue's stage.
        call.trace.queued(queue_start(nginx_start))
    try:
        target = len(path) + len(call.query)
        if target > MAX_TARGET_BYTES:
            raise errors.URITooLong(
                f"Request URL is too long ({target} bytes; at most {MAX_TARGET_BYTES})."
            )
        # Confined to /v1 and encoded again (app/request/paths.py): the path goes upstream as data.
        call = call.edited(path=forwarded_path(call.path))
        # Who is calling comes first, from the headers: a stranger's body is never read, and
        # its 401 leaves while it is still sending it (app/edge/worker.py then closes the
        # connection rather than read the rest; docs/security.md).
        caller = gateway.identify(call)
        call = call.edited(body=read_body(environ, max_body))
        reply = gateway.handle(call, caller)
    except errors.GatewayError as exc:
        call.trace.gateway_failed()
        reply = error_reply(exc, route.door)
    except Exception:
        # A bug of ours: the caller gets a JSON 500, the log gets the traceback, and the
        # request is still counted and logged like every other.
        log.exception("unhandled error on %s %s", method, path)
        call.trace.gateway_failed()
        reply = error_reply(errors.GatewayError("Internal gateway error."), route.door)
    try:
        return finish(call, reply, gateway.settings, gateway.metrics, gateway.prices)
    except BaseException:
        ticket.release()
        raise


def _request_id(environ: Mapping[str, Any]) -> str:
    """The caller's (or nginx's) X-Request-ID when it is sane, else a new one."""
    given = environ.get("HTTP_X_REQUEST_ID", "")
    if 0 < len(given) <= 128 and given.isprintable() and " " not in given:
        return given
    return uuid.uuid4().hex


def read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes with or without Content-Length
    (a chunked upload has none, and Werkzeug would cut it short silently), and a body cut
    short: nginx passes bodies on as they arrive, so a caller that leaves mid-upload ends
    the body early here, and part of a body must not be taken for the whole."""
    declared = declared_length(environ)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    stream = environ["wsgi.input"]
    parts: list[bytes] = []
    size = 0
    # Read until the declared length (no last read to learn the end: a small body is one
    # read), or a body of unknown length until it ends or passes the limit.
    want = limit + 1 if declared is None else declared
    try:
        while size < want and (chunk := stream.read(min(65536, want - size))):
            parts.append(chunk)
            size += len(chunk)
    except OSError as exc:
        # gunicorn's NoMoreData: the connection ended inside a chunked body.
        raise errors.BadRequest(_CUT_SHORT, code="incomplete_body") from exc
    if size > limit:
        raise _too_large(limit)
    if declared is not None and size < declared:
        # A body of known length that ended early reads as a short one, without an error.
        raise errors.BadRequest(_CUT_SHORT, code="incomplete_body")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def declared_length(environ: Mapping[str, Any]) -> int | None:
    """The body's length as Werkzeug's ``get_content_length`` reads it from the environ
    (None: chunked, or no Content-Length), its commonest case read directly: a length of
    ASCII digits alone, no Transfer-Encoding, is the number they spell (Werkzeug's regex,
    strip and two calls cost about 1.5 % of a cache hit)."""
    length, coding = environ.get("CONTENT_LENGTH"), environ.get("HTTP_TRANSFER_ENCODING")
    if coding is None and length is not None and length.isascii() and length.isdigit():
        return int(length)
    return get_content_length(length, coding)


def _too_large(limit: int) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(f"Request body is larger than the {limit} byte limit.")
