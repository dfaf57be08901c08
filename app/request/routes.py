"""The routes a call can take, one ``Route`` row each: everything a stage asks of a route.
No I/O here.

A call's route (``Call.route``) is one of the values below, never a name to compare: a stage
asks the value (``route.cacheable``, ``route.end``, ``route.door``...). Adding a route is one
row here, plus its dialect's code where its callers or its upstreams speak another one
(app/dialects/). tests/unit/request/test_routes.py fails on a route's name compared, or a
set of route names kept, outside this module.

The vocabulary (docs/architecture.md's glossary): the **door** is the dialect a route's
callers speak (OpenAI's, or Anthropic's on /v1/messages), which also shapes its errors; the
**kinds** are the upstream dialects that can serve it (``openai``, ``anthropic``,
``gemini``), through a translation where the kind is not the door's; its **events** say
how its stream's events read: OpenAI's ``data:`` chunks, Responses' typed events, or
Anthropic's named events.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from app.core.doors import ANTHROPIC, GEMINI, OPENAI
from app.request.events import DONE, MESSAGE_STOP, TERMINAL, StreamEnd

# How a route's stream events read (StreamFacts, the log writer, the replay of an entry).
CHUNKS, TYPED, NAMED = "chunks", "typed", "named"
# The shape of a whole answer, for converting a stored one between stream and body
# (app/cache/replay.py).
SHAPE_CHAT, SHAPE_COMPLETION, SHAPE_RESPONSE, SHAPE_MESSAGE, SHAPE_EMBEDDING = (
    "chat.completion",
    "text_completion",
    "response",
    "message",
    "embedding",
)

Fields = tuple[tuple[str, tuple[type, ...]], ...]
# How a route's body holds its prompt (``Route.prompt``).
CHAT_PROMPT, MESSAGES_PROMPT, RESPONSES_PROMPT = "chat", "messages", "responses"


@dataclass(frozen=True, eq=False)
class Route:
    """One route: compared by identity (each row is made once, below)."""

    name: str  # its label in metrics, log lines and cache keys
    path: str | None = None  # the API path a POST takes it by (None: not by a path of its own)
    # The methods its path accepts: a POST is the route; another (a GET listing stored
    # objects) is forwarded as it is.
    methods: tuple[str, ...] = ("POST",)
    door: str = OPENAI
    kinds: frozenset[str] = frozenset({OPENAI})  # the upstream kinds that serve it
    translated: bool = False  # an upstream of another kind is spoken to in its own dialect
    # The body: parsed and checked (``required``: the fields, their JSON types); else it is
    # forwarded as it came.
    validated: bool = False
    required: Fields = ()
    forwarded: bool = False  # the route of any other /v1 path: sent on as it is
    generates: bool = False  # its answer is generated tokens (bounded, metered)
    output_field: str | None = None  # where a key's max_tokens cap goes for a call naming none
    choice_fields: tuple[str, ...] = ("n",)  # the fields that multiply its answers
    injects_usage: bool = False  # a keyed stream asks the upstream for its usage chunk
    cacheable: bool = False
    deterministic: bool = False  # the same body, the same answer, whatever its temperature
    stateful: bool = False  # an answer may rest on state kept at the provider
    resumable: bool = False  # its stream can be made resumable (docs/streams.md)
    # A stream cut after it started may be continued on another upstream (docs/streams.md):
    # its answer is one message whose text the gateway can hand back as a partial turn, read
    # in its ``events``' dialect (app/upstream/continued_doors.py).
    continues: bool = False
    end: StreamEnd | None = None  # how its stream says it is complete
    events: str = CHUNKS
    shape: str | None = None  # its whole answer's shape, for a stored entry's conversions
    # Where its body holds the prompt a provider's prompt cache keeps (app/request/affinity.py):
    # CHAT_PROMPT (messages, system ones among them), MESSAGES_PROMPT (system, messages) or
    # RESPONSES_PROMPT (instructions, input); None: its calls have no prefix to keep warm.
    prompt: str | None = None
    operation: str | None = None  # gen_ai.operation.name (traces)
    api_type: str | None = None  # openai.api.type (traces), where it tells two apart

    def __repr__(self) -> str:
        return f"Route({self.name!r})"


_MODEL: Fields = (("model", (str,)),)
_MESSAGES: Fields = (*_MODEL, ("messages", (list,)))

CHAT = Route(
    "chat",
    "/v1/chat/completions",
    methods=("GET", "POST"),
    kinds=frozenset({OPENAI, ANTHROPIC, GEMINI}),
    translated=True,
    validated=True,
    required=_MESSAGES,
    generates=True,
    output_field="max_completion_tokens",
    injects_usage=True,
    cacheable=True,
    resumable=True,
    continues=True,
    end=DONE,
    shape=SHAPE_CHAT,
    prompt=CHAT_PROMPT,
    operation="chat",
    api_type="chat_completions",
)
COMPLETIONS = Route(
    "completions",
    "/v1/completions",
    validated=True,
    required=(*_MODEL, ("prompt", (str, list))),
    generates=True,
    output_field="max_tokens",
    choice_fields=("n", "best_of"),  # the legacy completions bill every one of best_of
    injects_usage=True,
    cacheable=True,
    resumable=True,
    end=DONE,
    shape=SHAPE_COMPLETION,
    operation="text_completion",
)
EMBEDDINGS = Route(
    "embeddings",
    "/v1/embeddings",
    validated=True,
    required=(*_MODEL, ("input", (str, list))),
    cacheable=True,
    deterministic=True,
    shape=SHAPE_EMBEDDING,
    operation="embeddings",
)
RESPONSES = Route(
    "responses",
    "/v1/responses",
    methods=("GET", "POST"),
    validated=True,
    required=_MODEL,
    generates=True,
    output_field="max_output_tokens",
    cacheable=True,
    stateful=True,
    resumable=True,
    end=TERMINAL,
    events=TYPED,
    shape=SHAPE_RESPONSE,
    prompt=RESPONSES_PROMPT,
    operation="chat",
    api_type="responses",
)
MESSAGES = Route(
    "messages",
    "/v1/messages",
    door=ANTHROPIC,
    kinds=frozenset({OPENAI, ANTHROPIC, GEMINI}),
    translated=True,
    validated=True,
    required=_MESSAGES,
    generates=True,
    output_field="max_tokens",
    cacheable=True,
    resumable=True,
    continues=True,
    end=MESSAGE_STOP,
    events=NAMED,
    shape=SHAPE_MESSAGE,
    prompt=MESSAGES_PROMPT,
    operation="chat",
)
COUNT_TOKENS = Route(
    "count_tokens",
    "/v1/messages/count_tokens",
    door=ANTHROPIC,
    kinds=frozenset({ANTHROPIC}),  # Anthropic's own: no other kind counts its tokens
    validated=True,
    required=_MESSAGES,
)
PASSTHROUGH = Route("passthrough", forwarded=True)
# GET or DELETE /v1/streams/{id}: a resumable stream read again (docs/streams.md), never
# forwarded; its events are the resumed route's (app/resume/service.py).
RESUME = Route("resume")

ROUTES = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, COUNT_TOKENS, PASSTHROUGH, RESUME)
BY_NAME = {route.name: route for route in ROUTES}
BY_PATH = {route.path: route for route in ROUTES if route.path is not None}
API = tuple(BY_PATH.values())  # the routes with a path of their own


def of_name(name: str) -> Route:
    """The route named ``name`` (a resumable stream's log keeps its route by name)."""
    return BY_NAME[name]


def door_of(path: str) -> str:
    """The door a request to ``path`` came in by, for an answer made before its route is
    known (a 404 or 405 under /v1/messages is Anthropic's)."""
    found = BY_PATH.get(path)
    if found is not None:
        return found.door
    return ANTHROPIC if path.startswith("/v1/messages/") else OPENAI


def serving(kind: str) -> Iterator[Route]:
    """The routes an upstream of ``kind`` serves."""
    return (route for route in ROUTES if kind in route.kinds)
