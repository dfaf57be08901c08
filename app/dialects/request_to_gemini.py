"""A Chat Completions request as a Gemini ``generateContent`` body. No I/O here.

The rule: a field Gemini can be asked has its place in Gemini's body; a field that asks for
what Gemini cannot do is refused by name (``chat.Untranslatable``, a 400 another upstream of
the plan may still take); a field not named here is not sent, Gemini's body having no place
for it: ``user`` (the caller's own label: Gemini has no such field), a message's ``name``, an
image's ``detail``, a function's ``strict``.

- system and developer messages, wherever they stand, become ``systemInstruction`` (in order);
  user is role ``user``, assistant is role ``model``; consecutive contents of one role are
  merged (parallel function responses must share one content).
- an assistant's tool calls are ``functionCall`` parts (arguments parsed: Gemini takes an
  object); a tool message is a ``functionResponse`` part named after the call it answers; the
  first signature (not empty) of an assistant's ``thinking_blocks`` goes back as the
  ``thoughtSignature`` of its first function call, else of its first part (Gemini 3 refuses
  a turn of tool calls without it).
- refused: ``n`` > 1, ``logprobs``/``top_logprobs``, a ``logit_bias``, audio out, audio and
  file content parts, role ``function``, and ``parallel_tool_calls: false`` (Gemini cannot be
  told to call one tool at a time).
- ``stream``, ``stream_options``, ``store`` and ``metadata`` mean nothing to the body: the
  stream is chosen by the URL (gemini.target).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from app.dialects.chat import Untranslatable, output_bound, thinking_budget

# reasoning_effort as a thinking budget (tokens): the middle of what each effort means to
# Gemini 2.5's budgets (0 to 24576), the summaries asked for so reasoning_content has them.
# Gemini counts the thoughts within maxOutputTokens (an answer that thought up to it ends
# MAX_TOKENS with thoughtsTokenCount near it), so the caller's bound, sent as it is, bounds
# them; the budget is cut below it as Anthropic's is (chat.thinking_budget), and a bound with
# no room for the least budget sends none (the model's own default, still within the bound).
THINKING_BUDGETS = {"low": 1024, "medium": 8192, "high": 24576}
TOOL_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
# An image URL's type from its extension (the mimetypes module reads the system's tables).
IMAGE_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "heic": "image/heic",
    "heif": "image/heif",
}
_GENERATION = {
    "temperature": "temperature",
    "top_p": "topP",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}


def request_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Gemini body of a Chat Completions request ``body`` (raises Untranslatable)."""
    _refuse(body)
    system, contents = _messages(body.get("messages") or [])
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    if body.get("tools"):
        out["tools"] = [{"functionDeclarations": _declarations(body["tools"])}]
    if body.get("tool_choice") is not None:
        out["toolConfig"] = {"functionCallingConfig": _tool_choice(body["tool_choice"])}
    config = _generation_config(body)
    if config:
        out["generationConfig"] = config
    return out


def _refuse(body: Mapping[str, Any]) -> None:
    """Fields Gemini has no way to honour, named in the 400."""
    if body.get("n") not in (None, 1):
        raise Untranslatable("Gemini answers with one choice: n must be 1", param="n")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name):
            raise Untranslatable("Gemini does not return log probabilities here", param=name)
    if body.get("logit_bias"):
        raise Untranslatable("Gemini takes no logit_bias", param="logit_bias")
    if body.get("audio") is not None:
        raise Untranslatable("Gemini's text models answer in text only", param="audio")
    if body.get("modalities") not in (None, ["text"]):
        raise Untranslatable("Gemini's text models answer in text only", param="modalities")
    if body.get("parallel_tool_calls") is False:
        # Gemini has no switch for it: the model may call several functions in one turn.
        raise Untranslatable(
            "Gemini cannot be told one tool call at a time", param="parallel_tool_calls"
        )
    for name in ("functions", "function_call"):
        if body.get(name) is not None:
            raise Untranslatable("use tools and tool_choice with Gemini", param=name)


