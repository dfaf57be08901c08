"""What the Anthropic and Gemini routes answer. No I/O here: a parsed body in, a reply out.

Like endpoints.py for OpenAI's routes: only the fields the simulator reads are checked, and
an error is an ``ApiError`` that app.py writes in the request's dialect (dialects.py). The
answer is the script the ``script`` control names, or generated words (a one-block script,
scripts.py's ``generated``): ``tokens`` of them (default 16), fewer when the request's own
cap (Anthropic's required ``max_tokens``, Gemini's ``generationConfig.maxOutputTokens``) is
lower, and then the answer stops for its length. Unlike the OpenAI routes, where
``max_tokens`` is how many words to write, here it is only a cap, as the providers mean it.
"""

from __future__ import annotations

from typing import Any

from . import anthropic, continuing, gemini, scripts, text
from .behaviour import Behaviour
from .endpoints import (
    DEFAULT_TOKENS,
    MAX_TOKENS,
    NewId,
    Reply,
    flag,
    model_of,
    overloaded,
    script_of,
)
from .responses import ApiError


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _cap(value: Any, name: str, *, required: bool) -> int | None:
    """A positive whole-number cap on the answer's tokens, when given."""
    if value is None:
        if required:
            raise _bad(f"{name}: Field required", name)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{name}: Input should be a positive integer", name)
    return value


def _answer(behaviour: Behaviour, prompt: str, cap: int | None) -> scripts.Script:
    if behaviour.script is not None:
        return script_of(behaviour)
    wanted = min(DEFAULT_TOKENS if behaviour.tokens is None else behaviour.tokens, MAX_TOKENS)
    count, finish = wanted, scripts.STOP
    if cap is not None and cap < wanted:
        count, finish = cap, scripts.LENGTH
    words = tuple(text.words(prompt, count))
    b = behaviour
    return scripts.generated(
        words,
        finish,
        text.word_count(prompt),
        b.cached_tokens or 0,
        b.cache_written,
        b.cache_written_1h,
        split=b.prompt_cache,
    )


def _tokens(script: scripts.Script) -> int:
    return script.usage.prompt + script.usage.output


def _messages_prompt(body: dict[str, Any]) -> str:
    model_of(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: at least one message is required", "messages")
    return text.messages_prompt(body.get("system"), messages)


def messages(body: dict[str, Any], behaviour: Behaviour, new_id: NewId) -> Reply:
    """POST /v1/messages: a ``message``, or its stream of events."""
    prompt = _messages_prompt(body)
    cap = _cap(body.get("max_tokens"), "max_tokens", required=True)
    script = _answer(behaviour, prompt, cap)
    turns, told = body["messages"], False
    partial = continuing.prefill(turns)
    if partial is None:
        partial = continuing.instructed(continuing.chat_turns(turns))
        told = partial is not None
    if partial is not None and behaviour.script is None:
        before = text.messages_prompt(body.get("system"), turns[: -2 if told else -1])
        script = _prefilled(before, behaviour, partial, script, cap, told)
    elif partial is not None and not told:  # a script's leading text continued, as on chat
        script = continuing.script_rest(script, partial)
    id, model = new_id("msg_"), model_of(body)
    if flag(body, "stream"):
        return Reply(_tokens(script), {}, anthropic.MessageFramer(script, id, model))
    if script.finish == scripts.ERROR:
        raise overloaded()
    return Reply(_tokens(script), anthropic.message(script, id, model))


def _prefilled(
    before: str,
    behaviour: Behaviour,
    partial: str,
    script: scripts.Script,
    cap: int | None,
    told: bool,
) -> scripts.Script:
    """The answer that continues a prefill, a model turn or, ``told``, an instruction
    (simulator/continuing.py): the rest of the answer to the prompt ``before`` them, to its
    natural length, or as many more words as the cap allows. Its prompt tokens count the
    partial turn, as the provider bills it."""
    wanted = min(DEFAULT_TOKENS if behaviour.tokens is None else behaviour.tokens, MAX_TOKENS)
    words = continuing.rest_of(before, partial, wanted, natural=True)
    words, finish = (continuing.repeated(partial) if told else []) + words, scripts.STOP
    if cap is not None and cap < len(words):
        words, finish = words[:cap], scripts.LENGTH
    prompt = script.usage.input + script.usage.cache_read
    return scripts.generated(tuple(words), finish, prompt, behaviour.cached_tokens or 0)


def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/messages/count_tokens: the prompt's tokens, as a generated answer counts them."""
    return {"input_tokens": text.word_count(_messages_prompt(body))}


def generate(
    body: dict[str, Any], model: str, stream: bool, behaviour: Behaviour, new_id: NewId
) -> Reply:
    """POST /v1beta/models/{model}:generateContent, or :streamGenerateContent (``stream``)."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _bad("* GenerateContentRequest.contents: contents is not specified", "contents")
    config = body.get("generationConfig")
    if config is not None and not isinstance(config, dict):
        raise _bad("Invalid value at 'generation_config': expected an object", "generationConfig")
    cap = _cap((config or {}).get("maxOutputTokens"), "maxOutputTokens", required=False)
    system = body.get("systemInstruction")
    script = _answer(behaviour, text.gemini_prompt(system, contents), cap)
    partial, told = continuing.model_turn(contents), False
    if partial is None:
        turns = [
            (c.get("role"), text.gemini_prompt(None, [c])) for c in contents if isinstance(c, dict)
        ]
        partial = continuing.instructed(turns)
        told = partial is not None
    if partial is not None and behaviour.script is None:
        before = text.gemini_prompt(system, contents[: -2 if told else -1])
        script = _prefilled(before, behaviour, partial, script, cap, told)
    elif partial is not None and not told:  # a script's leading text continued, as on chat
        script = continuing.script_rest(script, partial)
    id = new_id("")
    if stream:
        return Reply(_tokens(script), {}, gemini.GenerateFramer(script, id, model))
    if script.finish == scripts.ERROR:
        raise overloaded()
    return Reply(_tokens(script), gemini.response(script, id, model))
