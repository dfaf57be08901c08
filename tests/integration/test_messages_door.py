"""The Anthropic Messages door, ``POST /v1/messages``, with the Anthropic SDK as users run it.

To an Anthropic-kind upstream the door is a relay: the caller reads the bytes the simulator
wrote (compared with the same request sent to the simulator itself; only the message id,
made per answer, differs). To an OpenAI-kind or Gemini-kind upstream it is a translation, and
the SDK's stream helper must still give the text, the tool calls with their parsed input, the
thinking with its signature, the stop reason and the usage. Errors are Anthropic's shape here,
the gateway's own included, and nginx's own pages (a body over its limit) too.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import pytest
import urllib3

from simulator import scripts
from tests.support.raw_http import assert_json_error, request_head, send_raw
from tests.support.server_timing import relay_of
from tests.support.sim import sim_stats

MESSAGES: Any = [{"role": "user", "content": "hi"}]
http = urllib3.PoolManager(retries=False)
_MESSAGE_ID = re.compile(rb'"id":"msg_[A-Za-z0-9_]+"')


def _raw(url: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    resp = http.request(
        "POST",
        url + "/v1/messages",
        body=json.dumps(body),
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01",
                 **headers},
    )  # fmt: skip
    return resp.status, resp.data


@pytest.mark.parametrize("script", ["text", "tools", "thinking"])
@pytest.mark.parametrize("stream", [True, False])
def test_to_an_anthropic_upstream_the_caller_reads_the_simulators_bytes(
    kinds_gw, upstream_sim, script, stream
) -> None:
    body = {"model": "m-anthropic", "max_tokens": 100, "messages": MESSAGES, "stream": stream}
    direct = _raw(upstream_sim, body, **{"x-sim-script": script})
    status, got = _raw(kinds_gw.url, body, **{"x-sim-script": script})
    # And a stream's one line of the gateway's own, its relay time (Server-Timing's).
    through, relay = relay_of(got)
    assert status == direct[0] == 200 and (relay is not None) == stream
    assert _MESSAGE_ID.sub(b"ID", through) == _MESSAGE_ID.sub(b"ID", direct[1])
    assert len(_MESSAGE_ID.findall(through)) == 1


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_the_sdks_stream_helper_reads_a_translated_tool_answer(anthropic_client, kind) -> None:
    with anthropic_client.messages.stream(
        model=f"m-{kind}", max_tokens=100, messages=MESSAGES,
        extra_headers={"x-sim-script": "tools"},
    ) as stream:  # fmt: skip
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert "".join(texts) == "Let me check." and len(texts) == 4  # delta by delta
    text, *tools = message.content
    assert text.type == "text" and text.text == "Let me check."
    assert [(t.type, t.id, t.name, t.input) for t in tools] == [
        ("tool_use", "call_sim_weather", "get_weather", scripts.WEATHER_ARGS),
        ("tool_use", "call_sim_time", "get_time", scripts.TIME_ARGS),
    ]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (40, 52)


@pytest.mark.parametrize("kind", ["openai", "gemini", "anthropic"])
def test_thinking_comes_back_as_a_thinking_block_with_its_signature(anthropic_client, kind) -> None:
    for stream in (True, False):
        if stream:
            with anthropic_client.messages.stream(
                model=f"m-{kind}", max_tokens=100, messages=MESSAGES,
                extra_headers={"x-sim-script": "thinking"},
            ) as events:  # fmt: skip
                message = events.get_final_message()
        else:
            message = anthropic_client.messages.create(
                model=f"m-{kind}", max_tokens=100, messages=MESSAGES,
                extra_headers={"x-sim-script": "thinking"},
            )  # fmt: skip
        thinking, text = message.content
        assert thinking.type == "thinking", (kind, stream)
        assert thinking.thinking == "Let me think it through."
        assert thinking.signature == "c2ltLXNpZ25hdHVyZS0x"
        assert text.type == "text" and text.text == "The answer is 42."
        assert message.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("script", "stop"), [("text", "end_turn"), ("length", "max_tokens"), ("filter", "refusal")]
)
def test_stop_reasons_and_usage_over_an_openai_upstream(anthropic_client, script, stop) -> None:
    whole = anthropic_client.messages.create(
        model="m-openai", max_tokens=100, messages=MESSAGES,
        extra_headers={"x-sim-script": script},
    )  # fmt: skip
    with anthropic_client.messages.stream(
        model="m-openai", max_tokens=100, messages=MESSAGES,
        extra_headers={"x-sim-script": script},
    ) as events:  # fmt: skip
        streamed = events.get_final_message()
    for message in (whole, streamed):
        assert message.stop_reason == stop
        assert message.content[0].type == "text"
    assert streamed.content[0].text == whole.content[0].text
    assert streamed.usage.output_tokens == whole.usage.output_tokens > 0


def test_a_mid_stream_overload_is_the_sdks_overloaded_error(anthropic_client) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught, anthropic_client.messages.stream(
        model="m-openai", max_tokens=100, messages=MESSAGES,
        extra_headers={"x-sim-script": "overload"},
    ) as events:  # fmt: skip
        for _ in events:
            pass
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error",
                                                            "message": "Overloaded"}}  # fmt: skip


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_the_gateways_own_mid_stream_error_is_anthropics_error_event(
    kinds_gw, anthropic_client, kind
) -> None:
    # The simulator resets the connection after two pieces: the 200 and the first events
    # have left, so the gateway itself ends the stream, with Anthropic's `error` event (a
    # relayed stream and a translated one alike).
    fault = {"x-sim-fault": "reset", "x-sim-reset-after": "2"}
    body = {"model": f"m-{kind}", "max_tokens": 100, "messages": MESSAGES, "stream": True}
    status, got = _raw(kinds_gw.url, body, **fault)
    raw, relay = relay_of(got)  # after the error event: the stream has no end event
    assert relay is not None and got.startswith(raw)
    assert status == 200 and raw.startswith(b"event: message_start\n"), raw[:200]
    head, sep, last = raw.rstrip(b"\n").rpartition(b"\n\n")
    assert sep and b"event: content_block_delta\n" in head, raw
    assert last.startswith(b"event: error\ndata: {"), last
    error = json.loads(last.removeprefix(b"event: error\ndata: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error", last
    assert error["error"]["message"].startswith("Upstream broke off the response"), last
    with pytest.raises(anthropic.APIStatusError) as caught, anthropic_client.messages.stream(
        model=f"m-{kind}", max_tokens=100, messages=MESSAGES, extra_headers=fault
    ) as events:  # fmt: skip
        for _ in events:
            pass
    assert isinstance(caught.value.body, dict), caught.value
    assert caught.value.body["error"]["type"] == "api_error"


def test_errors_on_this_door_are_anthropics_shape(kinds_gw) -> None:
    cases = [
        ({"model": "m-openai", "max_tokens": 5}, {}, 400, "invalid_request_error"),
        ({"model": "nobody", "max_tokens": 5, "messages": MESSAGES}, {}, 404, "not_found_error"),
        ({"model": "m-openai", "max_tokens": 5, "messages": MESSAGES}, {"x-sim-fault": "429"},
         429, "rate_limit_error"),
        ({"model": "m-gemini", "max_tokens": 5, "messages": MESSAGES}, {"x-sim-fault": "503"},
         503, "overloaded_error"),
        ({"model": "m-anthropic", "max_tokens": 5, "messages": MESSAGES}, {"x-sim-fault": "529"},
         529, "overloaded_error"),
    ]  # fmt: skip
    for body, headers, status, kind in cases:
        got_status, data = _raw(kinds_gw.url, body, **headers)
        doc = json.loads(data)
        assert got_status == status, (body, headers, doc)
        assert doc["type"] == "error" and doc["error"]["type"] == kind, doc
        assert doc["error"]["message"]


def test_count_tokens_goes_to_an_anthropic_upstream_only(kinds_gw, upstream_sim) -> None:
    before = sim_stats(upstream_sim)["requests_by_route"]
    route = "anthropic /v1/messages/count_tokens"
    resp = http.request(
        "POST", kinds_gw.url + "/v1/messages/count_tokens",
        body=json.dumps({"model": "m-anthropic", "messages": MESSAGES}),
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
    )  # fmt: skip
    assert resp.status == 200 and json.loads(resp.data)["input_tokens"] > 0
    resp = http.request(
        "POST", kinds_gw.url + "/v1/messages/count_tokens",
        body=json.dumps({"model": "m-openai", "messages": MESSAGES}),
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
    )  # fmt: skip
    doc = json.loads(resp.data)
    assert resp.status == 404 and doc["error"]["type"] == "not_found_error"
    assert sim_stats(upstream_sim)["requests_by_route"][route] == before.get(route, 0) + 1


def test_a_body_over_nginxs_limit_is_the_sdks_typed_anthropic_error(anthropic_client) -> None:
    """nginx refuses it before the app sees it: its page, too, is Anthropic's on this door."""
    huge: Any = [{"role": "user", "content": "x" * (30 * 1024 * 1024)}]
    with pytest.raises(anthropic.ContentTooLargeError) as caught:
        anthropic_client.messages.create(model="m-anthropic", max_tokens=5, messages=huge)
    assert caught.value.status_code == 413 and caught.value.type == "request_too_large"
    body: Any = caught.value.body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert "byte limit" in body["error"]["message"]


# nginx's own refusals, written on a socket: (path, header lines, status, Anthropic's type)
NGINX_REFUSALS = [
    ("/v1/messages/count_tokens", [("Content-Length", str(30 << 20))], 413, "request_too_large"),
    ("/v1/messages", [("X-Big", "b" * 9000)], 431, "invalid_request_error"),
    ("/v1/messages", [("Host", "twice")], 400, "invalid_request_error"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "headers", "status", "kind"), NGINX_REFUSALS)
def test_nginxs_own_refusals_on_this_door_are_anthropics_shape(
    kinds_gw, path: str, headers: list[tuple[str, str]], status: int, kind: str
) -> None:
    head = request_head("POST", path, headers)
    got, answer_headers, data = send_raw(kinds_gw.url, head, b"{}")
    assert got == status, data
    assert answer_headers["content-type"].startswith("application/json")
    doc = json.loads(data)
    assert doc["type"] == "error" and doc["error"]["type"] == kind, doc
    assert set(doc["error"]) == {"type", "message"} and doc["error"]["message"]
    # The same refusal elsewhere is OpenAI's, as it was.
    other = send_raw(kinds_gw.url, request_head("POST", "/v1/chat/completions", headers), b"{}")
    assert_json_error(other, status, None)