def _messages(messages: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(systemInstruction parts, contents) of the chat messages."""
    if not isinstance(messages, list):
        raise Untranslatable("messages must be a list", param="messages")
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name, from the assistant's calls
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise Untranslatable("a message must be an object", param=where)
        role = message.get("role")
        if role in ("system", "developer"):
            system += _text_parts(message.get("content"), where)
            continue
        if role == "user":
            parts = _user_parts(message.get("content"), where)
        elif role == "assistant":
            parts = _assistant_parts(message, where, names)
        elif role == "tool":
            parts = [_function_response(message, where, names)]
        else:
            raise Untranslatable(f"Gemini takes no message of role {role!r}", param=f"{where}.role")
        gemini_role = "model" if role == "assistant" else "user"
        if not parts:
            continue  # Gemini refuses a content without parts; an empty message says nothing
        if contents and contents[-1]["role"] == gemini_role:
            contents[-1]["parts"] += parts
        else:
            contents.append({"role": gemini_role, "parts": parts})
    return system, contents


def _text_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Text-only content (system, developer, assistant, tool) as text parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise Untranslatable(
            "content must be a string or a list of parts", param=f"{where}.content"
        )
    parts = []
    for j, part in enumerate(content):
        # An assistant's refusal part is what it said, as text.
        kind = part.get("type") if isinstance(part, Mapping) else None
        text = part.get(kind) if kind in ("text", "refusal") else None
        if not isinstance(text, str):
            raise Untranslatable("only text parts here", param=f"{where}.content[{j}]")
        if text:
            parts.append({"text": text})
    return parts


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return _text_parts(content, where)
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts += _text_parts([part], where)
        elif kind == "image_url":
            parts.append(_image(part.get("image_url"), at))
        else:
            raise Untranslatable(f"Gemini is not sent {kind!r} content parts here", param=at)
    return parts


def _image(image: Any, where: str) -> dict[str, Any]:
    """A data URL as inline bytes; an http(s) URL as a file Gemini fetches itself."""
    url = image.get("url") if isinstance(image, Mapping) else None
    if not isinstance(url, str):
        raise Untranslatable("image_url needs a url", param=where)
    if url.startswith("data:"):
        head, comma, data = url[len("data:") :].partition(",")
        mime, _, encoding = head.partition(";")
        if not comma or encoding != "base64" or not mime:
            raise Untranslatable("a data URL must be data:<type>;base64,...", param=where)
        return {"inlineData": {"mimeType": mime, "data": data}}
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Untranslatable("an image URL must be http(s) or a data URL", param=where)
    extension = parts.path.rpartition(".")[2].lower() if "." in parts.path else ""
    mime = IMAGE_TYPES.get(extension, "image/jpeg")
    return {"fileData": {"fileUri": url, "mimeType": mime}}


def _assistant_parts(
    message: Mapping[str, Any], where: str, names: dict[str, str]
) -> list[dict[str, Any]]:
    if message.get("function_call") is not None:
        raise Untranslatable("use tool_calls with Gemini", param=f"{where}.function_call")
    parts = _text_parts(message.get("content"), where)
    for k, call in enumerate(message.get("tool_calls") or []):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise Untranslatable("a tool call needs a function name", param=at)
        try:
            args = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise Untranslatable("Gemini takes a tool call's arguments as a JSON object", param=at)
        part = {"name": function["name"], "args": args}
        if isinstance(call.get("id"), str):
            part["id"] = call["id"]
            names[call["id"]] = function["name"]
        parts.append({"functionCall": part})
    _signed(parts, message.get("thinking_blocks"))
    return parts


def _signed(parts: list[dict[str, Any]], blocks: Any) -> None:
    """The assistant's thought signature (the gateway returns Gemini's in ``thinking_blocks``;
    the first that is not empty) back on its first function call, where Gemini wants it to
    continue a turn of tool calls; on its first part when it made none (where Gemini put it:
    the answer's text). Other signatures are not placed: which part each came from is not
    kept in the Chat Completions shape."""
    signatures = [
        block["signature"]
        for block in blocks or []
        if isinstance(block, Mapping)
        and isinstance(block.get("signature"), str)
        and block["signature"]  # a block no signature closed (thought not signed) has ""
    ]
    if not signatures or not parts:
        return
    first = next((p for p in parts if "functionCall" in p), parts[0])
    first["thoughtSignature"] = signatures[0]


def _function_response(
    message: Mapping[str, Any], where: str, names: dict[str, str]
) -> dict[str, Any]:
    """A tool's answer; Gemini names the function it answers, so the call must be known."""
    call_id = message.get("tool_call_id")
    if call_id not in names:
        raise Untranslatable(
            "no earlier assistant tool call has this id", param=f"{where}.tool_call_id"
        )
    result = "".join(part["text"] for part in _text_parts(message.get("content"), where))
    return {
        "functionResponse": {"name": names[call_id], "id": call_id, "response": {"result": result}}
    }


def _declarations(tools: Any) -> list[dict[str, Any]]:
    declarations = []
    for k, tool in enumerate(tools if isinstance(tools, list) else [None]):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type") != "function":
            raise Untranslatable("Gemini is sent function tools only", param=f"tools[{k}]")
        declaration = {"name": function.get("name")}
        if function.get("description") is not None:
            declaration["description"] = function["description"]
        if function.get("parameters") is not None:
            declaration["parametersJsonSchema"] = function["parameters"]
        declarations.append(declaration)
    return declarations


def _tool_choice(choice: Any) -> dict[str, Any]:
    if isinstance(choice, str) and choice in TOOL_MODES:
        return {"mode": TOOL_MODES[choice]}
    function = choice.get("function") if isinstance(choice, Mapping) else None
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return {"mode": "ANY", "allowedFunctionNames": [function["name"]]}
    raise Untranslatable(
        "tool_choice must be auto, none, required or a function", param="tool_choice"
    )


def _generation_config(body: Mapping[str, Any]) -> dict[str, Any]:
    config = {
        gemini: body[name] for name, gemini in _GENERATION.items() if body.get(name) is not None
    }
    limit = output_bound(body)
    if limit is not None:
        config["maxOutputTokens"] = limit
    stop = body.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else stop
    config.update(_response_format(body.get("response_format")))
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in THINKING_BUDGETS:
            raise Untranslatable(
                "reasoning_effort must be low, medium or high", param="reasoning_effort"
            )
        wanted = THINKING_BUDGETS[effort]
        budget = wanted if limit is None else thinking_budget(wanted, limit)
        if budget is not None:  # else no room within the bound: the model's own default
            config["thinkingConfig"] = {"thinkingBudget": budget, "includeThoughts": True}
    return config


def _response_format(form: Any) -> dict[str, Any]:
    kind = form.get("type") if isinstance(form, Mapping) else form
    if kind in (None, "text"):
        return {}
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        spec = form.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        out: dict[str, Any] = {"responseMimeType": "application/json"}
        if schema is not None:
            out["responseJsonSchema"] = schema
        return out
    raise Untranslatable(
        "response_format must be text, json_object or json_schema", param="response_format"
    )
