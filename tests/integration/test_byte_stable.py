"""The body reaches the upstream as the caller wrote it: byte for byte, or with only the
gateway's own ``cache`` member cut out.

Providers' prompt caches key on the exact prompt prefix, so key order, spacing and escapes
must survive. The simulator keeps the raw bytes of every request (``raw_body`` in
``/sim/requests``); the expected bytes are written out by hand here, not computed with the
gateway's own editor.
"""

from __future__ import annotations

import base64
import uuid

import pytest


def _received(gw) -> bytes:
    return base64.b64decode(gw.sim_requests()[-1]["raw_body"])


def _tagged(*texts: str) -> tuple[bytes, ...]:
    """The texts with TAG replaced by one fresh value: a prompt no earlier run cached."""
    tag = uuid.uuid4().hex[:8]
    return tuple(text.replace("TAG", tag).encode() for text in texts)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/v1/completions"])
def test_body_without_cache_object_arrives_unchanged(gw, route: str) -> None:
    prompts = {
        "/v1/chat/completions": '"messages" :[{"content":"\\u00e9 {}\\"q\\" TAG" ,"role":"user"}]',
        "/v1/responses": '"store":false,\n\t"input" : "caf\\u00e9 é {} TAG"',
        "/v1/completions": '"prompt":  ["a", "TAG"]',
    }
    (raw,) = _tagged("{\n  " + prompts[route] + ' ,\t"max_tokens":3,  "model" :"sim-model"   }\n')
    resp = gw.post(route, raw)
    assert resp.status == 200, resp.data
    assert _received(gw) == raw


def test_cache_object_is_cut_and_nothing_else_moves(gw) -> None:
    head = '{ "temperature":0,\n "messages":[{"role":"user","content":"} \\"cache\\": {TAG"}] ,'
    cache = '"cache" : {"ttl": 60, "namespace_hint": "}{"},'
    tail = '"model":"sim-model" ,"max_tokens" : 2 }'
    sent, expected = _tagged(head + cache + tail, head + tail)
    resp = gw.post("/v1/chat/completions", sent)
    assert resp.status == 200, resp.data
    assert _received(gw) == expected


def test_cache_object_first_or_last(gw) -> None:
    messages = '"messages":[{"role":"user","content":"TAG"}]'
    sent, expected = _tagged(
        '{"cache":{"no-store":true},  "model":"sim-model", ' + messages + " }",
        '{"model":"sim-model", ' + messages + " }",
    )
    resp = gw.post("/v1/chat/completions", sent)
    assert resp.status == 200, resp.data
    assert _received(gw) == expected
    sent, expected = _tagged(
        '{"model":"sim-model" , ' + messages + '\n, "cache":{}}',
        '{"model":"sim-model" , ' + messages + "}",
    )
    resp = gw.post("/v1/chat/completions", sent)
    assert resp.status == 200, resp.data
    assert _received(gw) == expected


def test_stream_body_is_not_rewritten(gw) -> None:
    (raw,) = _tagged(
        '{"stream" : true , "stream_options":{"include_usage":true,"include_obfuscation":true},'
        '"model":"sim-model","prompt_cache_key":"k-TAG","messages":[{"role":"user","content":"x"}]}'
    )
    resp = gw.post("/v1/chat/completions", raw, preload_content=False)
    assert resp.status == 200
    resp.read()
    resp.release_conn()
    assert _received(gw) == raw
