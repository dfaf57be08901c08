"""The request fields the gateway relies on, checked before anything goes upstream. No I/O.

We validate only what we use or what would otherwise reach the provider as a billable,
doomed call (a chat request without messages); everything else is the upstream's to judge.
"""

from __future__ import annotations

import json
from typing import Any

from app.errors import BadRequest

# route -> (required field, accepted JSON types) pairs
_REQUIRED: dict[str, tuple[tuple[str, tuple[type, ...]], ...]] = {
    "chat": (("model", (str,)), ("messages", (list,))),
    "completions": (("model", (str,)), ("prompt", (str, list))),
    "embeddings": (("model", (str,)), ("input", (str, list))),
    "responses": (("model", (str,)),),
}

_JSON_NAMES = {str: "a string", list: "an array", bool: "a boolean", dict: "an object"}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest saying what is wrong with it."""
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(
            f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", code="invalid_json")
    return body


def validate(route: str, body: dict[str, Any]) -> None:
    for name, kinds in _REQUIRED.get(route, ()):
        if name not in body or body[name] is None:
            raise BadRequest(
                f"Missing required parameter: '{name}'.",
                param=name,
                code="missing_required_parameter",
            )
        if not isinstance(body[name], kinds) or (kinds == (list,) and not body[name]):
            want = " or ".join(_JSON_NAMES[k] for k in kinds)
            raise BadRequest(
                f"Invalid value for '{name}': expected {want}"
                f"{' with at least one item' if kinds == (list,) else ''}.",
                param=name,
                code="invalid_type",
            )
    if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
        raise BadRequest(
            "Invalid value for 'stream': expected a boolean.", param="stream", code="invalid_type"
        )


def wants_stream(body: dict[str, Any]) -> bool:
    return body.get("stream") is True


def wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
