"""The JSON nesting limit: checked by a linear scan before json.loads, which would recurse."""

from __future__ import annotations

import json

import pytest

from app.core import errors
from app.core.config import Settings, SettingsError
from app.request import schema


def nested(depth: int, inner: str = "1") -> bytes:
    """An object whose "x" holds arrays so that the whole document is ``depth`` deep."""
    return ('{"x": ' + "[" * (depth - 1) + inner + "]" * (depth - 1) + "}").encode()


def test_exactly_at_the_limit_passes_and_one_deeper_fails() -> None:
    assert schema.parse_body(nested(64))["x"]  # the default limit
    with pytest.raises(errors.BadRequest, match="limit of 64 levels") as info:
        schema.parse_body(nested(65))
    assert (info.value.status, info.value.code) == (400, "invalid_json")
    assert schema.parse_body(nested(3), max_depth=3)
    with pytest.raises(errors.BadRequest, match="limit of 3 levels"):
        schema.parse_body(nested(4), max_depth=3)
    assert schema.parse_body(b'{"a": 1}', max_depth=1) == {"a": 1}


def test_objects_count_like_arrays() -> None:
    deep_objects = ('{"a": ' * 10 + "1" + "}" * 10).encode()
    assert schema.parse_body(deep_objects, max_depth=10)
    with pytest.raises(errors.BadRequest, match="limit of 9"):
        schema.parse_body(deep_objects, max_depth=9)


def test_width_is_not_depth() -> None:
    wide = json.dumps({"messages": [[[1]] for _ in range(10_000)]}).encode()
    assert len(schema.parse_body(wide, max_depth=4)["messages"]) == 10_000


@pytest.mark.parametrize(
    "text",
    [
        "[[[[[[[[[[[[[[[[[[[[[[[[",  # brackets inside a string are text
        "{{{{{{{{{{{{{{{{{{{{{{{{",
        '\\" [[[[[[[[[[[[[[[[[[[[',  # an escaped quote does not end the string
        '\\\\\\" [[[[[[[[[[[[[[[[[[',  # an escaped backslash, then an escaped quote
    ],
)
def test_brackets_inside_strings_do_not_count(text: str) -> None:
    raw = b'{"messages": [{"content": "' + text.encode() + b'"}], "x": "]]]]"}'
    body = schema.parse_body(raw, max_depth=3)
    assert body["messages"][0]["content"] == json.loads(b'"' + text.encode() + b'"')


def test_an_escaped_backslash_ends_before_the_closing_quote() -> None:
    # "a\\" is a complete string: the brackets after it are structure and count.
    raw = b'{"s": "a\\\\", "x": [[[1]]]}'
    assert schema.parse_body(raw, max_depth=4)["s"] == "a\\"
    with pytest.raises(errors.BadRequest, match="limit of 3"):
        schema.parse_body(raw, max_depth=3)


def test_strings_across_the_scan_chunks_keep_their_parity() -> None:
    # Quotes and brackets far beyond the scan's chunk size (64 KiB of skeleton).
    filler = json.dumps(["[{" * 40_000, "]" * 70_000, "x"])
    raw = ('{"a": ' + filler + ', "b": [[[[1]]]]}').encode()
    assert schema.parse_body(raw, max_depth=5)
    with pytest.raises(errors.BadRequest, match="limit of 4"):
        schema.parse_body(raw, max_depth=4)


def test_100000_deep_is_a_400_not_a_recursion_error() -> None:
    for raw in (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[" * 100_000):
        with pytest.raises(errors.BadRequest) as info:
            schema.parse_body(raw)
        assert info.value.status == 400
        assert info.value.code == "invalid_json"


def test_the_setting() -> None:
    assert Settings().max_json_depth == 64
    assert Settings.from_env({"LLMGATE_MAX_JSON_DEPTH": "10"}).max_json_depth == 10
    for bad in ("0", "513", "deep"):
        with pytest.raises(SettingsError, match="LLMGATE_MAX_JSON_DEPTH"):
            Settings.from_env({"LLMGATE_MAX_JSON_DEPTH": bad})
