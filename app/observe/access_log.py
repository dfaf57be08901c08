"""The request log's line: one JSON line per call (app/edge/finish.py), on the logger
``llmgate.access``.

``encode`` writes the line with orjson, in a tenth of the time json's encoder takes (0.5
against 5 us for the usual line of 25 fields, measured in bench/HISTORY.md, "The request
log's line"). The line is the same JSON value either way, in ASCII, as before: json escapes
every character past ASCII, and orjson writes it as it is (UTF-8), so a line whose orjson text
is not ASCII, or that orjson refuses (an integer past 64 bits, a lone surrogate), is written
by json. The text may differ where the value does not: orjson writes 0.00001 where json
writes 1e-05, and DEL unescaped. A float that is not a number, which JSON has no word for,
is ``null`` (json writes ``NaN``, which JSON parsers refuse).

The app factory gives the ``llmgate`` logger one handler of its own, writing each record's bare
message to stderr (app/factory.py ``_log_to_stderr``). Sent through ``logging``, a line costs a
``LogRecord`` (the caller's frame looked up, the thread and process named, the time taken) and
two locks (gevent's, under its patch) before that handler writes the message: about 6 us a
call, half of the line's whole cost with the JSON (bench/HISTORY.md, "The request log's
line"). When a record of ``llmgate.access`` at INFO would reach that handler and nothing else,
and come out as its bare message, ``write`` writes the same text to the same stream itself.
Any other configuration (a handler, a filter or a level of someone else's, a formatter of its
own, ``logging.disable``, a test's ``caplog``) is asked each time, and the line goes through
``logging`` as before.

The handler's lock guards its stream against other threads. A worker writes request lines
only from its gevent loop, where a write to stderr does not yield; its one real thread
(app/observe/outbox.py) logs on its own logger.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TextIO

import orjson

ACCESS = logging.getLogger("llmgate.access")
BARE = "%(message)s"  # the factory's handler's format: the line as it was given
# json's encoder, built once (json.dumps builds one for each call given an option).
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode(line: dict[str, Any]) -> str:
    """``line`` as compact JSON in ASCII: orjson's text, or json's where orjson's is not ASCII
    or orjson refuses the line."""
    try:
        text = orjson.dumps(line)
    except TypeError:  # an integer past 64 bits, a lone surrogate, a key not a string
        return _JSON.encode(line)
    if not text.isascii():
        return _JSON.encode(line)
    return text.decode("ascii")


def write(line: str) -> None:
    """Log ``line`` at INFO on ``llmgate.access``: directly when only the factory's handler
    would write it, else through ``logging``."""
    stream = _bare_stream()
    if stream is None:
        ACCESS.info(line)
        return
    try:
        stream.write(line + "\n")
        stream.flush()
    except Exception:
        # As the handler would: a line it cannot write never fails the call (logging reports
        # such an error on stderr, which here is the stream that failed).
        pass


def _bare_stream() -> TextIO | None:
    """The stream of the factory's handler, when a record of ``llmgate.access`` at INFO goes
    to it alone and comes out as its bare message; else None."""
    log = ACCESS
    if log.handlers or log.filters or not log.propagate or not log.isEnabledFor(logging.INFO):
        return None  # isEnabledFor: every level on the way, and logging.disable
    owner = log.parent
    if owner is None or owner.name != "llmgate" or owner.filters or owner.propagate:
        return None
    if len(owner.handlers) != 1:
        return None
    handler = owner.handlers[0]
    if not getattr(handler, "llmgate", False) or handler.filters or handler.level > logging.INFO:
        return None
    formatter = handler.formatter
    if type(handler) is not logging.StreamHandler or formatter is None:
        return None
    if type(formatter) is not logging.Formatter or formatter._fmt != BARE:
        return None
    return handler.stream
