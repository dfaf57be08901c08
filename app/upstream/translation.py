"""Speaking to an upstream in its own dialect: the request translated as it leaves, the answer
translated as it is read, so that everything above the transport sees an OpenAI answer (or,
on the Anthropic door, an Anthropic one).

The rule: one attempt, one translation, chosen by the upstream's ``kind`` and the caller's
door (``route``: chat speaks OpenAI's dialect, messages Anthropic's); none when they are the
same dialect, and then not one byte differs. The pure translations are app/dialects/'s; here
they meet the wire: ``Translation.request`` gives the path, query, headers and body to send,
``Translation.answer`` wraps the upstream's response in a ``Translated`` one whose status and
headers are already the caller's dialect's and whose ``read1`` returns translated bytes as
soon as the provider's events complete (a stream is never held back: app/dialects/__init__.py).
A whole answer (not a stream, or an error) is read to its end first, at most ``limit`` bytes.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3

from app.core.errors import UpstreamReset
from app.dialects import anthropic, anthropic_door, gemini
from app.dialects.chat import dumps
from app.dialects.continuation import OFF
from app.dialects.continuation_messages import partial_chat
from app.patches import chunked_reads
from app.request.affinity import Affinity
from app.request.events import malformed_chunk
from app.request.headers import AUTH_HEADERS, with_upstream_key
from app.request.routes import Route
from app.upstream import prompt_cache
from app.upstream.catalog import UpstreamSpec
from app.upstream.pools import READ_SIZE, Raw
from llmgate_wire import sse

ANTHROPIC_VERSION = "2023-06-01"
# Headers of the upstream's answer that describe bytes the caller does not get.
_BODY_HEADERS = ("content-length", "content-encoding", "transfer-encoding", "content-type")


class Translator(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def close(self) -> bytes: ...

    @property
    def usage_reported(self) -> bool:
        """Whether the usage the translation wrote (or will write) is the provider's own
        count, not an estimate nor none."""
        ...


@dataclass(frozen=True)
class Outgoing:
    """A request as the upstream's dialect wants it: below its base URL."""

    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    stream: bool
    model: str  # its name at the upstream
    include_usage: bool  # the caller's side asked for the usage chunk
    # The upstream continues streams (its ``continuation`` is set): an event of its stream
    # that is not JSON passes to the continuation, which takes it for a cut (``Garbled``).
    continues: bool = False


def translation_for(kind: str, route: Route) -> Translation | None:
    """The translation an attempt of ``route`` at an upstream of ``kind`` needs; None when
    the route is not translated (count_tokens and the rest of /v1/messages go to Anthropic
    upstreams only, as they are) or its door's dialect is the upstream's."""
    if not route.translated or route.door == kind:
        return None
    return Translation(kind, route.door)


