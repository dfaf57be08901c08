"""Per-request simulator controls. No I/O here: headers and a model name in, a Behaviour out.

A control comes from an ``x-sim-<name>: <value>`` header or from a model named
``sim/<name>=<value>,<name>=<value>``; when both name the same control the header wins, so a
test can override what a model name says. Header names may spell ``_`` as ``-``
(``x-sim-ttft-ms``) because nginx drops header names containing underscores unless
``underscores_in_headers on`` is set. An unknown control or a bad value is a
``BehaviourError``: a typo in a test should fail loudly, not silently run the happy path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from .scripts import NAMES as SCRIPT_NAMES

HEADER_PREFIX = "x-sim-"
MODEL_PREFIX = "sim/"

# "redirect": a 307 to another host, as a proxy or a moved endpoint would answer. "529":
# Anthropic's "overloaded" (the dialects that have no 529 answer their overloaded 503).
ERROR_FAULTS = frozenset({"429", "500", "503", "529", "401", "redirect"})
FAULTS = ERROR_FAULTS | {
    "reset",
    "reset-before",  # reset as soon as the request is read: no status line, stream or not
    "stall-before",
    "stall-after",
    "slow-headers",
    "gzip",
    "close-delimited",
    "error-after",  # an API error part-way through a stream (a 500 for a non-stream call)
    "end-after",  # a stream's body ends cleanly after reset_after tokens, without its end
    "malformed-after",  # a stream's event at slot error_after is cut short: not JSON
}


class BehaviourError(ValueError):
    """A control that cannot be honoured; ``param`` names where it came from."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Behaviour:
    """How one request is answered. Times are milliseconds, except ``retry_after`` (s)."""

    ttft_ms: float = 20.0
    tps: float = 100.0
    tokens: int | None = None
    fault: str | None = None
    retry_after: float = 1.0
    reset_after: int = 2
    stall_ms: float = 3_600_000.0
    stall_after: int = 2
    header_delay_ms: float = 1000.0
    fail_times: int | None = None
    fail_key: str = "default"
    error_after: int = 2
    cached_tokens: int | None = None  # usage's cached prompt tokens (shown only when set)
    tool_call: bool = False  # Responses: call the request's first function tool
    script: str | None = None  # a scripted answer (scripts.py) instead of generated words
    ping_ms: float | None = None  # Anthropic: a ping event every ping_ms while a stream waits
    # OpenAI chat: "final" (usage where OpenAI puts it), "none" (no usage at all, as servers
    # that ignore include_usage), "every" (a running usage on every chunk, as some do).
    usage: str = "final"
    # The provider's prompt cache (prompt_cache.py): on or off; the prefill time of each
    # uncached prompt token (microseconds; a cached one costs CACHED_SHARE of it); the least
    # prompt it stores (words) and its lifetime.
    prompt_cache: bool = False
    prefill_us: float = 0.0
    cache_min_tokens: int = 1024
    cache_ttl_s: float = 300.0
    # What the cache did, once it ran (app.py): reported in the usage, not controls.
    cache_written: int = 0
    cache_written_1h: int = 0

    @property
    def token_gap(self) -> float:
        """Seconds between two content events."""
        return 1.0 / self.tps


def _number(name: str, raw: str, *, positive: bool = False) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise BehaviourError(f"simulator control {name}={raw!r} is not a number", name) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise BehaviourError(f"simulator control {name}={raw!r} must be {bound}", name)
    return value


def _non_negative(name: str, raw: str) -> float:
    return _number(name, raw)


def _rate(name: str, raw: str) -> float:
    return _number(name, raw, positive=True)


def _count(name: str, raw: str) -> int:
    if not raw.strip().isdigit():
        raise BehaviourError(f"simulator control {name}={raw!r} must be a whole number", name)
    return int(raw)


def _fault(name: str, raw: str) -> str | None:
    value = raw.strip().lower()
    if value in ("", "none"):
        return None  # lets a header switch off a fault that the model name asks for
    if value not in FAULTS:
        known = ", ".join(sorted(FAULTS))
        raise BehaviourError(f"unknown simulator fault {raw!r}; known: {known}", name)
    return value


def _text(name: str, raw: str) -> str:
    return raw.strip()


def _script(name: str, raw: str) -> str | None:
    value = raw.strip().lower()
    if value in ("", "none"):
        return None
    if value not in SCRIPT_NAMES:
        known = ", ".join(SCRIPT_NAMES)
        raise BehaviourError(f"unknown simulator script {raw!r}; known: {known}", name)
    return value


USAGE_MODES = ("final", "none", "every")


def _usage(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in USAGE_MODES:
        known = ", ".join(USAGE_MODES)
        raise BehaviourError(f"unknown simulator usage {raw!r}; known: {known}", name)
    return value


def _switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("0", "1", "true", "false"):
        raise BehaviourError(f"simulator control {name}={raw!r} must be 0, 1, true or false", name)
    return value in ("1", "true")


_PARSERS: dict[str, Callable[[str, str], object]] = {
    "ttft_ms": _non_negative,
    "tps": _rate,
    "tokens": _count,
    "fault": _fault,
    "retry_after": _non_negative,
    "reset_after": _count,
    "stall_ms": _non_negative,
    "stall_after": _count,
    "header_delay_ms": _non_negative,
    "fail_times": _count,
    "fail_key": _text,
    "error_after": _count,
    "cached_tokens": _count,
    "tool_call": _switch,
    "script": _script,
    "ping_ms": _rate,
    "usage": _usage,
    "prompt_cache": _switch,
    "prefill_us": _non_negative,
    "cache_min_tokens": _count,
    "cache_ttl_s": _rate,
}
CONTROLS = tuple(_PARSERS)


def model_controls(model: str | None) -> dict[str, str]:
    """Controls written into a model name ``sim/<name>=<value>,...``; {} for other models."""
    if not model or not model.startswith(MODEL_PREFIX):
        return {}
    controls: dict[str, str] = {}
    for item in model[len(MODEL_PREFIX) :].split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise BehaviourError(f"model control {item!r} is not name=value", "model")
        controls[name.strip().replace("-", "_")] = value.strip()
    return controls


def header_controls(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Controls sent as ``x-sim-<name>`` headers (names already lowercased)."""
    return {
        name[len(HEADER_PREFIX) :].replace("-", "_"): value
        for name, value in headers
        if name.startswith(HEADER_PREFIX)
    }


def resolve(
    headers: Iterable[tuple[str, str]], model: str | None, defaults: Behaviour
) -> Behaviour:
    """The behaviour for one request: defaults, then model controls, then header controls."""
    controls = model_controls(model)
    controls.update(header_controls(headers))
    values: dict[str, object] = {}
    for name, raw in controls.items():
        parse = _PARSERS.get(name)
        if parse is None:
            known = ", ".join(CONTROLS)
            raise BehaviourError(f"unknown simulator control {name!r}; known: {known}", name)
        values[name] = parse(name, raw)
    return replace(defaults, **values) if values else defaults  # type: ignore[arg-type]
