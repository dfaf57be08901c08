"""The live status page: ``GET /status`` and its assets. Static files only, no state.

The page is plain HTML, two scripts and one stylesheet from ``app/edge/static/``: status.js polls
``status.json`` (the metrics snapshot served by the API blueprint, with the history the
gateway kept) and draws its own charts; status-keys.js adds the gateway keys table from
``admin/usage``. The page needs no network beyond this gateway. Only the files named in
``_ASSETS`` are served: ``<name>`` never becomes a filesystem path.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, request
from werkzeug.exceptions import NotFound

STATIC_DIR = Path(__file__).resolve().parent / "static"

_PAGE = ("status.html", "text/html; charset=utf-8")
_ASSETS = {
    "status.js": "text/javascript; charset=utf-8",
    "status-keys.js": "text/javascript; charset=utf-8",
    "status.css": "text/css; charset=utf-8",
}
# Everything the page loads comes from here; JS sets styles through the CSSOM, which
# style-src does not restrict, so no 'unsafe-inline' is needed.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

status_page = Blueprint("status_page", __name__)


@status_page.route("/status", methods=["GET"])
def page() -> Response:
    response = _static(*_PAGE)
    response.headers["Content-Security-Policy"] = _CSP
    return response


@status_page.route("/status/assets/<name>", methods=["GET"])
def asset(name: str) -> Response:
    content_type = _ASSETS.get(name)
    if content_type is None:
        raise NotFound()
    return _static(name, content_type)


def _static(name: str, content_type: str) -> Response:
    # Read on each request: the files are a few kB, and an edit shows on the next reload.
    response = Response((STATIC_DIR / name).read_bytes(), content_type=content_type)
    # no-cache = revalidate every time; the ETag makes that a 304 when nothing changed.
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.add_etag()
    response.make_conditional(request)  # 304 with no body when If-None-Match matches
    return response
