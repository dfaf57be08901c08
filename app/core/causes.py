"""Why an upstream call failed, as the metrics say it: a few bounded words, one for each kind
of failure of the error tree (app/core/errors.py). No I/O here."""

from __future__ import annotations

from app.core.errors import (
    ClientTooSlow,
    GatewayError,
    UpstreamEventTooLarge,
    UpstreamProtocolError,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTLSError,
    UpstreamUnreachable,
)

# The bounded values of the metrics' `cause` label.
ERROR_CAUSES = (
    "connect",
    "timeout_connect",
    "timeout_first_byte",
    "timeout_idle",
    "timeout_deadline",
    "rate_limited",
    "auth",
    "server",
    "reset",
    "protocol",
    "client_closed",
)


def error_cause(exc: GatewayError) -> str:
    """The metrics cause of a failed upstream call (bounded label values)."""
    if isinstance(exc, UpstreamTimeout):
        return f"timeout_{exc.phase}"
    if isinstance(exc, (UpstreamUnreachable, UpstreamTLSError)):
        return "connect"
    if isinstance(exc, UpstreamReset):
        return "reset"
    if isinstance(exc, (UpstreamProtocolError, UpstreamEventTooLarge)):
        return "protocol"
    if isinstance(exc, ClientTooSlow):
        return "client_closed"
    return "server"


def status_cause(status: int) -> str | None:
    """The metrics cause of an upstream error answer, None for a success."""
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status >= 500:
        return "server"
    return None
