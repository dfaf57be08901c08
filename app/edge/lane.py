"""The hot routes' lane: API calls served straight from the WSGI environ, past Flask's
per-request machinery, in the same Flask app.

A POST to one of the API's own endpoints (chat, completions, embeddings, responses,
messages, count_tokens; the exact path) is answered here, before Flask builds its request
and app contexts, its Request, routes it and wraps the answer in a Response: the same
``answer`` as Flask's view (app/edge/calls.py), written to the server as it is. Everything
else (other methods, paths, the operator's endpoints, errors of routing) goes through Flask
as before. Installed as Flask documents middleware, by wrapping ``app.wsgi_app``.

What the lane skips, and why nothing needs it on these calls (bench/HISTORY.md, "The
hot routes' lane"): ``before_request``/``after_request`` hooks (the only one, the operator
guard, covers other paths), Flask's signals and the session (none used), the request and
app contexts (the gateway never reads them: app/layers.toml lets only the edge and factory
import Flask), routing (an exact path and method pick the route), and Werkzeug's Response
(the headers go out as the reply has them; the statuses whose body or headers HTTP
constrains, 1xx, 204 and 304, and a Location header still take Werkzeug's Response).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Flask
from werkzeug.http import HTTP_STATUS_CODES

from app.core.admission import Held, Ticket
from app.edge.calls import answer
from app.edge.routes import release_when_closed, to_response
from app.request.call import Reply
from app.request.routes import BY_PATH

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
# Headers Werkzeug's Response rewrites (an IRI made a URI): such an answer takes it.
_REWRITTEN = frozenset({"location", "content-location"})


def install(app: Flask) -> None:
    """Serve the hot routes in the lane; anything else goes to Flask's own ``wsgi_app``."""
    flask_app: WSGIApp = app.wsgi_app

    def wsgi_app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = BY_PATH.get(path)
        if route is None or environ["REQUEST_METHOD"] != "POST":
            return flask_app(environ, start_response)
        ticket = app.extensions["llmgate.admission"].ticket()
        reply, body = answer(
            route,
            environ,
            path,
            app.extensions["llmgate"],
            ticket,
            app.config["MAX_CONTENT_LENGTH"],
        )
        try:
            return _send(reply, body, ticket, environ, start_response)
        except BaseException:
            ticket.release()
            raise

    app.wsgi_app = wsgi_app  # type: ignore[method-assign]


def _send(
    reply: Reply,
    body: bytes | Iterator[bytes],
    ticket: Ticket,
    environ: dict[str, Any],
    start_response: StartResponse,
) -> Iterable[bytes]:
    status = reply.status
    if status >= 200 and status not in (204, 304):
        if isinstance(body, bytes):
            headers = _whole_headers(reply.headers, len(body))
            pieces: Iterator[bytes] = iter([body])
        else:
            headers = None if _rewritten(reply) else reply.headers
            pieces = body
        if headers is not None:
            start_response(_STATUS_LINES.get(status) or _status_line(status), headers)
            return Held(pieces, ticket.release)
    # 1xx, 204, 304 or a Location: Werkzeug's Response, as Flask's view sends it.
    response = release_when_closed(lambda: to_response(reply, body), ticket)
    return response(environ, start_response)


def _whole_headers(headers: list[tuple[str, str]], length: int) -> list[tuple[str, str]] | None:
    """A whole body's headers as they are sent: the reply's, with the body's own length in
    place of any Content-Length it had; None when one is a header Werkzeug rewrites (one pass
    over them, each name lowered once)."""
    sent = []
    for name, value in headers:
        lower = name.lower()
        if lower in _REWRITTEN:
            return None
        if lower != "content-length":
            sent.append((name, value))
    sent.append(("Content-Length", str(length)))
    return sent


def _status_line(status: int) -> str:
    """The status line as Werkzeug writes it (its reason phrase in capitals)."""
    return f"{status} {HTTP_STATUS_CODES.get(status, 'unknown').upper()}"


# Every status Werkzeug names, its line made once.
_STATUS_LINES = {status: _status_line(status) for status in HTTP_STATUS_CODES}


def _rewritten(reply: Reply) -> bool:
    return any(k.lower() in _REWRITTEN for k, _ in reply.headers)
