"""Why a connection or an answer failed, in words a caller and an operator can read.

urllib3 and http.client word their errors for a programmer: urllib3 puts the repr of its
connection or pool in front (``CountingHTTPConnection(host='127.0.0.1', port=9): Failed to
establish...``, where the class is one of app/upstream/pools.py's), and wraps the real cause in a
tuple (``('Connection aborted.', RemoteDisconnected('Remote end closed...'))``). The gateway
quotes the reason in its error message, so ``reason`` keeps what it says (the address, the
errno, the byte counts) and drops the class names. No I/O here, and no urllib3: its
exceptions are read by their attributes (``conn``, ``pool``, ``args``).
"""

from __future__ import annotations

import http.client
import re

# OpenSSL's source position at the end of its messages: "(_ssl.c:1006)".
_SSL_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)$")
# The words of a CamelCase class name.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# A repr of an exception inside a message: "IncompleteRead(3 bytes read, 7 more expected)".
_REPR = re.compile(r"\b[A-Z]\w+\((.*)\)")


def reason(exc: BaseException) -> str:
    """The failure in plain words: urllib3's ``CountingHTTPConnection(host='127.0.0.1',
    port=9): Failed to establish a new connection: [Errno 111] Connection refused`` reads
    ``127.0.0.1:9: Failed to establish a new connection: [Errno 111] Connection refused``."""
    if isinstance(exc, http.client.IncompleteRead):
        # http.client's holds the bytes read, urllib3's (a subclass) their count.
        read = exc.partial if isinstance(exc.partial, int) else len(exc.partial)
        expected = f", {exc.expected} more expected" if exc.expected is not None else ""
        return f"the body ended early ({read} bytes read{expected})"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the upstream closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):
        return "the upstream's answer does not begin with an HTTP status line"
    args = exc.args
    if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], BaseException):
        # urllib3's ProtocolError("Connection aborted.", cause): the cause says it all.
        return reason(args[1])
    message = str(exc)
    for name in ("conn", "pool"):  # urllib3 writes f"{conn}: {message}"
        owner = getattr(exc, name, None)
        if owner is not None and message.startswith(f"{owner}: "):
            message = message[len(f"{owner}: ") :]
            host, port = getattr(owner, "host", None), getattr(owner, "port", None)
            if host:
                message = f"{host}:{port}: {message}" if port else f"{host}: {message}"
            break
    message = _REPR.sub(r"\1", _SSL_SOURCE.sub("", message))
    # An exception without a message (pymemcache's MemcacheUnexpectedCloseError()) still
    # says what happened in its name: "memcache unexpected close".
    return message or " ".join(_WORD.findall(type(exc).__name__)).lower().removesuffix(" error")
