"""The end of every API call: request ids, Server-Timing, metrics and one JSON log line.

``finish()`` decorates the reply's headers (still unsent) and, for a streamed body, wraps it
so the figures are taken when the last byte has left: time to first token, tokens per
second, the caller leaving (what each batch shows: app/edge/stream_facts.py). Usage, cached
prompt tokens and the service tier the answer was billed in come from the answer itself:
the usage chunk, the ``response.completed`` event, or the body (app/request/usage.py reads
the usage). The log line never holds a credential; the request body only when
LLMGATE_LOG_PROMPTS is on. With tracing on, the request's span (app/observe/tracing.py)
ends here too, with the answer's GenAI attributes and the stream's span.

Server-Timing (LLMGATE_SERVER_TIMING): the stages the call's trace was told
(app/request/stages.py) are read once, when the headers are made; they go to the header, the
log line, ``llmgate_added_seconds`` and the span. A stream's relay time is measured as its
batches leave and said in a last SSE comment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeGuard

from app.core.config import Settings
from app.edge.stream_facts import StreamFacts
from app.observe import access_log, tracing
from app.observe.metrics import Metrics
from app.observe.metrics_prompt_cache import KINDS
from app.observe.tracing import Span
from app.request import events as streams
from app.request.call import Call, Reply
from app.request.events import StreamEnd
from app.request.headers import STATUS_HEADER
from app.request.routes import NAMED, TYPED
from app.request.stages import RELAY, RELAY_MAX, UPSTREAM, RelayTimes, header
from app.request.usage import PromptParts, answer_facts
from app.tenancy.prices import PriceTable, usd
from llmgate_wire import sse

# Outcomes whose answer came from this caller's own upstream call (billed to it).
_UPSTREAM_OUTCOMES = frozenset({"miss", "bypass", "refresh"})


def cache_outcome(reply: Reply) -> str:
    """The bounded label for where the reply's answer came from (``Reply.cache``)."""
    kind, _, level = (reply.cache or "BYPASS").partition("; level=")
    return f"hit_{level}" if kind == "HIT" else kind.lower()


def finish(
    call: Call,
    reply: Reply,
    settings: Settings,
    metrics: Metrics,
    prices: PriceTable | None = None,
) -> tuple[Reply, bytes | Iterator[bytes]]:
    """The reply with its last headers, and the body to send: a stream's batches joined,
    one write each, every event observed on its way out (counted and logged at the end)."""
    trace = call.trace
    trace.headed(reply.headers)
    if reply.cache is not None:
        reply.headers.append((STATUS_HEADER, reply.cache))
    reply.headers.append(("X-LLMGate-Request-ID", trace.request_id))
    if trace.upstream_request_id is None:
        reply.headers.append(("X-Request-ID", trace.request_id))
    figures = None
    if settings.server_timing:
        figures = trace.stages.figures(time.monotonic() - trace.started)
        reply.headers.append(("Server-Timing", header(figures)))
    if trace.limit_headers:
        reply.headers = with_key_limits(reply.headers, trace.limit_headers)
    record = partial(_record, settings=settings, metrics=metrics, prices=prices, stages=figures)
    if isinstance(reply.body, bytes):
        record(call, reply, StreamFacts(sent=len(reply.body)))
        return reply, reply.body
    # The stream may last minutes: its log line keeps the request body only to log it.
    held = call if settings.log_prompts else call.edited(body=b"")
    facts = StreamFacts(relay=RelayTimes() if figures is not None else None)
    return reply, _watched(held, reply, reply.body, metrics, record, facts)


