"""A Chat Completions request as an Anthropic Messages request. No I/O here.

Rule: every field of an OpenAI chat request is mapped, refused, or dropped on purpose, and
nothing is guessed. ``request_body`` returns the Messages body, or raises
``chat.Untranslatable`` (naming the field) for a request Anthropic cannot be asked, so the
plan may fail over to an upstream of another kind; a value of the wrong shape is a plain
``BadRequest`` naming it.

- messages: system and developer messages, wherever they stand, become the top-level
  ``system`` text blocks in order; user and assistant turns keep their order, a tool message
  becomes a user turn of ``tool_result`` blocks, and consecutive turns of one role are merged
  (Anthropic wants user and assistant to alternate). An assistant's ``thinking_blocks`` go
  first in its content (a thinking block without a signature is left out: Anthropic checks
  the signature of each one), its ``tool_calls`` last as ``tool_use`` blocks. Empty text is left
  out (Anthropic refuses empty text blocks; an assistant turn with tool calls often has
  ``content: ""``). A part's ``cache_control`` is kept (Anthropic's prompt caching).
- mapped: tools, tool_choice and parallel_tool_calls (only with tools: without them OpenAI's
  choices mean nothing), stop, temperature and top_p as given (Anthropic's temperature ends
  at 1; its own 400 says so), max_completion_tokens or max_tokens (the smaller; else the
  upstream's default: Anthropic requires one), user, stream, reasoning_effort (a thinking
  budget within that bound, never above it).
- passed through, Anthropic's own (sent as extra body): top_k, thinking.
- structured outputs: response_format ``json_schema`` -> ``output_config.format`` with its
  schema, ``json_object`` -> the schema of any object (``output_format``).
- refused: n > 1, logprobs, top_logprobs, logit_bias, presence and frequency penalties,
  audio, modalities other than text, web_search_options, the
  legacy functions / function_call and ``function`` messages, input_audio and file parts.
- dropped, carrying no meaning for Anthropic: seed, store, metadata (OpenAI's stored-
  completion tags, not Anthropic's ``metadata``), prediction, stream_options (the usage
  chunk is the stream translator's ``include_usage``), service_tier, and any other field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.core.errors import BadRequest
from app.dialects.chat import Untranslatable, output_bound, thinking_budget

_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}
_CHOICES = {"auto": "auto", "none": "none", "required": "any"}
_PASSED = ("temperature", "top_p", "top_k", "stream")
# Fields a request asks something of when they are set (true, non-zero, non-empty).
_REFUSED = (
    ("logprobs", "returns no log probabilities"),
    ("top_logprobs", "returns no log probabilities"),
    ("logit_bias", "takes no logit bias"),
    ("presence_penalty", "has no presence penalty"),
    ("frequency_penalty", "has no frequency penalty"),
    ("audio", "answers in text only"),
    ("web_search_options", "has no web_search_options"),
    ("functions", "takes 'tools' (the legacy 'functions' is not translated)"),
    ("function_call", "takes 'tool_choice' (the legacy 'function_call' is not translated)"),
)


def request_body(body: Mapping[str, Any], *, default_max_tokens: int) -> dict[str, Any]:
    """The Messages body for the chat request ``body`` (its ``model`` already the upstream's).

    ``max_tokens`` is the caller's output bound (chat.output_bound: a key's cap is one), else
    ``default_max_tokens`` (the upstream's setting: Anthropic requires one), and never more:
    it bounds the thinking too, as it does at Anthropic. ``reasoning_effort`` low / medium /
    high turns thinking on with a budget of 1024 / 4096 / 16384 tokens, cut to fit below
    ``max_tokens`` (chat.thinking_budget), and off when the bound leaves no room for
    Anthropic's least budget (1024); an explicit ``thinking`` wins, as it is.
    """
    _refuse(body)
    system, turns = _messages(body["messages"])
    out: dict[str, Any] = {"model": body["model"], "messages": turns}
    if system:
        out["system"] = system
    bound = output_bound(body)
    out["max_tokens"] = default_max_tokens if bound is None else bound
    out.update((name, body[name]) for name in _PASSED if body.get(name) is not None)
    _thinking(body, out)
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if isinstance(body.get("user"), str) and body["user"]:
        out["metadata"] = {"user_id": body["user"]}
    fmt = output_format(body)
    if fmt is not None:
        out["output_config"] = {"format": fmt}
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    return out


def _refuse(body: Mapping[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise Untranslatable(
            "Anthropic's Messages API answers one choice per call: 'n' must be 1.", param="n"
        )
    for name, why in _REFUSED:
        if body.get(name):
            raise Untranslatable(f"Anthropic's Messages API {why}: '{name}'.", param=name)
    modalities = body.get("modalities")
    if modalities not in (None, [], ["text"]):
        raise Untranslatable("Anthropic's Messages API answers in text only.", param="modalities")


def output_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``response_format`` as Anthropic's structured output (``output_config.format``): a
    ``json_schema`` with its schema; ``json_object`` as the schema of any object; None for
    text or none."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_schema", "schema": {"type": "object"}}
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if not isinstance(schema, Mapping):
        raise Untranslatable(
            f"response_format {kind!r} has no JSON schema for Anthropic's structured outputs.",
            param="response_format",
        )
    return {"type": "json_schema", "schema": dict(schema)}


def _thinking(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    if body.get("thinking") is not None:
        out["thinking"] = body["thinking"]
        return
    effort = body.get("reasoning_effort")
    if effort is None:
        return
    if effort not in _BUDGETS:
        raise Untranslatable(
            f"reasoning_effort {effort!r} has no Anthropic thinking budget "
            "(low, medium and high do).",
            param="reasoning_effort",
        )
    budget = thinking_budget(_BUDGETS[effort], out["max_tokens"])
    if budget is not None:  # else no room within the bound: the call goes without thinking
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}


def _messages(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The system blocks and the alternating turns of ``messages``."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise BadRequest(f"Invalid value for '{where}': expected an object.", param=where)
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system += _parts(content, f"{where}.content", ("text",))
            continue
        if role == "user":
            blocks = _parts(content, f"{where}.content", ("text", "image_url"))
        elif role == "assistant":
            role, blocks = "assistant", _assistant(message, where)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message, where)]
        elif role == "function":
            raise Untranslatable(
                "Legacy 'function' messages are not translated for Anthropic; send tool messages.",
                param=f"{where}.role",
            )
        else:
            raise BadRequest(f"Invalid value for '{where}.role': {role!r}.", param=f"{where}.role")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _parts(content: Any, where: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """Content (a string, an array of parts, or null) as Anthropic blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise BadRequest(
            f"Invalid value for '{where}': expected a string or an array.", param=where
        )
    blocks = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise BadRequest(f"Invalid value for '{where}[{j}]'.", param=f"{where}[{j}]")
        kind = part.get("type")
        if kind not in kinds:
            raise Untranslatable(
                f"A content part of type {kind!r} is not translated for Anthropic here.",
                param=f"{where}[{j}]",
            )
        if kind == "image_url":
            block = _image(part, f"{where}[{j}].image_url")
        else:  # text, or an assistant's refusal: text to Anthropic
            text = part.get(kind if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise BadRequest(f"Invalid value for '{where}[{j}]'.", param=f"{where}[{j}]")
            if not text:
                continue
            block = {"type": "text", "text": text}
        if part.get("cache_control") is not None:
            block["cache_control"] = part["cache_control"]
        blocks.append(block)
    return blocks


def _image(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else None
    if not isinstance(url, str):
        raise BadRequest(
            f"Invalid value for '{where}': expected an object with a url.", param=where
        )
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if comma and encoding == "base64":
            source = {"type": "base64", "media_type": media_type, "data": data}
            return {"type": "image", "source": source}
    elif url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise Untranslatable(
        "Anthropic takes an image as a base64 data URL or an http(s) URL.", param=where
    )


def _assistant(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    thinking = [
        _thinking_block(block, f"{where}.thinking_blocks[{j}]")
        for j, block in enumerate(message.get("thinking_blocks") or [])
    ]
    # A thinking block without its signature (thought another provider gave, or a stream cut
    # before the signature) cannot be checked by Anthropic, which checks each one it is sent.
    blocks = [b for b in thinking if b["type"] != "thinking" or b["signature"]]
    blocks += _parts(message.get("content"), f"{where}.content", ("text", "refusal"))
    for j, call in enumerate(message.get("tool_calls") or []):
        blocks.append(_tool_use(call, f"{where}.tool_calls[{j}]"))
    return blocks


def _thinking_block(block: Any, where: str) -> dict[str, Any]:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind == "thinking":
        return {
            "type": kind,
            "thinking": block.get("thinking", ""),
            "signature": block.get("signature", ""),
        }
    if kind == "redacted_thinking":
        return {"type": kind, "data": block.get("data", "")}
    raise Untranslatable(f"A thinking block of type {kind!r} is not Anthropic's.", param=where)


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(call.get("id"), str):
        raise BadRequest(f"Invalid value for '{where}': expected a function call.", param=where)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # An empty string is how some clients write a call without arguments.
        try:
            arguments = json.loads(arguments.strip() or "{}")
        except ValueError:
            arguments = None
    if not isinstance(arguments, dict):
        raise Untranslatable(
            f"The arguments of {where} are not a JSON object; Anthropic takes a tool call's "
            "input as one.",
            param=f"{where}.function.arguments",
        )
    return {"type": "tool_use", "id": call["id"], "name": function.get("name"), "input": arguments}


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    tool_use_id = message.get("tool_call_id")
    if not isinstance(tool_use_id, str):
        raise BadRequest(f"Missing '{where}.tool_call_id'.", param=f"{where}.tool_call_id")
    content = message.get("content")
    if not isinstance(content, str):
        content = _parts(content, f"{where}.content", ("text", "image_url"))
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("Invalid value for 'tools': expected an array.", param="tools")
    out = []
    for j, tool in enumerate(tools):
        where = f"tools[{j}]"
        kind = tool.get("type", "function") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise Untranslatable(
                f"Tools of type {kind!r} are not translated for Anthropic.", param=where
            )
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise BadRequest(f"Invalid value for '{where}.function'.", param=f"{where}.function")
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        entry = {"name": function["name"], "input_schema": schema}
        if function.get("description"):
            entry["description"] = function["description"]
        if tool.get("cache_control") is not None:
            entry["cache_control"] = tool["cache_control"]
        out.append(entry)
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        if parallel is not False:
            return None
        out: dict[str, Any] = {"type": "auto"}
    elif isinstance(choice, str) and choice in _CHOICES:
        out = {"type": _CHOICES[choice]}
    elif (
        isinstance(choice, Mapping)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), Mapping)
        and isinstance(choice["function"].get("name"), str)
    ):
        out = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise Untranslatable(
            f"tool_choice {choice!r} is not translated for Anthropic.", param="tool_choice"
        )
    if parallel is False and out["type"] != "none":  # Anthropic's "none" takes no such flag
        out["disable_parallel_tool_use"] = True
    return out