@dataclass(frozen=True)
class Translation:
    kind: str  # the upstream's dialect
    door: str  # the caller's: "openai" (chat) or "anthropic" (messages)

    # -- the request ------------------------------------------------------------------------
    def request(
        self,
        spec: UpstreamSpec,
        body: bytes,
        headers: Mapping[str, str],
        affinity: Affinity | None = None,
        continuing: bool = False,
    ) -> Outgoing:
        """The caller's body and headers as ``spec`` wants them (its model name, its key's
        header spelling, its ``prompt_cache`` switch: app/upstream/prompt_cache.py, with the
        conversation's ``affinity``); Untranslatable (400) for a request its dialect cannot
        carry. ``continuing``: a continuation's (app/upstream/continuation.py), whose last
        turn, the answer so far, an OpenAI-kind server is told to continue."""
        doc = json.loads(body)
        model = spec.model_for(doc.get("model") or "")
        doc["model"] = model
        chat = anthropic_door.chat_body(doc) if self.door == "anthropic" else doc
        if continuing and self.door == "anthropic" and self.kind == "openai":
            chat = partial_chat(chat, spec.continuation)
        stream = chat.get("stream") is True
        options = chat.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        out = _respelt(headers, spec.auth)
        sent: Mapping[str, Any]
        if self.kind == "openai":
            path, query, sent = "/chat/completions", "", prompt_cache.keyed(spec, chat, affinity)
        elif self.kind == "anthropic":
            path, query = "/messages", ""
            sent = anthropic.request_body(chat, default_max_tokens=spec.max_tokens)
            sent = prompt_cache.marked(spec, sent)
            out.setdefault("anthropic-version", ANTHROPIC_VERSION)
        else:
            path, query = gemini.target(model, stream)
            sent = gemini.request_body(chat)
        out["Content-Type"] = "application/json"
        continues = spec.continuation != OFF
        return Outgoing(path, query, out, dumps(sent), stream, model, include_usage, continues)

    # -- the answer -------------------------------------------------------------------------
    def answer(
        self, raw: Raw, sent: Outgoing, *, limit: int, max_event: int, prompt_bytes: int
    ) -> Translated:
        """``raw`` in the caller's dialect: a whole body at most ``limit`` bytes, a provider's
        event at most ``max_event``; ``prompt_bytes`` makes the Anthropic door's first event's
        estimate of the prompt's tokens (corrected by its last)."""
        status = 503 if self.kind == "anthropic" and raw.status == 529 else raw.status
        ctype = raw.headers.get("content-type", "")
        created, rid = int(time.time()), uuid.uuid4().hex
        if status >= 300:
            headers = _headers(raw, status, "application/json")
            error = functools.partial(self._error, raw.status)
            return Translated(raw, status, headers, whole=error, limit=limit)
        if ctype.startswith("text/event-stream"):
            stream = self._stream(sent, created, rid, prompt_bytes, max_event)
            return Translated(raw, status, _headers(raw, status, ctype), stream=stream, limit=limit)
        headers = _headers(raw, status, "application/json")
        usage_member = "usageMetadata" if self.kind == "gemini" else "usage"
        whole = self._whole(created, rid)
        return Translated(raw, status, headers, whole=whole, limit=limit, usage=usage_member)

    def _stream(
        self, sent: Outgoing, created: int, rid: str, prompt_bytes: int, max_event: int
    ) -> Translator:
        """The stream's translator, from the upstream's events to the caller's."""
        usage = sent.include_usage
        chat: Translator | None = None
        if self.kind == "anthropic":
            translator = Garbled if sent.continues else anthropic.StreamToChat
            chat = translator(usage, created, max_event_bytes=max_event)
        elif self.kind == "gemini":
            read = GeminiGarbled if sent.continues else gemini.StreamToChat
            chat = read(include_usage=usage, created=created, fallback_id=rid)
        if self.door == "openai":
            assert chat is not None
            return chat
        to_door = GarbledDoor if sent.continues else anthropic_door.ChatToStream
        door = to_door(
            message_id=f"msg_{rid}", model=sent.model, input_tokens=max(1, prompt_bytes // 4)
        )
        return door if chat is None else Chained(chat, door)

    def _whole(self, created: int, rid: str) -> Callable[[bytes], bytes]:
        def translate(body: bytes) -> bytes:
            if self.kind == "anthropic":
                body = anthropic.answer_to_chat(body, created=created)
            elif self.kind == "gemini":
                body = gemini.answer_to_chat(body, created=created, fallback_id=rid)
            if self.door == "anthropic":
                body = anthropic_door.chat_answer_to_message(body, message_id=f"msg_{rid}")
            return body

        return translate

    def _error(self, status: int, body: bytes) -> bytes:
        if self.kind == "anthropic":
            status, body = anthropic.error_to_chat(status, body)
        elif self.kind == "gemini":
            status, body = gemini.error_to_chat(status, body)
        if self.door == "anthropic":
            body = anthropic_door.error_from_chat(status, body)
        return body


class Garbled(anthropic.StreamToChat):
    """Anthropic's stream as chat chunks, but an event whose data is not a JSON object
    (garbled, cut short) passes as a chat event of the same data, where the translation
    would drop it: the continuation (app/upstream/continuation.py) takes it for a cut and
    continues the answer from before it, instead of the caller missing what it carried."""

    def _event(self, event: sse.Event) -> bytes:
        if event.data is not None and malformed_chunk(event.data):
            return _as_chat_event(event.data)
        return super()._event(event)


class GarbledDoor(anthropic_door.ChatToStream):
    """A chat stream as the Anthropic door's events (``ChatToStream``), but a chunk whose data
    is not a JSON object passes as an event of the same data, where the translation would
    drop it: as ``Garbled``, for the continuation to take it for a cut (a Gemini upstream's,
    passed on by ``GeminiGarbled``, too)."""

    def _translate(self, item: sse.Event) -> bytes:
        if item.data is not None and malformed_chunk(item.data):
            return _as_chat_event(item.data)
        return super()._translate(item)


class GeminiGarbled(gemini.StreamToChat):
    """Gemini's stream as chat chunks, its garbled events passed on as ``Garbled`` passes
    Anthropic's (the Gemini translation drops them too)."""

    def _event(self, event: sse.Event) -> list[bytes]:
        if event.data is not None and malformed_chunk(event.data):
            return [_as_chat_event(event.data)]
        return super()._event(event)


def _as_chat_event(data: str) -> bytes:
    return b"data: " + data.replace("\n", "\ndata: ").encode() + b"\n\n"


class Chained:
    """Two translators one after the other (Gemini to chat to Anthropic's door)."""

    def __init__(self, first: Translator, second: Translator) -> None:
        self.first, self.second = first, second

    @property
    def usage_reported(self) -> bool:
        """The provider's own usage came through both: the second writes what the first
        wrote, and the first wrote a usage chunk only of what the provider counted."""
        return self.first.usage_reported and self.second.usage_reported

    def feed(self, data: bytes) -> bytes:
        middle = self.first.feed(data)
        return self.second.feed(middle) if middle else b""

    def close(self) -> bytes:
        return self.second.feed(self.first.close()) + self.second.close()


class Translated:
    """An upstream's answer read through a translation (the ``Raw`` the rest of the package
    reads): the body's bytes come out of ``read1`` translated, and b"" only at its end."""

    def __init__(
        self,
        raw: Raw,
        status: int,
        headers: urllib3.HTTPHeaderDict,
        *,
        stream: Translator | None = None,
        whole: Callable[[bytes], bytes] | None = None,
        limit: int,
        usage: str | None = None,
    ) -> None:
        """``usage``: the member of a whole answer's body that holds the provider's usage
        (None: an error, whose usage nobody reads)."""
        self._raw = raw
        self._status = status
        self._headers = headers
        self._stream = stream
        self._whole = whole
        self._limit = limit
        self._usage_member = usage
        self._whole_usage: bool | None = None
        self._read: Callable[[int], bytes] | None = None
        self._done = False

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> urllib3.HTTPHeaderDict:
        return self._headers

    @property
    def closed(self) -> bool:
        return self._raw.closed

    @property
    def connection(self) -> object:
        """The connection the upstream's answer came on (pools.connect_seconds reads it)."""
        return getattr(self._raw, "connection", None)

    @property
    def usage_reported(self) -> bool | None:
        """Whether the usage the translation wrote is the upstream's own count (False: an
        estimate, the ``/v1/messages`` door's, or no usage at all): a stream's once read, a
        whole answer's once read (the provider's body had its ``usage`` member, or
        ``usageMetadata``); None for an error or before the end."""
        if self._stream is not None:
            return self._stream.usage_reported
        return self._whole_usage

    def read1(self, amt: int | None = None) -> bytes:
        """The next translated bytes: a stream's as soon as a provider event completes one
        (reading on while the provider's events translate to nothing), a whole answer's at
        once when the body has been read to its end."""
        if self._done:
            return b""
        if self._read is None:
            self._read = chunked_reads.body_reader(self._raw)
        if self._stream is not None:
            while chunk := self._read(READ_SIZE):
                try:
                    out = self._stream.feed(chunk)
                except sse.EventTooLarge as exc:
                    # A read that cannot be relayed, as reading.py treats its own decoder's.
                    raise UpstreamReset(
                        f"The upstream sent an event larger than {exc.limit} bytes "
                        "(LLMGATE_MAX_EVENT_BYTES)."
                    ) from None
                if out:
                    return out
            self._done = True
            return self._stream.close()
        parts, size = [], 0
        while chunk := self._read(READ_SIZE):
            size += len(chunk)
            if size > self._limit:
                raise UpstreamReset(f"Upstream response exceeds {self._limit} bytes.")
            parts.append(chunk)
        self._done = True
        assert self._whole is not None
        body = b"".join(parts)
        if self._usage_member is not None:
            self._whole_usage = _has_member(body, self._usage_member)
        return self._whole(body)

    def read(self) -> bytes:
        parts = []
        while chunk := self.read1():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self._raw.close()

    def release_conn(self) -> None:
        self._raw.release_conn()


def _has_member(body: bytes, name: str) -> bool:
    """Whether the JSON object ``body`` has an object member ``name``."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get(name), dict)


def _respelt(headers: Mapping[str, str], auth: str) -> dict[str, str]:
    """The caller's headers with its credential (when it brought one) in the header
    ``auth`` names; the upstream's own key, when configured, replaces it later
    (app/request/headers.py ``with_upstream_key``, which spells both)."""
    out = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "content-type")}
    given = [v for k, v in out.items() if k.lower() in AUTH_HEADERS]
    credential = given[-1].removeprefix("Bearer ").removeprefix("bearer ") if given else ""
    return with_upstream_key(out, credential, auth=auth) if credential else out


def _headers(raw: Raw, status: int, ctype: str) -> urllib3.HTTPHeaderDict:
    """The answer's headers as the caller's dialect has them: the body's own described anew,
    the provider's request id as ``x-request-id`` too, and for an error whether a retry may
    help (Anthropic's 529 is an overload: it may; a 4xx will not)."""
    headers = urllib3.HTTPHeaderDict()
    for name, value in raw.headers.items():
        if name.lower() not in _BODY_HEADERS:
            headers.add(name, value)
    headers["Content-Type"] = ctype
    request_id = raw.headers.get("request-id")
    if request_id and "x-request-id" not in headers:
        headers["x-request-id"] = request_id
    if status >= 400:
        retry = status in (408, 409, 429) or status >= 500
        headers["x-should-retry"] = "true" if retry else "false"
    return headers