def with_key_limits(
    headers: list[tuple[str, str]], own: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """A gateway key's ``x-ratelimit-{limit,remaining,reset}-{what}`` trio in place of the
    upstream's for each ``what`` (requests, tokens) the key limits; the upstream's headers
    of what it does not limit pass as they came (docs/security.md)."""
    limited = {name.split("-", 3)[3] for name, _ in own}
    kept = []
    for name, value in headers:
        lowered = name.lower()  # once a header: every keyed answer passes here
        if not (lowered.startswith("x-ratelimit-") and lowered.split("-", 3)[-1] in limited):
            kept.append((name, value))
    return kept + own


def _watched(
    call: Call,
    reply: Reply,
    batches: Iterator[list[bytes]],
    metrics: Metrics,
    record: Callable[[Call, Reply, StreamFacts], None],
    facts: StreamFacts,
) -> Iterator[bytes]:
    typed, messages = call.route.events == TYPED, call.route.events == NAMED
    metrics.active_streams.inc()
    # A resumable stream's events start with their id line (docs/streams.md): read past it.
    resumable = reply.stream_id is not None
    # A chat or completions stream's usual batch is observed in one call (``batch``).
    plain = not (typed or messages or resumable)
    relay, end = facts.relay, call.route.end
    # Its end looked for in each batch's last event: a chat stream's [DONE] without a call
    # (``_is_end``'s answer for it; an event with an id line of the upstream's is its to read).
    done_ends = plain and end is streams.DONE
    try:
        for batch in batches:
            pings = facts.batch(batch) if plain else facts.each(batch, typed, messages, resumable)
            if pings:
                metrics.heartbeats.inc(pings)
            if not batch:
                continue  # never an empty write: an empty chunk would end the HTTP response
            last = batch[-1]
            if relay is not None and (
                last.startswith(b"data: [DONE]") or (last.startswith(b"id:") and _is_end(end, last))
                if done_ends
                else _is_end(end, last)
            ):
                # The stream's relay time, a comment line (clients skip it) at the head of its
                # end event's block: a client that stops reading at its end leaves nothing
                # unread (llmgate_client drops a connection that has bytes after [DONE]).
                said, relay = relay.comment(), None
                facts.sent += len(said)
                yield b"".join([*batch[:-1], said, batch[-1]])
                continue
            yield batch[0] if len(batch) == 1 else b"".join(batch)
        if relay is not None:
            # No end event (an error event or a cut ended it, or a forwarded path's stream
            # has none): after its last bytes, a block of its own.
            said = relay.comment() + b"\n"
            facts.sent += len(said)
            yield said
    except GeneratorExit:
        call.trace.caller_left()
        raise
    finally:
        # The relay ends first (its listener leaves: a stream nobody else reads stops its
        # upstream call), so the key's stream slot is freed once the upstream is done.
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        metrics.active_streams.dec()
        record(call, reply, facts)


def _is_end(end: StreamEnd | None, chunk: bytes) -> bool:
    """Whether ``chunk`` is the end event of its route's stream (app/request/events.py),
    past its id line if it has one (a resumable stream's, or a resume's): looked at once a
    batch, on its last event, only with Server-Timing on. A route that does not say its
    end (a forwarded path, a resume's ``GET``) takes any of the three."""
    if chunk.startswith(b"id:"):
        chunk = sse.split_id(chunk)[1]
    done = chunk.startswith(b"data: [DONE]")
    if end is streams.DONE:
        return done
    stop = chunk.startswith(b"event: message_stop")
    if end is streams.MESSAGE_STOP:
        return stop
    if end is not None and end is not streams.TERMINAL:
        return False
    return (end is None and (done or stop)) or streams.event_type(chunk) in streams.TERMINAL_TYPES


def _record(
    call: Call,
    reply: Reply,
    facts: StreamFacts,
    *,
    settings: Settings,
    metrics: Metrics,
    prices: PriceTable | None,
    stages: list[tuple[str, float]] | None,
) -> None:
    """The call's end: its key settled, its metrics counted, its log line, its span ended
    (``stages``: the Server-Timing figures its headers gave, None when it is off)."""
    trace = call.trace
    duration = time.monotonic() - trace.started
    outcome = cache_outcome(reply)
    ttft = None if facts.first is None else facts.first - trace.started
    facts.ended()
    _find_usage(call, reply, facts)
    usage = facts.usage.tokens() if facts.usage is not None else (None, None, None)
    # What the provider billed this caller for: a replay or a follower billed none. Its
    # usage counts only from a whole answer that the upstream counted itself: a stream cut
    # or left early shows part of it (a Messages stream shows the prompt from its first
    # event), an estimate none of it; the key keeps the call's reservation then.
    billed = reply.status < 400 and outcome in _UPSTREAM_OUTCOMES
    whole = isinstance(reply.body, bytes) or trace.completed
    bill = facts.usage if whole and not trace.usage_estimated else None
    trace.settle(bill, billed)
    price = prices.price_of(trace.model) if prices is not None else None
    cost = price.cost(bill) if price is not None and billed and bill else None
    timing = _timing(stages, facts.relay)
    if timing:
        for stage, seconds in timing.items():
            if stage != UPSTREAM:  # the upstream's own: llmgate_upstream_ttft_seconds
                metrics.added.labels(call.route.name, stage).observe(seconds)
    _count(metrics, call, reply, facts, outcome, duration, ttft, usage)
    if settings.log_requests:
        line = _line(call, reply, facts, outcome, duration, ttft, usage)
        if timing:
            line["timing_ms"] = {stage: round(s * 1000, 2) for stage, s in timing.items()}
        # The receipt: the provider's usage as it sent it, its price and the table's version,
        # to be matched with the provider's invoice by upstream_request_id.
        line["usage"] = bill.sent if billed and bill is not None else None
        line["cost_usd"] = None if cost is None else usd(cost)
        line["prices_version"] = None if prices is None else prices.version
        if settings.log_prompts:
            line["request_body"] = call.body.decode("utf-8", errors="replace")
        access_log.write(access_log.encode(line))
    if trace.span is not None:
        if timing:
            trace.span.set({f"llmgate.time.{k}_ms": round(s * 1000, 3) for k, s in timing.items()})
        _end_span(trace.span, call, reply, facts, outcome, ttft, usage)


def _timing(
    stages: list[tuple[str, float]] | None, relay: RelayTimes | None
) -> dict[str, float] | None:
    """The call's figures by stage, with a stream's relay time (its median and longest
    per event) when it relayed any; None with Server-Timing off."""
    if stages is None:
        return None
    found = dict(stages)
    if relay is not None and relay.events:
        found[RELAY], found[RELAY_MAX] = relay.median, relay.longest
    return found


def _find_usage(call: Call, reply: Reply, facts: StreamFacts) -> None:
    """The answer's usage: a stream's usage chunk (or the one taken out of the caller's
    stream), else a whole answer's own."""
    facts.usage = facts.usage or call.trace.usage
    if facts.usage is None and isinstance(reply.body, bytes) and reply.status < 300:
        # A stored answer's were read once, when it was first replayed (app/cache/replay.py).
        known = reply.facts if reply.facts is not None else answer_facts(reply.body, call.route)
        facts.usage, facts.service_tier = known


def _count(
    metrics: Metrics,
    call: Call,
    reply: Reply,
    facts: StreamFacts,
    outcome: str,
    duration: float,
    ttft: float | None,
    usage: tuple[Any, Any, Any],
) -> None:
    trace, route = call.trace, call.route.name
    streamed = not isinstance(reply.body, bytes)
    metrics.duration.labels(route, "true" if streamed else "false").observe(duration)
    if not call.route.forwarded:
        metrics.cache_requests.labels(outcome).inc()
    if ttft is not None:
        metrics.ttft.labels(route).observe(ttft)
    if facts.first is not None and facts.last is not None and facts.events > 1:
        span = facts.last - facts.first
        if span > 0:
            metrics.tokens_per_second.labels(route).observe((facts.events - 1) / span)
    if trace.client_closed:
        metrics.upstream_errors.labels("client_closed").inc()
    if trace.key is not None:
        metrics.key_requests.labels(trace.key, str(reply.status)).inc()
    if outcome in _UPSTREAM_OUTCOMES:
        # Tokens the provider billed for this call; a replay or a follower billed none.
        # As the provider sent them, which may be anything: a counter takes only counts.
        tokens_in, _, tokens_cached = usage
        if _is_count(tokens_in):
            metrics.prompt_tokens.labels(route).inc(tokens_in)
        if _is_count(tokens_cached):
            metrics.prompt_cached_tokens.labels(route).inc(tokens_cached)
        if trace.upstream is not None and facts.usage:
            _count_prompt_cache(metrics, trace.upstream, facts.usage.prompt_parts())
    # Counted last: a scrape (from any worker) that sees the request counted sees every
    # other figure of it too.
    metrics.requests.labels(route, str(reply.status), outcome).inc()


def _count_prompt_cache(metrics: Metrics, upstream: str, parts: PromptParts) -> None:
    """What the upstream's prompt cache did with the call's prompt tokens, each once."""
    for kind, count in zip(KINDS, (parts.read, parts.written, parts.uncached), strict=True):
        if count:
            metrics.prompt_cache_tokens.labels(upstream, kind).inc(count)


def _line(
    call: Call,
    reply: Reply,
    facts: StreamFacts,
    outcome: str,
    duration: float,
    ttft: float | None,
    usage: tuple[Any, Any, Any],
) -> dict[str, Any]:
    """The call's JSON log line, but for its receipt."""
    trace = call.trace
    tokens_in, tokens_out, tokens_cached = usage
    return {
        "ts": round(time.time(), 3),
        "request_id": trace.request_id,
        "upstream_request_id": trace.upstream_request_id,
        "route": call.route.name,
        "method": call.method,
        "path": call.path,
        "model": trace.model,
        "stream": trace.stream,
        "status": reply.status,
        "cache": outcome,
        "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
        "duration_ms": round(duration * 1000, 1),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_cached": tokens_cached,
        "service_tier": facts.service_tier,
        "attempts": trace.attempts,
        "upstream": trace.upstream,
        "routing": None if trace.routing is None else trace.routing.fields(),
        "bytes_out": facts.sent,
        "client_closed": trace.client_closed,
        "stream_error": trace.stream_error,
        "continuations": trace.continuations or None,
        "key": trace.key,
    }


def _end_span(
    span: Span,
    call: Call,
    reply: Reply,
    facts: StreamFacts,
    outcome: str,
    ttft: float | None,
    usage: tuple[Any, Any, Any],
) -> None:
    """The request's span gets the answer's attributes and, for a stream, a child span from
    its first byte to its last with the first token as an event; then it ends."""
    span.set(
        tracing.answer_attributes(
            status=reply.status,
            outcome=outcome,
            usage=usage,
            response_model=_response_model(reply, facts),
            service_tier=facts.service_tier,
            ttft_s=ttft,
            attempts=call.trace.attempts,
            client_closed=call.trace.client_closed,
        )
    )
    if not isinstance(reply.body, bytes):
        stream = span.child(
            "stream",
            start=facts.begun,
            attributes={"llmgate.stream.output_events": facts.events, "llmgate.bytes": facts.sent},
        )
        if facts.first is not None and ttft is not None:
            attributes = {"gen_ai.response.time_to_first_chunk": round(ttft, 6)}
            stream.event("first_token", attributes, at=facts.first)
        stream.end(error="client_closed" if call.trace.client_closed else call.trace.stream_error)
    span.end(error=tracing.status_error(reply.status) or call.trace.stream_error)


def _response_model(reply: Reply, facts: StreamFacts) -> str | None:
    """The model that answered, as the answer names it (tracing only: it parses a little)."""
    if facts.model is not None:
        return facts.model
    data: Any = None
    if facts.first_chunk:
        data = streams.data_of(facts.first_chunk)
    elif isinstance(reply.body, bytes) and reply.status < 300:
        try:
            # The answer in one call of the C decoder: the document jsonedit.members reads
            # member by member in Python (UTF-8 only, one BOM skipped), whose last "model"
            # is the one json.loads keeps. A UnicodeDecodeError is a ValueError too.
            data = json.loads(reply.body.decode("utf-8").removeprefix("\ufeff"))
        except ValueError:
            return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
