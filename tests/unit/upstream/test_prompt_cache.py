"""What an upstream's ``prompt_cache = "auto"`` changes on the wire
(app/upstream/prompt_cache.py), seen in the bytes the transport and the translation make:
nothing with the switch off; breakpoints for Anthropic, relayed or translated; a
``prompt_cache_key`` for OpenAI that the caller did not name, every other byte kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.request import routes
from app.request.affinity import Affinity
from app.upstream.catalog import ConfigError, UpstreamSpec, load
from app.upstream.translation import translation_for
from app.upstream.transport import UpstreamRequest, _prepare

LONG = "word " * 1200
KEY = Affinity(bytes(range(16)), "prefix")


def _spec(kind: str, switch: str = "auto") -> UpstreamSpec:
    return UpstreamSpec(kind, f"https://{kind}.test/v1", kind=kind, prompt_cache=switch)


def _req(route: routes.Route, body: bytes) -> UpstreamRequest:
    return UpstreamRequest(
        "POST", route.path or "", "", {}, body, False, model="m", route=route, affinity=KEY
    )


def _messages_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 10,
        "system": LONG,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
        **extra,
    }


def test_the_switch_is_off_by_default_and_checked_in_the_file() -> None:
    text = '[[upstreams]]\nname = "a"\nbase_url = "https://a.test/v1"\n'
    (spec,) = load(text, {})
    assert spec.prompt_cache == "off"
    (spec,) = load(text + 'prompt_cache = "auto"\ncache_group = "org-1"\n', {})
    assert (spec.prompt_cache, spec.group) == ("auto", "group:org-1")
    with pytest.raises(ConfigError, match=r"upstreams\.prompt_cache must be off or auto"):
        load(text + 'prompt_cache = "on"\n', {})
    with pytest.raises(ConfigError, match=r"upstreams\.cache_group must be 1-63"):
        load(text + 'cache_group = "Org 1"\n', {})


def test_off_sends_the_callers_bytes_as_they_are() -> None:
    for kind, route in (("anthropic", routes.MESSAGES), ("openai", routes.CHAT)):
        body = b'{"model": "m",  "messages": [{"role":"user","content":"hi"}], "system": "x"}'
        assert _prepare(_spec(kind, "off"), _req(route, body))[2] is body


def test_an_openai_upstream_gets_the_conversations_key_every_other_byte_kept() -> None:
    body = b'{"model": "m",  "messages": [{"role":"user","content":"h\\u00e9"}]}'
    sent = _prepare(_spec("openai"), _req(routes.CHAT, body))[2]
    assert sent is not None
    assert sent.startswith(body[:-1]) and json.loads(sent)["prompt_cache_key"] == KEY.hex
    responses = b'{"model":"m","input":"hi"}'
    sent = _prepare(_spec("openai"), _req(routes.RESPONSES, responses))[2]
    assert sent is not None and json.loads(sent)["prompt_cache_key"] == KEY.hex
    own = b'{"model":"m","messages":[],"prompt_cache_key":"mine"}'
    assert _prepare(_spec("openai"), _req(routes.CHAT, own))[2] is own
    embeddings = b'{"model":"m","input":"hi"}'
    assert _prepare(_spec("openai"), _req(routes.EMBEDDINGS, embeddings))[2] is embeddings


def test_a_relayed_messages_call_to_anthropic_gets_breakpoints_unless_it_has_its_own() -> None:
    body = json.dumps(_messages_body()).encode()
    sent = json.loads(_prepare(_spec("anthropic"), _req(routes.MESSAGES, body))[2] or b"")
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert sent["messages"][1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    own = _messages_body(system=[{"type": "text", "text": LONG, "cache_control": {"type": "x"}}])
    raw = json.dumps(own).encode()
    assert _prepare(_spec("anthropic"), _req(routes.MESSAGES, raw))[2] is raw
    short = json.dumps(_messages_body(system="brief")).encode()
    assert _prepare(_spec("anthropic"), _req(routes.MESSAGES, short))[2] is short


def test_translated_calls_get_the_same_on_the_way() -> None:
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}],
    }
    translation = translation_for("anthropic", routes.CHAT)
    assert translation is not None
    sent = json.loads(
        translation.request(_spec("anthropic"), json.dumps(chat).encode(), {}, KEY).body
    )
    assert sent["system"] == [
        {"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}
    ]
    off = json.loads(
        translation.request(_spec("anthropic", "off"), json.dumps(chat).encode(), {}, KEY).body
    )
    assert "cache_control" not in json.dumps(off)
    door = translation_for("openai", routes.MESSAGES)
    assert door is not None
    messages = json.dumps(_messages_body()).encode()
    sent = json.loads(door.request(_spec("openai"), messages, {}, KEY).body)
    assert sent["prompt_cache_key"] == KEY.hex
    assert "prompt_cache_key" not in json.loads(door.request(_spec("openai"), messages, {}).body)
