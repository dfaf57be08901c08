"""A call's usage, metered: the body edits that ask for it or bound it, and the stream
filter that takes the usage chunk out again. No I/O here.

With gateway keys the gateway counts each call's tokens (app/tenancy/access.py). A chat or
completions stream reports its usage only in a last chunk the caller must ask for, so the
gateway asks for it (``with_usage_requested``) and takes it out of the stream of a caller
who did not (``without_usage_chunk``; which chunk it is: app/request/usage.py); a key's
``max_tokens`` cap is sent to a call that names no bound (``with_output_cap``). Each edit
changes one member and keeps every other byte (app/request/jsonedit.py): the provider's
prompt cache keys on the exact prompt bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from app.request import jsonedit
from app.request.routes import Route
from app.request.usage import Usage, usage_chunk
from llmgate_wire import sse


def with_output_cap(raw: bytes, body: Mapping[str, Any], route: Route, cap: int) -> bytes:
    """The caller's body with its route's output bound (``Route.output_field``) set to
    ``cap``, every other byte kept (JSON that is not UTF-8 is re-encoded)."""
    name = route.output_field
    assert name is not None  # the cap is put only where the route has such a field
    try:
        return jsonedit.with_member(raw, name, str(cap).encode())
    except ValueError:
        return json.dumps({**body, name: cap}).encode()


def with_usage_requested(raw: bytes, body: Mapping[str, Any]) -> bytes:
    """The caller's body asking for ``stream_options.include_usage``, every other byte kept
    (app/request/jsonedit.py); the body itself when it already asks or cannot be edited."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return raw
    wanted = {**options, "include_usage": True} if isinstance(options, dict) else None
    try:
        if wanted is not None:
            return jsonedit.with_value(raw, "stream_options", json.dumps(wanted).encode())
        return jsonedit.with_member(raw, "stream_options", b'{"include_usage":true}')
    except ValueError:
        return raw


def without_usage_chunk(
    batches: Iterator[list[bytes]], on_usage: Callable[[Usage], None]
) -> Iterator[list[bytes]]:
    """A stream without its usage chunk, for a caller who did not ask for it (the gateway
    asked the upstream for it, to count the key's tokens): the usage goes to ``on_usage``.
    The ``"usage":null`` the upstream then adds to every other chunk is taken out too, so
    the caller gets the bytes it would have had without the gateway's asking."""
    for batch in batches:
        kept = []
        for chunk in batch:
            if chunk.startswith(b"data: {"):
                # Every event but the last of such a stream: the null cut in one search, none
                # of the general path's calls (no id line, and not the usage chunk: its usage
                # is an object).
                cut = chunk.replace(b',"usage":null', b"", 1)
                if len(cut) < len(chunk):
                    kept.append(cut)
                    continue
                if _USAGE not in chunk:
                    # No usage member at all (a server that writes no null, as many
                    # OpenAI-compatible ones do): neither the usage chunk nor a null to cut.
                    kept.append(chunk)
                    continue
            # A resumable stream's event starts with its id line (docs/streams.md).
            id_line, event = sse.split_id(chunk)
            usage = usage_chunk(event)
            if usage is None:
                kept.append(id_line + _without_null_usage(event) if _NULL_USAGE in event else chunk)
            else:
                on_usage(usage)
        if kept:
            yield kept


# In compact JSON, unescaped, these bytes can only be a member: inside a string the quotes
# would be escaped. Chunks of chat and completions streams have usage at the top level only.
_NULL_USAGE = b'"usage":null'
# A chunk without these bytes has no usage member (usage_chunk reads none in it either).
_USAGE = b'"usage"'


def _without_null_usage(chunk: bytes) -> bytes:
    if not chunk.startswith(b"data: {"):
        return chunk
    cut = chunk.replace(b',"usage":null', b"", 1)  # one search, not a test and a search
    return cut if len(cut) < len(chunk) else chunk.replace(b'"usage":null,', b"", 1)
