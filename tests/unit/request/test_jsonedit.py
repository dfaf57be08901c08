"""app/request/jsonedit.py: one member edited, every other byte as the caller wrote it.

The property tests write random JSON objects with random whitespace between every token and
random key order (strings full of braces, quotes, backslashes and non-ASCII), then check the
edit against json.loads and check that the result is the input with one run cut out (or one
span replaced): nothing else moved.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.request.jsonedit import find_member, members, with_value, without_member
from tests.support.strategies import json_values

_TRICKY = st.text(alphabet=st.sampled_from('{}[]":,\\ \t\nabcé€😀\x00\u2028/'), max_size=12)
_KEYS = st.one_of(_TRICKY, st.sampled_from(["cache", "model", "messages", "stream"]))
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    _TRICKY,
)
_VALUES = json_values(_SCALARS, _KEYS, list_size=4, dict_size=4, max_leaves=12)
_WHITESPACE = st.text(alphabet=" \t\n\r", max_size=3)


def _write(value: Any, draw: Any) -> str:
    """``value`` as JSON with random whitespace around every token and random escaping."""

    def ws() -> str:
        return draw(_WHITESPACE)

    if isinstance(value, dict):
        items = [
            f"{ws()}{_string(k, draw)}{ws()}:{ws()}{_write(v, draw)}{ws()}"
            for k, v in value.items()
        ]
        return "{" + (",".join(items) if items else ws()) + "}"
    if isinstance(value, list):
        items = [f"{ws()}{_write(v, draw)}{ws()}" for v in value]
        return "[" + (",".join(items) if items else ws()) + "]"
    if isinstance(value, str):
        return _string(value, draw)
    return json.dumps(value)


def _string(value: str, draw: Any) -> str:
    return json.dumps(value, ensure_ascii=draw(st.booleans()))


@st.composite
def bodies(draw: Any) -> tuple[dict[str, Any], bytes]:
    obj = draw(st.dictionaries(_KEYS, _VALUES, max_size=6))
    if draw(st.booleans()):
        obj["cache"] = draw(_VALUES)
    keys = draw(st.permutations(list(obj)))
    ordered = {k: obj[k] for k in keys}
    text = draw(_WHITESPACE) + _write(ordered, draw) + draw(_WHITESPACE)
    return ordered, text.encode("utf-8")


def _one_cut(before: bytes, after: bytes) -> bool:
    """``after`` is ``before`` with one contiguous run removed: past their common prefix,
    what is left of ``after`` is the end of ``before``."""
    prefix = 0
    while prefix < len(after) and after[prefix] == before[prefix]:
        prefix += 1
    return before.endswith(after[prefix:])


@settings(max_examples=400, deadline=None)
@given(bodies(), st.data())
def test_removing_a_member_cuts_one_run(sample: tuple[dict[str, Any], bytes], data) -> None:
    obj, raw = sample
    key = data.draw(st.sampled_from([*obj, "absent"]))
    out = without_member(raw, key)
    assert json.loads(out) == {k: v for k, v in obj.items() if k != key}
    if key not in obj:
        assert out is raw
    else:
        assert len(out) < len(raw)
        assert _one_cut(raw, out)


@settings(max_examples=300, deadline=None)
@given(bodies(), st.data())
def test_replacing_a_value_changes_only_that_span(
    sample: tuple[dict[str, Any], bytes], data
) -> None:
    obj, raw = sample
    if not obj:
        return
    key = data.draw(st.sampled_from(list(obj)))
    new = data.draw(_VALUES)
    out = with_value(raw, key, json.dumps(new).encode())
    assert json.loads(out) == {**obj, key: new}
    member = next(m for m in members(raw.decode()) if m.key == key)
    head = raw.decode()[: member.value_start].encode()
    tail = raw.decode()[member.value_end :].encode()
    assert out == head + json.dumps(new).encode() + tail
    assert json.loads(find_member(out, key) or b"") == new


def test_strings_with_braces_quotes_and_escapes() -> None:
    raw = b'{ "a" : "}{\\"cache\\": 1,",\n"cache":{"ttl":60, "x":"\\u007d"} ,"z":[1,"]"] }'
    assert without_member(raw, "cache") == b'{ "a" : "}{\\"cache\\": 1,",\n"z":[1,"]"] }'
    assert json.loads(without_member(raw, "cache")) == {"a": '}{"cache": 1,', "z": [1, "]"]}


def test_first_last_only_and_duplicate_members() -> None:
    assert without_member(b'{"cache":1, "b":2}', "cache") == b'{"b":2}'
    assert without_member(b'{"b":2 ,  "cache":1 }', "cache") == b'{"b":2 }'
    assert without_member(b'{ "cache" : 1 }', "cache") == b"{  }"
    assert without_member(b'{"cache":1,"b":2,"cache":3}', "cache") == b'{"b":2}'
    assert without_member(b'{"a":1,"cache":1,"cache":3}', "cache") == b'{"a":1}'


def test_unicode_is_kept_as_written() -> None:
    raw = '{"model":"m","messages":[{"content":"caf\u00e9 \\u00e9 😀"}],"cache":{}}'.encode()
    assert (
        without_member(raw, "cache")
        == '{"model":"m","messages":[{"content":"caf\u00e9 \\u00e9 😀"}]}'.encode()
    )
    assert with_value(raw, "model", b'"gpt-4o"').startswith(b'{"model":"gpt-4o","messages"')


@pytest.mark.parametrize(
    "raw", [b"[1]", b'{"a":1', b'{"a":1}x', b'{"a" 1}', b"\xff{}", b"", b'{"a":1,}']
)
def test_not_an_object_raises(raw: bytes) -> None:
    with pytest.raises(ValueError):
        without_member(raw, "a")
