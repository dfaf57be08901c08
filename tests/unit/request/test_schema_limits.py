"""The array-length limit and the fields that would steer the upstream (app/request/schema.py)."""

from __future__ import annotations

import json

import pytest

from app.core import errors
from app.core.config import Settings, SettingsError
from app.request import routes, schema

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_an_array_at_the_limit_passes_and_one_longer_fails() -> None:
    at = json.dumps({"model": "m", "prompt": list(range(10))}).encode()
    assert schema.parse_body(at, max_array_items=10)["prompt"] == list(range(10))
    over = json.dumps({"model": "m", "prompt": list(range(11))}).encode()
    with pytest.raises(errors.BadRequest, match="more than 10 items") as info:
        schema.parse_body(over, max_array_items=10)
    assert info.value.code == "invalid_json"


def test_a_long_array_is_found_however_deep() -> None:
    deep = {"a": [{"b": [[0] * 5, {"c": [1] * 6}]}]}
    assert schema.longest_array_exceeds(deep, 5)
    assert not schema.longest_array_exceeds(deep, 6)
    assert not schema.longest_array_exceeds({"many": [[0] * 6] * 6}, 6)


def test_the_default_limit_takes_a_million_token_prompt() -> None:
    prompt = json.dumps({"model": "m", "prompt": [0] * 1_000_000}).encode()
    assert len(schema.parse_body(prompt)["prompt"]) == 1_000_000
    with pytest.raises(errors.BadRequest):
        schema.parse_body(json.dumps({"model": "m", "prompt": [0] * 1_000_001}).encode())


def test_the_limit_is_a_setting() -> None:
    settings = Settings.from_env({"LLMGATE_MAX_JSON_ARRAY_ITEMS": "2048"})
    assert settings.max_json_array_items == 2048
    with pytest.raises(SettingsError, match="LLMGATE_MAX_JSON_ARRAY_ITEMS"):
        Settings.from_env({"LLMGATE_MAX_JSON_ARRAY_ITEMS": "0"})


@pytest.mark.parametrize("field", sorted(schema.STEERING_FIELDS))
@pytest.mark.parametrize("route", ["chat", "completions", "embeddings", "responses"])
def test_a_field_naming_the_upstream_is_refused_on_every_route(route: str, field: str) -> None:
    body = {**CHAT, "prompt": "x", "input": "x", field: "http://169.254.169.254/latest/"}
    with pytest.raises(errors.BadRequest) as info:
        schema.validate(routes.of_name(route), body)
    assert (info.value.status, info.value.code, info.value.param, info.value.message) == (
        400,
        "parameter_not_allowed",
        field,
        f"The parameter '{field}' is not accepted: the gateway chooses the upstream.",
    )


def test_ordinary_fields_pass() -> None:
    schema.validate(routes.CHAT, {**CHAT, "user": "u", "metadata": {"base_url": "kept: not top"}})


def test_the_limits_hold_when_every_bracket_and_comma_is_the_deep_or_long_ones() -> None:
    # The checks count brackets and commas first and look no further when too few: here
    # each is exactly one more than the limit allows.
    deep = b'{"a":[[[1]]]}'  # 4 brackets, 4 levels
    with pytest.raises(errors.BadRequest, match="deeper than the limit of 3"):
        schema.parse_body(deep, max_depth=3)
    assert schema.parse_body(deep, max_depth=4) == {"a": [[[1]]]}
    long = json.dumps({"p": list(range(11))}, separators=(",", ":")).encode()  # 10 commas
    with pytest.raises(errors.BadRequest, match="more than 10 items"):
        schema.parse_body(long, max_array_items=10)
    assert len(schema.parse_body(long, max_array_items=11)["p"]) == 11


def test_more_arrays_and_objects_than_the_limit_is_a_400_before_parsing() -> None:
    at = json.dumps({"model": "m", "x": [{}] * 9}).encode()  # 10 containers, and the body
    assert len(schema.parse_body(at, max_containers=11)["x"]) == 9
    over = json.dumps({"model": "m", "x": [{}] * 10}).encode()
    with pytest.raises(errors.BadRequest, match="more than 11 JSON arrays and objects") as info:
        schema.parse_body(over, max_containers=11)
    assert info.value.code == "invalid_json"


def test_the_default_container_limit_is_the_settings_default() -> None:
    at = json.dumps({"x": [{}] * 99_998}).encode()  # 100,000 with the array and the body
    assert len(schema.parse_body(at)["x"]) == 99_998
    with pytest.raises(errors.BadRequest, match="more than 100000 JSON arrays and objects"):
        schema.parse_body(json.dumps({"x": [{}] * 99_999}).encode())


def test_containers_are_counted_over_the_whole_of_a_large_body() -> None:
    # 50,002 containers: the scan reads a large body a piece at a time (64 KiB of brackets
    # and quotes), and no one piece holds more than the limit of 40,000.
    body = json.dumps({"x": [[]] * 50_000}).encode()
    assert schema.json_containers_exceed(body, 50_001)
    assert not schema.json_containers_exceed(body, 50_002)
    with pytest.raises(errors.BadRequest, match="more than 40000 JSON arrays and objects"):
        schema.parse_body(body, max_containers=40_000)


def test_brackets_inside_strings_are_not_containers() -> None:
    # A prompt full of code or JSON is text: its brackets, escaped quotes included, are not
    # the body's arrays and objects.
    text = '[{"a": [1, {}]}] \\" {[' * 1000
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    assert body.count(b"[") + body.count(b"{") > 5000  # the scan is needed
    assert schema.parse_body(body, max_containers=3)["messages"][0]["content"] == text
    assert not schema.json_containers_exceed(body, 3)
    assert schema.json_containers_exceed(body, 2)


def test_the_container_limit_is_a_setting() -> None:
    assert Settings().max_json_containers == 100_000
    assert Settings.from_env({"LLMGATE_MAX_JSON_CONTAINERS": "500"}).max_json_containers == 500
    with pytest.raises(SettingsError, match="LLMGATE_MAX_JSON_CONTAINERS"):
        Settings.from_env({"LLMGATE_MAX_JSON_CONTAINERS": "0"})
