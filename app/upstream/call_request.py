"""The upstream request a call makes, built only when the call goes upstream. No I/O here.

The gateway plans every call (app/gateway.py) but gives the flight's producer a way to build
this request, not the request (app/streams/upstream_call.py, ``UpstreamCall``): a call answered
from the cache sends nothing upstream, so it filters no headers and builds no request. What
must still be refused before any answer, a header value no request could carry, is checked
when the call is planned (app/request/headers.py, ``check_header_values``).
"""

from __future__ import annotations

from typing import Any

from app.request import schema
from app.request.affinity import affinity_of
from app.request.call import Call
from app.request.headers import upstream_request_headers, without_credentials
from app.tenancy.keyring import GatewayKey
from app.upstream.transport import UpstreamRequest


def request_for(
    call: Call, forward: bytes, *, body: dict[str, Any] | None, stream: bool, key: GatewayKey | None
) -> UpstreamRequest:
    """What ``call`` sends upstream: ``forward`` (its body as it goes on), the caller's
    headers that may go on, the upstreams ``key`` (its gateway key, None when keys are off)
    may use. ``body``: the validated body (None for a forwarded route), for the model and
    the conversation's affinity key (app/request/affinity.py)."""
    headers = upstream_request_headers(call.headers, stream=stream)
    return UpstreamRequest(
        method=call.method,
        path=call.path.removeprefix("/v1"),
        query=call.query,
        # The upstream's own key (or the operator's fallback) is added per upstream; with
        # gateway keys the caller's credentials never leave (its key is ours, not theirs).
        headers=headers if key is None else without_credentials(headers),
        body=forward if forward or call.method not in ("GET", "HEAD") else None,
        stream=stream,
        model=schema.model_of(body),
        upstreams=None if key is None else key.upstreams,
        route=call.route,
        span=call.trace.span,
        affinity=affinity_of(call.route, body, call.headers),
    )
