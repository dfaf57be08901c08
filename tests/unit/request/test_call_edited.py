"""``Call.edited`` (app/request/call.py) is ``dataclasses.replace`` built by hand: every field
kept but the one edited. A field added to Call and left out of ``edited`` fails here."""

from __future__ import annotations

import dataclasses
import socket

from app.core.admission import Ticket
from app.request import routes
from app.request.call import Call, Trace


def _call() -> Call:
    # Every field away from its default, so a field dropped (left at its default) shows.
    return Call(
        route=routes.CHAT,
        method="POST",
        path="/v1/chat/completions",
        query="a=1",
        headers=[("Authorization", "Bearer x")],
        body=b"{}",
        client_socket=socket.socket(),
        trace=Trace(request_id="r-1"),
        admission=Ticket(),
    )


def test_an_edited_call_is_what_replace_makes() -> None:
    call = _call()
    try:
        names = [f.name for f in dataclasses.fields(Call)]
        assert names == ["route", "method", "path", "query", "headers", "body",
                         "client_socket", "trace", "admission"]  # fmt: skip
        for edit in ({"path": "/v1/x"}, {"body": b"[1]"}, {"body": b""}):
            edited, replaced = call.edited(**edit), dataclasses.replace(call, **edit)
            for name in names:
                assert getattr(edited, name) is getattr(replaced, name), (edit, name)
        assert call.edited(path="/v1/y").body is call.body
    finally:
        if call.client_socket is not None:
            call.client_socket.close()
