"""Request checks the mutation run found untested (app/request/schema.py).

Every rejection is an OpenAI-shaped 400 (README, Errors): `invalid_json` for a body that is
not a JSON object, `missing_required_parameter` / `invalid_type` naming the parameter, as the
OpenAI API itself answers ("Missing required parameter: 'messages'."). The depth limit counts
the deepest path through the document, whatever was opened and closed before it.
"""

from __future__ import annotations

import pytest

from app.core.errors import BadRequest
from app.request import routes, schema

ONE_ITEM = "an array with at least one item."


def _error(call, *args, **kwargs) -> dict:
    with pytest.raises(BadRequest) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 400
    error = caught.value.to_body()["error"]
    assert error["type"] == "invalid_request_error"
    return error


# --- parse_body ------------------------------------------------------------------------------


def test_an_empty_body_is_invalid_json() -> None:
    error = _error(schema.parse_body, b" \n")
    assert (error["message"], error["code"], error["param"]) == (
        "The request body is empty; send a JSON object.",
        "invalid_json",
        None,
    )


def test_a_body_that_is_not_json_is_invalid_json() -> None:
    error = _error(schema.parse_body, b"{nope")
    assert error["code"] == "invalid_json"
    assert error["message"].startswith("The request body is not valid JSON: ")


def test_a_json_value_that_is_not_an_object_is_invalid_json() -> None:
    error = _error(schema.parse_body, b'["model"]')
    assert (error["message"], error["code"]) == (
        "The request body must be a JSON object.",
        "invalid_json",
    )


def test_the_deepest_path_counts_not_the_depth_after_closing_brackets() -> None:
    # Depths: { 1, [ 2, [ 3, ] 2, [ 3, [ 4: four levels on the path to 2.
    raw = b'{"a": [[1], [[2]]]}'
    error = _error(schema.parse_body, raw, max_depth=3)
    assert (error["code"], error["message"]) == (
        "invalid_json",
        "The request body nests JSON arrays or objects deeper than the limit of 3 levels.",
    )
    assert schema.parse_body(raw, max_depth=4) == {"a": [[1], [[2]]]}


# --- validate --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": None, "messages": [{}]}, "model"),
        ("completions", {"model": "m"}, "prompt"),
        ("embeddings", {"model": "m", "input": None}, "input"),
    ],
)
def test_a_missing_parameter_is_named(route: str, body: dict, param: str) -> None:
    assert _error(schema.validate, routes.of_name(route), body) == {
        "message": f"Missing required parameter: '{param}'.",
        "type": "invalid_request_error",
        "param": param,
        "code": "missing_required_parameter",
    }


@pytest.mark.parametrize(
    ("route", "body", "param", "message"),
    [
        ("chat", {"model": 1, "messages": [{}]}, "model", "expected a string."),
        ("chat", {"model": "m", "messages": {}}, "messages", f"expected {ONE_ITEM}"),
        ("chat", {"model": "m", "messages": []}, "messages", f"expected {ONE_ITEM}"),
        ("completions", {"model": "m", "prompt": 3}, "prompt", "expected a string or an array."),
        ("completions", {"model": "m", "prompt": []}, None, None),  # an empty prompt list is valid
        ("embeddings", {"model": "m", "input": {}}, "input", "expected a string or an array."),
    ],
)  # fmt: skip
def test_a_parameter_of_the_wrong_type_says_what_is_expected(
    route: str, body: dict, param: str | None, message: str | None
) -> None:
    if param is None:
        schema.validate(routes.of_name(route), body)
        return
    assert _error(schema.validate, routes.of_name(route), body) == {
        "message": f"Invalid value for '{param}': {message}",
        "type": "invalid_request_error",
        "param": param,
        "code": "invalid_type",
    }


@pytest.mark.parametrize("stream", ["true", 1, 0, [], {}])
def test_stream_must_be_a_boolean(stream: object) -> None:
    assert _error(schema.validate, routes.PASSTHROUGH, {"stream": stream}) == {
        "message": "Invalid value for 'stream': expected a boolean.",
        "type": "invalid_request_error",
        "param": "stream",
        "code": "invalid_type",
    }


# --- wants_usage -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"stream_options": {"include_usage": True}}, True),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, True),
        ({"stream_options": {"include_usage": False}}, False),
        ({"stream_options": {"include_usage": "true"}}, False),
        ({"stream_options": {"include_usage": 1}}, False),
        ({"stream_options": {}}, False),
        ({"stream_options": None}, False),
        ({"stream_options": [["include_usage", True]]}, False),
        ({"include_usage": True}, False),
        ({}, False),
    ],
)
def test_wants_usage_only_for_include_usage_true(body: dict, expected: bool) -> None:
    assert schema.wants_usage(body) is expected


# --- model_of --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "gpt-4o-mini", "messages": []}, "gpt-4o-mini"),
        ({"model": "x" * 300}, "x" * 300),  # whole: the log's copy is the one cut short
        ({"model": ""}, ""),
        ({"model": 4}, None),
        ({"model": ["gpt-4o"]}, None),
        ({"model": None}, None),
        ({"MODEL": "gpt-4o"}, None),
        ({}, None),
        (None, None),  # a call whose body is not read (a passthrough route)
    ],
)
def test_model_of_is_the_models_string_whole_else_none(body, expected) -> None:
    assert schema.model_of(body) == expected
