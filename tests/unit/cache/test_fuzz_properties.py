"""Properties of the pure modules a hostile or merely unusual caller reaches, with hypothesis.

- SSE (llmgate_wire/sse.py): any chunking of any valid event stream decodes to the events that were
  encoded, and re-encoding them gives the stream back byte for byte. (Arbitrary bytes in any
  chunking are in test_sse_robust.py.)
- Cache keys (app/cache/keys.py): requests that differ only in what cannot change the answer share
  one key; two tenants never share one, whatever the bodies.
- Validation (app/request/schema.py, app/cache/policy.py, app/request/paths.py): on any JSON,
  any bytes and any header value, the only exception is our BadRequest (a 400), never a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.cache import keys
from app.cache import policy as cache_policy
from app.cache.plan import cache_plan
from app.core.config import Settings
from app.core.errors import BadRequest
from app.request import routes, schema
from app.request.body_readings import BodyReading
from app.request.headers import tenant_of
from app.request.paths import forwarded_path
from llmgate_wire import sse
from tests.support.sse_feed import cut_at, decode
from tests.support.strategies import cut_places, json_values, utf8_text

# -- SSE ------------------------------------------------------------------------------------

# A field value SSE can carry: no line ends (CR, LF) in names; data may hold LF (several
# data lines) but not CR, which the format cannot represent inside a line.
# (Surrogates excluded: the decoder's text comes from UTF-8, which cannot hold them.)
_NO_EOL = utf8_text("\r\n", max_size=20)
_DATA = utf8_text("\r", max_size=40)
_ID = utf8_text("\r\n\x00", max_size=10)
_EVENTS = st.lists(
    st.tuples(_DATA, st.none() | _NO_EOL.filter(bool), st.none() | _ID), min_size=1, max_size=12
)


@settings(max_examples=300, deadline=None)
@given(events=_EVENTS, cuts=cut_places(2000, 40))
def test_any_chunking_of_a_valid_stream_decodes_to_its_events_and_re_encodes_exactly(
    events: list[tuple[str, str | None, str | None]], cuts: list[int]
) -> None:
    frames = [sse.encode(data, event=event, id=id) for data, event, id in events]
    stream = b"".join(frames) + sse.comment() + sse.DONE_EVENT
    decoded, rest = decode(cut_at(stream, cuts))
    assert rest == b""
    *payload, ping, done = decoded
    assert [(e.data, e.event, e.id) for e in payload] == events
    assert ping.is_comment and done.is_done
    # Each event keeps its own bytes, and encoding what was decoded gives them again.
    assert [e.raw for e in payload] == frames
    assert [sse.encode(e.data or "", event=e.event, id=e.id) for e in payload] == frames
    assert b"".join(e.raw for e in decoded) == stream


@settings(max_examples=200, deadline=None)
@given(objs=st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=10)), max_size=8))
def test_json_events_decode_to_the_same_objects(objs: list[dict[str, str]]) -> None:
    stream = b"".join(sse.encode_json(o) for o in objs)
    decoded, rest = decode(cut_at(stream, [1, 7, 13]))
    assert rest == b"" and [e.json() for e in decoded] == objs


# -- cache keys -------------------------------------------------------------------------------

_JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
_JSON = json_values(_JSON_LEAF, st.text(max_size=6), list_size=4, dict_size=4, max_leaves=20)
_BODIES = st.dictionaries(
    st.text(max_size=8).filter(lambda k: k not in keys.IGNORED_FIELDS), _JSON, max_size=6
)
# Header values as HTTP delivers them: latin-1 text (WSGI) without CR, LF or NUL (nginx,
# gunicorn and app/request/headers.py refuse those).
_VALUE = st.text(
    st.characters(max_codepoint=255, blacklist_characters="\r\n\x00"), min_size=1, max_size=12
)
_CREDENTIAL_NAMES = st.sampled_from(
    [
        "Authorization",
        "api-key",
        "x-api-key",
        "OpenAI-Organization",
        "OpenAI-Project",
        "X-Auth-Token",
    ]
)
_CREDENTIALS = st.lists(st.tuples(_CREDENTIAL_NAMES, _VALUE), max_size=3)
_OTHER_HEADERS = st.lists(
    st.tuples(st.sampled_from(["Accept", "User-Agent", "X-Stainless-Os", "Cache-Control"]), _VALUE),
    max_size=3,
)


def _key(body: dict[str, Any], headers: list[tuple[str, str]], namespace: str | None = None):
    tenant = tenant_of(headers, namespace=namespace)
    return keys.cache_key(upstream="u", route="chat", tenant=tenant, body=body, query="")


def _identity(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted((n.lower(), v.strip()) for n, v in headers)


@settings(max_examples=300, deadline=None)
@given(
    body=_BODIES,
    ignored=st.dictionaries(st.sampled_from(sorted(keys.IGNORED_FIELDS)), _JSON, max_size=3),
    credentials=_CREDENTIALS,
    others=_OTHER_HEADERS,
    data=st.data(),
)
def test_equivalent_requests_share_one_key(body, ignored, credentials, others, data) -> None:
    """Key order, the delivery fields (stream, user, ...), the case, order and surrounding
    space of the credential headers, and headers that do not identify the caller."""
    shuffled_body = dict(data.draw(st.permutations(list(body.items()))))
    headers = [(n.upper(), f"  {v} ") for n, v in credentials] + others
    same = _key({**shuffled_body, **ignored}, data.draw(st.permutations(headers)))
    assert same == _key(body, credentials)


@settings(max_examples=300, deadline=None)
@given(
    body_a=_BODIES,
    body_b=_BODIES,
    alice=_CREDENTIALS,
    bob=_CREDENTIALS,
    namespace=st.none() | st.text(min_size=1, max_size=8),
)
def test_two_tenants_never_share_a_key(body_a, body_b, alice, bob, namespace) -> None:
    if _identity(alice) != _identity(bob):
        assert _key(body_a, alice) != _key(body_b, bob)
    if namespace is not None:
        # A shared namespace is never anyone's private tenant.
        assert _key(body_a, alice, namespace) != _key(body_b, bob)


@settings(max_examples=300, deadline=None)
@given(alice=_CREDENTIALS.filter(bool), data=st.data())
def test_near_identical_tenants_never_share_a_key(alice, data) -> None:
    """Bob's credentials are Alice's with one change a normaliser might wrongly erase: the
    case of a value, one character more, a value moved to another credential header."""
    index = data.draw(st.integers(0, len(alice) - 1))
    name, value = alice[index]
    changed = data.draw(
        st.sampled_from(
            [
                (name, value.swapcase()),
                (name, value + "x"),
                (name, value[:-1]),
                ("x-api-key" if name.lower() != "x-api-key" else "api-key", value),
            ]
        )
    )
    bob = [*alice[:index], changed, *alice[index + 1 :]]
    if _identity(alice) != _identity(bob):
        assert _key({"model": "m"}, alice) != _key({"model": "m"}, bob)


# -- validation -------------------------------------------------------------------------------

# json.loads makes a lone surrogate of an escaped "\ud800": bodies can hold them.
_TEXT = st.text(max_size=8) | st.sampled_from(["\ud800", "a\udfffb", "\ud83d\ude00"])
_ANY_JSON = json_values(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    st.text(max_size=8),
    list_size=4,
    dict_size=4,
    max_leaves=25,
)
_FIELDS = st.sampled_from(
    ["model", "messages", "prompt", "input", "stream", "stream_options", "cache", "temperature",
     "seed", "store", "background", "conversation", "api_base", "max_tokens", "n"]
)  # fmt: skip
# Bodies near the real shape: the fields the gateway reads, with any JSON in them.
_NEAR_BODIES = st.dictionaries(_FIELDS, _ANY_JSON, max_size=8) | st.fixed_dictionaries(
    {"model": st.text(max_size=5), "messages": _ANY_JSON, "cache": _ANY_JSON}
)


# Every body cacheable, every namespace allowed: the plan goes as far as the key.
_PLAN_SETTINGS = Settings(
    upstream_url="http://127.0.0.1:9/v1", cache_mode="all", cache_namespaces="*"
)


def _gateway_checks(raw: bytes, route: str, cache_control: str = "") -> None:
    """What the gateway does with a body before anything goes upstream (Gateway.plan):
    parse, validate, read stream and cache controls, build the key (app/cache/plan.py)."""
    body = schema.parse_body(raw, max_depth=64, max_array_items=1000)
    schema.validate(routes.of_name(route), body)
    schema.wants_stream(body)
    schema.wants_usage(body)
    headers = [("Cache-Control", cache_control)]
    reading = BodyReading(body, raw, schema.wants_stream(body))
    cache_plan(
        _PLAN_SETTINGS,
        route=routes.of_name(route),
        headers=headers,
        query="",
        reading=reading,
        upstream=lambda model: "u",
        tenant=None,
    )


def _json_bytes(value: Any) -> bytes:
    # allow_nan: json.loads accepts NaN and Infinity, so callers can send them.
    return json.dumps(value, allow_nan=True).encode()


@settings(max_examples=500, deadline=None)
@given(
    body=_NEAR_BODIES | _ANY_JSON,
    route=st.sampled_from(["chat", "completions", "embeddings", "responses"]),
)
def test_validation_raises_only_bad_request_on_any_json(body: Any, route: str) -> None:
    try:
        _gateway_checks(_json_bytes(body), route)
    except BadRequest as exc:
        assert exc.status == 400 and exc.to_body()["error"]["message"]


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200) | _ANY_JSON.map(_json_bytes).map(lambda b: b[: len(b) // 2]))
def test_any_bytes_are_a_body_or_a_bad_request(raw: bytes) -> None:
    try:
        _gateway_checks(raw, "chat")
    except BadRequest as exc:
        assert exc.status == 400


@settings(max_examples=300, deadline=None)
@given(
    value=st.text(max_size=30) | st.sampled_from(["max-age=²", "max-age=" + "9" * 5000]),
    number=st.floats() | st.integers(min_value=-(10**30), max_value=10**30),
)
def test_cache_controls_raise_only_bad_request(value: str, number: float) -> None:
    """A Cache-Control header of any text, and cache seconds of any size (JSON's 1e999 is
    infinity to Python, and NaN is accepted too)."""
    body = {"model": "m", "messages": [{}], "temperature": 0}
    for controls in ({"ttl": number}, {"s-maxage": number}):
        try:
            _gateway_checks(_json_bytes({**body, "cache": controls}), "chat", value)
        except BadRequest as exc:
            assert exc.status == 400
    directive = cache_policy.parse_cache_control([value])
    assert directive.ttl is None or (directive.ttl >= 0 and math.isfinite(directive.ttl))


@settings(max_examples=300, deadline=None)
@given(path=st.text(max_size=30).map(lambda s: "/v1/" + s))
def test_any_path_is_forwarded_or_a_bad_request(path: str) -> None:
    try:
        forwarded_path(path)
    except BadRequest as exc:
        assert exc.status == 400
