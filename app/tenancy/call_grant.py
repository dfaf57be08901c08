"""A gateway key's grant as the rest of one call sees it: the body it forwards, and its
settlement at the end of the call. No I/O here (the settlement's counters are Access's).

The grant can change what goes upstream, one member of the body each, every other byte kept
(app/request/metering.py): a key's ``max_tokens`` is sent to a call that names no output
bound, and a stream on a route with a usage chunk asks for it, so the key's tokens are counted
from the provider's own figures; the chunk is taken out again for a caller who did not ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.request import schema
from app.request.call import Trace
from app.request.metering import with_output_cap, with_usage_requested
from app.request.routes import Route
from app.request.usage import Usage
from app.tenancy.access import Access, Grant
from app.tenancy.reserve_again import reserve_again


@dataclass(frozen=True)
class KeySettlement:
    """A key's grant, settled by its ``Access`` when the call ends (the call's Trace, whose
    facts its receipt in the spend ledger holds)."""

    access: Access
    grant: Grant
    trace: Trace | None = None

    @property
    def headers(self) -> list[tuple[str, str]]:
        return self.grant.headers

    def settle(self, usage: Usage | None, billed: bool, served: bool) -> None:
        self.access.settle(self.grant, usage, billed, served=served, trace=self.trace)

    def reserve_again(self) -> bool:
        return reserve_again(self.access, self.grant)


def granted_body(
    grant: Grant, forward: bytes, body: dict[str, Any] | None, route: Route, stream: bool
) -> tuple[bytes, bool]:
    """(the bytes to forward under the grant, whether the caller's stream must lose the
    usage chunk the gateway asked for)."""
    if body is None:
        return forward, False
    hide_usage = False
    if grant.output_cap is not None:
        # The key's max_tokens holds for a call that names none: it is sent one.
        forward = with_output_cap(forward, body, route, grant.output_cap)
    if stream and route.injects_usage:
        # Asked for here, taken out again for a caller who did not ask (app/streams/reply.py).
        forward = with_usage_requested(forward, body)
        hide_usage = not schema.wants_usage(body)
    return forward, hide_usage
