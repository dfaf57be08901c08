"""An Anthropic Messages request as a Chat Completions request (the ``/v1/messages`` door
over an OpenAI upstream). No I/O here: a dict in, a dict out.

What each member becomes:

- ``model``, ``max_tokens``, ``temperature``, ``top_p`` as they are; ``stop_sequences`` is
  ``stop``; ``metadata.user_id`` is ``user``; ``stream: true`` asks
  ``stream_options.include_usage`` too (the door's ``message_delta`` carries the usage).
- ``system`` (a string or text blocks) is the first message, ``role: system``.
- A user message's ``tool_result`` blocks are ``role: tool`` messages, in their order and
  before the rest of that user message (Chat Completions answers tool calls right after the
  assistant's message); its text and images are content parts (an image's base64 source a
  ``data:`` URL, its URL source the URL).
- An assistant message's text is its ``content``, its ``tool_use`` blocks its ``tool_calls``
  (the input as compact JSON), its thinking and redacted thinking blocks its
  ``thinking_blocks`` (whole, signatures kept) and the thinking text its
  ``reasoning_content``: what an upstream of kind ``anthropic`` sends back as thinking blocks.
- ``tools`` are function tools (``input_schema`` the ``parameters``); ``tool_choice`` auto,
  any, tool, none are ``"auto"``, ``"required"``, the named function, ``"none"``;
  ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``.

Several text blocks are joined by a blank line where Chat Completions takes one string
(system, assistant, tool result).

Dropped, as Chat Completions has no field for them: ``top_k``; ``thinking`` and
``output_config.effort`` (the upstream reasons as it does); ``service_tier`` (other tiers);
``cache_control`` anywhere (an OpenAI upstream caches prefixes by itself); a text block's
``citations``. Any other member is ignored. ``output_config.format`` (a JSON schema) is
``response_format`` ``json_schema``.

Refused with ``chat.Untranslatable`` (another upstream of the plan may take the call): a
server tool (a tool whose ``type`` is not ``custom``), ``mcp_servers``, ``container``, and
any content block the translation does not take (``document``,
``search_result``, an image from the Files API, an image in a tool result, server tool
blocks). A request that is not the shape Anthropic's API takes is a ``BadRequest``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.core.errors import BadRequest
from app.dialects.chat import Untranslatable

JOIN = "\n\n"
# Members whose meaning an OpenAI upstream cannot carry out: the answer would be another one.
_REFUSED = ("mcp_servers", "container")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request asking what ``body`` (an Anthropic Messages request)
    asks."""
    for name in _REFUSED:
        if body.get(name):
            raise Untranslatable(f"{name} cannot be sent to this upstream", param=name)
    out: dict[str, Any] = {}
    output_config = body.get("output_config")
    fmt = output_config.get("format") if isinstance(output_config, Mapping) else None
    if fmt:
        schema = fmt.get("schema") if isinstance(fmt, Mapping) else None
        if not isinstance(schema, Mapping) or fmt.get("type") != "json_schema":
            raise BadRequest(
                "output_config.format must be a json_schema with its schema.",
                param="output_config.format",
            )
        # Chat Completions' structured output, named as a schema must be there; not
        # "strict", whose rules (every property required) a given schema may not follow.
        spec = {"name": "output", "schema": dict(schema)}
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    if "model" in body:
        out["model"] = body["model"]
    out["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
    for name in ("max_tokens", "temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get("user_id") is not None:
        out["user"] = metadata["user_id"]
    if body.get("tools"):
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(_list(body["tools"], "tools"))]
    # OpenAI refuses tool_choice and parallel_tool_calls in a request without tools; without
    # tools every choice asks the same (no tool call).
    if body.get("tool_choice") is not None and body.get("tools"):
        out.update(_tool_choice(body["tool_choice"]))
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{param} must be a list", param=param)
    return value


def _block(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest(f"{param} must be an object", param=param)
    return value


def _refuse(block: Mapping[str, Any], param: str) -> Untranslatable:
    kind = block.get("type")
    return Untranslatable(f"a {kind!r} block cannot be sent to this upstream", param=param)


def _texts(value: Any, param: str) -> str:
    """A string, or text blocks joined: the one string Chat Completions takes."""
    if isinstance(value, str):
        return value
    texts = []
    for j, item in enumerate(_list(value, param)):
        block = _block(item, f"{param}[{j}]")
        if block.get("type") != "text":
            raise _refuse(block, f"{param}[{j}].type")
        texts.append(str(block.get("text", "")))
    return JOIN.join(texts)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == [] or system == "":
        return []
    return [{"role": "system", "content": _texts(system, "system")}]


def _messages(messages: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(_list(messages, "messages")):
        message = _block(item, f"messages[{i}]")
        role = message.get("role")
        if role == "user":
            out += _user(message.get("content"), f"messages[{i}].content")
        elif role == "assistant":
            out.append(_assistant(message.get("content"), f"messages[{i}].content"))
        else:
            raise BadRequest(
                f"messages[{i}].role must be 'user' or 'assistant'", param=f"messages[{i}].role"
            )
    return out


def _user(content: Any, param: str) -> list[dict[str, Any]]:
    """A user message: its tool results first (each a tool message), then the rest."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    blocks = _list(content, param)
    for j, item in enumerate(blocks):
        block = _block(item, f"{param}[{j}]")
        kind = block.get("type")
        if kind == "tool_result":
            results.append(_tool_result(block, f"{param}[{j}]"))
        elif kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append(_image(block, f"{param}[{j}]"))
        else:
            raise _refuse(block, f"{param}[{j}].type")
    if parts or not results:
        results.append({"role": "user", "content": parts})
    return results


def _image(block: Mapping[str, Any], param: str) -> dict[str, Any]:
    source = _block(block.get("source"), f"{param}.source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise Untranslatable(
            f"an image from a {source.get('type')!r} source cannot be sent to this upstream",
            param=f"{param}.source.type",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: Mapping[str, Any], param: str) -> dict[str, Any]:
    # is_error has no Chat Completions field: the text says what went wrong.
    content = block.get("content")
    text = "" if content is None else _texts(content, f"{param}.content")
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}


def _assistant(content: Any, param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for j, item in enumerate(_list(content, param)):
        block = _block(item, f"{param}[{j}]")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "thinking":
            thinking.append(
                {
                    "type": "thinking",
                    "thinking": block.get("thinking", ""),
                    "signature": block.get("signature", ""),
                }
            )
        elif kind == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "data": block.get("data", "")})
        else:
            raise _refuse(block, f"{param}[{j}].type")
    # With tool calls and no text, content is null (as OpenAI sends such a message).
    message: dict[str, Any] = {
        "role": "assistant",
        "content": JOIN.join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    reasoning = "".join(b["thinking"] for b in thinking if b["type"] == "thinking")
    if reasoning:
        message["reasoning_content"] = reasoning
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block.get("input", {}), separators=(",", ":"), ensure_ascii=False)
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def _tool(item: Any, i: int) -> dict[str, Any]:
    tool = _block(item, f"tools[{i}]")
    if tool.get("type", "custom") not in ("custom", None):
        raise Untranslatable(
            f"the server tool {tool.get('type')!r} cannot be sent to this upstream",
            param=f"tools[{i}].type",
        )
    function: dict[str, Any] = {"name": tool.get("name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("input_schema", {"type": "object"})
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(value: Any) -> dict[str, Any]:
    choice = _block(value, "tool_choice")
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in _TOOL_CHOICES:
        out["tool_choice"] = _TOOL_CHOICES[kind]
    else:
        raise BadRequest(
            f"tool_choice.type {kind!r} is not one of auto, any, tool, none",
            param="tool_choice.type",
        )
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out
