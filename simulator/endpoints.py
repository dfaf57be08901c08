"""What each OpenAI endpoint answers. No I/O here: a parsed JSON body in, a reply out.

Validation is deliberately narrow: only the fields the simulator reads are checked, with
OpenAI's status, type and ``param`` so that a gateway's error passthrough can be tested.
Timing and faults are not decided here; ``playback`` applies them to the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import chat_scripts, continuing, scripts, text
from . import responses as r
from . import responses_api as api
from .anthropic import MessageFramer
from .behaviour import Behaviour
from .gemini import GenerateFramer

DEFAULT_TOKENS = 16
MAX_TOKENS = 100_000
DEFAULT_DIMENSIONS = 16
MAX_DIMENSIONS = 8192

NewId = Callable[[str], str]
Framer = (
    r.ChunkFramer
    | api.ResponseFramer
    | chat_scripts.ScriptChatFramer
    | MessageFramer
    | GenerateFramer
)


@dataclass(frozen=True)
class Reply:
    """A generation: the tokens it counts (prompt and output, for the rate-limit headers),
    the non-stream body, and the framer when a stream was asked for."""

    tokens: int
    body: dict[str, Any]
    framer: Framer | None = None


def _bad(message: str, param: str | None) -> r.ApiError:
    return r.ApiError(400, message, param=param)


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", None)
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("you must provide a model parameter", "model")
    return model


def flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"Invalid type for '{name}': expected a boolean.", name)
    return value


def _stream_option(body: dict[str, Any], name: str) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _bad("Invalid type for 'stream_options': expected an object.", "stream_options")
    return bool(options.get(name))


def _service_tier(body: dict[str, Any]) -> str | None:
    """The tier the answer says it was served (and billed) in: ``auto`` runs as ``default``."""
    tier = body.get("service_tier")
    if tier is None:
        return None
    if tier not in ("auto", "default", "flex", "scale", "priority"):
        raise _bad(f"Invalid value for 'service_tier': {tier!r}.", "service_tier")
    return "default" if tier == "auto" else str(tier)


def _length(body: dict[str, Any], behaviour: Behaviour, keys: tuple[str, ...]) -> tuple[int, str]:
    """How many tokens to produce and the finish reason that goes with that count."""
    if behaviour.tokens is not None:
        return min(behaviour.tokens, MAX_TOKENS), "stop"
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(f"Invalid '{key}': expected a non-negative integer.", key)
        return min(value, MAX_TOKENS), "length"
    return DEFAULT_TOKENS, "stop"


def _completion(
    body: dict[str, Any],
    behaviour: Behaviour,
    prompt: str,
    length: tuple[int, str],
    prefix: str,
    new_id: NewId,
    now: int,
) -> r.Completion:
    count, finish = length
    return r.Completion(
        id=new_id(prefix),
        created=now,
        model=model_of(body),
        tokens=tuple(text.words(prompt, count)),
        finish_reason=finish,
        prompt_tokens=text.word_count(prompt),
        service_tier=_service_tier(body),
        cached_tokens=behaviour.cached_tokens,
    )


def _framer(
    body: dict[str, Any], c: r.Completion, *, chat: bool, usage: str = "final"
) -> r.ChunkFramer | None:
    if not flag(body, "stream"):
        return None
    return r.ChunkFramer(
        c,
        chat=chat,
        include_usage=_stream_option(body, "include_usage") and usage != "none",
        obfuscate=_stream_option(body, "include_obfuscation"),
        running_usage=usage == "every",
    )


def chat(body: dict[str, Any], behaviour: Behaviour, new_id: NewId, now: int) -> Reply:
    """POST /v1/chat/completions."""
    model_of(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array.", "messages")
    length = _length(body, behaviour, ("max_completion_tokens", "max_tokens"))
    prompt = text.chat_prompt(messages)
    partial = continuing.partial_turn(body, messages)
    told = partial is None and behaviour.script is None
    if told:  # an instruction to go on, maybe
        partial = continuing.instructed(continuing.chat_turns(messages))
        told = partial is not None
    if behaviour.script is not None:
        script = continuing.script_rest(script_of(behaviour), partial)
        return _chat_script(body, script, new_id, now)
    c = _completion(body, behaviour, prompt, length, "chatcmpl-", new_id, now)
    if partial is not None:
        c = continuing.continued(c, messages, partial, natural=length[1] == "stop", told=told)
    whole = r.chat_completion(c)
    if behaviour.usage == "none":
        del whole["usage"]
    framer = _framer(body, c, chat=True, usage=behaviour.usage)
    return Reply(_tokens(c), whole, framer)


def _tokens(c: r.Completion) -> int:
    return c.prompt_tokens + len(c.tokens)


def script_of(behaviour: Behaviour) -> scripts.Script:
    """The answer the ``script`` control names, with the cached tokens a control asks for."""
    assert behaviour.script is not None
    return scripts.SCRIPTS[behaviour.script].with_cache_read(behaviour.cached_tokens)


def overloaded() -> r.ApiError:
    """A scripted failure asked for whole: the dialect's overloaded error (app.py renders
    the 529 as each dialect does)."""
    return r.ApiError(529, scripts.OVERLOADED, "overloaded_error")


def _chat_script(body: dict[str, Any], script: scripts.Script, new_id: NewId, now: int) -> Reply:
    """A scripted chat answer in the gateway's canonical chunk shape (chat_scripts.py)."""
    id, model = new_id("chatcmpl-"), model_of(body)
    tokens = script.usage.prompt + script.usage.output
    if flag(body, "stream"):
        framer = chat_scripts.ScriptChatFramer(
            script, id, now, model, _stream_option(body, "include_usage")
        )
        return Reply(tokens, {}, framer)
    if script.finish == scripts.ERROR:
        raise overloaded()
    return Reply(tokens, chat_scripts.completion(script, id, now, model))


