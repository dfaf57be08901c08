"""The request fields the gateway relies on, checked before anything goes upstream. No I/O.

We validate only what we use or what would otherwise reach the provider as a billable,
doomed call (a chat request without messages); everything else is the upstream's to judge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.core.errors import BadRequest
from app.request.routes import Route

_JSON_NAMES = {str: "a string", list: "an array", bool: "a boolean", dict: "an object"}


# Every byte but the five that shape a JSON document, for bytes.translate(None, ...).
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_OPENERS = frozenset(b"[{")
_CHUNK = 65536


def json_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether ``raw`` nests arrays/objects deeper than ``max_depth``, without parsing it.

    json.loads recurses once per level, so a body like ``[[[[...`` a few thousand deep
    raises RecursionError instead of a ValueError. This scan is linear and not recursive
    (``_brackets``); only the counting of the brackets it finds runs in Python.
    For invalid JSON the answer does not matter: json.loads rejects it anyway.
    """
    depth = 0
    for brackets in _brackets(raw):
        for byte in brackets:
            if byte in _OPENERS:
                depth += 1
                if depth > max_depth:
                    return True
            else:
                depth -= 1
    return False


def json_containers_exceed(raw: bytes, max_containers: int) -> bool:
    """Whether ``raw`` holds more than ``max_containers`` arrays and objects, without parsing
    it. Each costs json.loads far more than its two bytes: a 20 MiB body of ``{},{},...``
    parses into ~500 MiB of dicts. Brackets inside strings do not count (``_brackets``)."""
    count = 0
    for brackets in _brackets(raw):
        count += brackets.count(b"[") + brackets.count(b"{")
        if count > max_containers:
            return True
    return False


def _brackets(raw: bytes) -> Iterator[bytes]:
    """The brackets of ``raw`` that are not inside strings, in order, a piece at a time.

    Escaped backslashes, then escaped quotes, are dropped (left to right, as JSON pairs
    them), so every ``"`` left opens or closes a string; every byte but ``" [ ] { }`` goes
    too; of that skeleton, the pieces between quotes are string contents and are skipped.
    All of it runs in C (a byte-by-byte Python loop costs ~130 ns a byte: seconds for a
    20 MiB body), and the skeleton is split a chunk at a time so a body of millions of
    strings stays small in memory.
    """
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = raw.translate(None, _NOT_STRUCTURE)
    in_string = False  # at the start of the current chunk
    for start in range(0, len(skeleton), _CHUNK):
        pieces = skeleton[start : start + _CHUNK].split(b'"')
        yield b"".join(pieces[in_string::2])
        in_string ^= len(pieces) % 2 == 0  # an odd number of quotes in this chunk


def longest_array_exceeds(doc: Any, max_items: int) -> bool:
    """Whether any array in the parsed ``doc`` holds more than ``max_items`` values. Walks
    with a stack, not recursion (the depth is bounded already, but need not be small)."""
    pending = [doc]
    while pending:
        value = pending.pop()
        children = value if isinstance(value, list) else value.values()
        if isinstance(value, list) and len(value) > max_items:
            return True
        pending.extend(v for v in children if isinstance(v, (list, dict)))
    return False


def parse_body(
    raw: bytes,
    *,
    max_depth: int = 64,
    max_array_items: int = 1_000_000,
    max_containers: int = 100_000,
) -> dict[str, Any]:
    """The request body as a JSON object, or BadRequest saying what is wrong with it."""
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON object.", code="invalid_json")
    # Fewer brackets in all than a limit (strings' too): that scan cannot find it exceeded.
    # The usual body is scanned by neither.
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets > max_depth and json_depth_exceeds(raw, max_depth):
        raise BadRequest(
            f"The request body nests JSON arrays or objects deeper than the limit of "
            f"{max_depth} levels.",
            code="invalid_json",
        )
    if brackets > max_containers and json_containers_exceed(raw, max_containers):
        raise BadRequest(
            f"The request body has more than {max_containers} JSON arrays and objects.",
            code="invalid_json",
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(
            f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", code="invalid_json")
    # An array of n items has n - 1 commas: with fewer commas in all, no walk is needed.
    if raw.count(b",") >= max_array_items and longest_array_exceeds(body, max_array_items):
        raise BadRequest(
            f"The request body has a JSON array of more than {max_array_items} items.",
            code="invalid_json",
        )
    return body


# Fields that name where a call goes (or which provider takes it) rather than what it asks.
# No OpenAI endpoint takes them; LiteLLM-style proxies read them from the body and connect
# wherever they point, so behind such an upstream a caller could steer the call to any host
# (the cloud metadata address, Memcached). The upstream is the operator's choice only.
STEERING_FIELDS = frozenset(
    {"api_base", "base_url", "api_url", "api_host", "azure_endpoint", "custom_llm_provider"}
)


def validate(route: Route, body: dict[str, Any]) -> None:
    """The fields the gateway relies on: none that steers it, its route's ``required`` ones
    (app/request/routes.py) of their JSON types, ``stream`` a boolean."""
    steering = sorted(STEERING_FIELDS.intersection(body))
    if steering:
        raise BadRequest(
            f"The parameter '{steering[0]}' is not accepted: the gateway chooses the upstream.",
            param=steering[0],
            code="parameter_not_allowed",
        )
    for name, kinds in route.required:
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


def model_of(body: dict[str, Any] | None) -> str | None:
    """The requested model, whole (a call's trace keeps a shortened copy for logs)."""
    model = None if body is None else body.get("model")
    return model if isinstance(model, str) else None


def wants_stream(body: dict[str, Any]) -> bool:
    return body.get("stream") is True


def wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