def no_script(behaviour: Behaviour, route: str) -> None:
    if behaviour.script is not None:
        raise _bad(f"simulator control script is not supported on {route}", "script")


def completions(body: dict[str, Any], behaviour: Behaviour, new_id: NewId, now: int) -> Reply:
    """POST /v1/completions, the legacy text completion."""
    model_of(body)
    length = _length(body, behaviour, ("max_tokens",))
    prompt = text.completion_prompt(body.get("prompt", ""))
    no_script(behaviour, "/v1/completions")
    c = _completion(body, behaviour, prompt, length, "cmpl-", new_id, now)
    return Reply(_tokens(c), r.text_completion(c), _framer(body, c, chat=False))


def responses(body: dict[str, Any], behaviour: Behaviour, new_id: NewId, now: int) -> Reply:
    """POST /v1/responses, streamed as typed events or not. With ``tool_call`` on and a
    function among the request's tools, the model calls the first one instead of writing."""
    model_of(body)
    no_script(behaviour, "/v1/responses")
    # A Responses object that ran out of tokens would be "incomplete"; we always say
    # "completed", so the token cap is not a "length" finish here.
    count, _ = _length(body, behaviour, ("max_output_tokens",))
    parts = (text.responses_prompt(body.get(k)) for k in ("instructions", "input"))
    prompt = "\n".join(part for part in parts if part)
    c = _completion(body, behaviour, prompt, (count, "stop"), "resp_", new_id, now)
    name = api.first_function(body.get("tools")) if behaviour.tool_call else None
    if name is not None:
        output = api.function_call(new_id("fc_"), new_id("call_"), name, c.tokens)
    else:
        output = api.Output(new_id("msg_"), c.tokens)
    store = body.get("store", True)
    shape = api.ResponseShape(
        completion=c,
        output=output,
        service_tier=c.service_tier or "default",
        store=store if isinstance(store, bool) else True,
        cached_tokens=behaviour.cached_tokens or 0,
        echo=tuple((k, body[k]) for k in ("instructions", "metadata") if k in body),
    )
    framer = None
    if flag(body, "stream"):
        framer = api.ResponseFramer(shape, obfuscate=_stream_option(body, "include_obfuscation"))
    return Reply(_tokens(c), api.response_object(shape), framer)


def embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/embeddings: one unit vector per input, floats or base64 float32."""
    model = model_of(body)
    inputs = text.embedding_inputs(body.get("input"))
    if inputs is None:
        raise _bad("'input' must be a string or a non-empty array.", "input")
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if dimensions is None:
        dimensions = DEFAULT_DIMENSIONS
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise _bad("Invalid 'dimensions': expected an integer.", "dimensions")
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        raise _bad(f"'dimensions' must be between 1 and {MAX_DIMENSIONS}.", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise _bad("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    vectors = [text.embedding(t, dimensions) for t in inputs]
    data: list[Any] = vectors
    if encoding == "base64":
        data = [text.embedding_base64(v) for v in vectors]
    return r.embedding_list(model, data, sum(text.word_count(t) for t in inputs))


def model_by_id(model_id: str) -> dict[str, Any]:
    """GET /v1/models/{id}: listed models and any ``sim...`` model exist."""
    if model_id in r.MODELS or model_id.startswith("sim"):
        return r.model_object(model_id)
    raise r.ApiError(
        404,
        f"The model '{model_id}' does not exist or you do not have access to it.",
        param=None,
        code="model_not_found",
    )
