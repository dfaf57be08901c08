"""Host names of new connections, resolved without waiting behind a busy worker's loop.

The rule: a new connection's address costs no lookup when it is written as numbers, and one
lookup per name and ``ttl`` otherwise.

gevent resolves every address a socket connects to on a thread of its hub's pool (its
default ``thread`` resolver) and hands the answer back through the hub's loop, even an
address like ``127.0.0.1``: with hundreds of greenlets running, each new connection's lookup
waits for one of the pool's threads and then for the loop's next pass. A burst of new
upstream connections in a busy worker then spent seconds in the ``connect`` stage (600 at
once beside 50 busy greenlets: 4.3 s p50, 8.5 s at most; 3.6 ms p50 without the lookup:
docs/performance.md, "The public method"). So the worker's hub gets ``Names`` in front of
its resolver (``install``):

- an address written as numbers (``127.0.0.1``, ``::1``, a Kubernetes pod or service IP) is
  no lookup: the C library turns it into its address info at once, in the caller's
  greenlet, told by ``AI_NUMERICHOST`` never to look anything up;
- a name is looked up by the hub's own resolver, as before, and its answer kept for ``ttl``
  seconds (``LLMGATE_DNS_TTL_S``): connections to that name in that time take it without a
  lookup, and callers that ask while it is being looked up wait for that lookup, not one
  each. A failed lookup is not kept (the next caller asks again); ``ttl`` 0 keeps nothing.

Every Python socket of the worker resolves through it: the upstreams', Memcached's, the
trace collector's (the ledger's PostgreSQL client resolves in libpq, not here). The names
are the server config's, a handful; at most ``MAX_NAMES`` answers are kept, the oldest
dropped first. A lookup whose point is to see a change (Memcached's nodes found by DNS,
app/store/discovery.py) asks ``looked_up_now``, which never takes a kept answer.
"""

from __future__ import annotations

import _socket
import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent.event import AsyncResult

MAX_NAMES = 256
Key = tuple[Any, ...]


class Names:
    """A gevent resolver (the hub's ``resolver``) in front of another: numeric addresses
    at once, a name's answer kept ``ttl`` seconds. Every other question goes to ``inner``."""

    def __init__(self, inner: Any, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner, self._ttl, self._clock = inner, ttl, clock
        self._kept: dict[Key, tuple[float, list[Any]]] = {}
        self._asked: dict[Key, AsyncResult] = {}

    def getaddrinfo(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[Any]:
        if isinstance(host, str) and host:
            try:
                numeric = flags | _socket.AI_NUMERICHOST
                return _socket.getaddrinfo(host, port, family, type, proto, numeric)
            except _socket.gaierror:
                pass  # a name: looked up below
        if self._ttl <= 0 or not isinstance(host, str):
            return self._inner.getaddrinfo(host, port, family, type, proto, flags)
        key = (host, port, family, type, proto, flags)
        kept = self._kept.get(key)
        if kept is not None and kept[0] > self._clock():
            return kept[1]
        asked = self._asked.get(key)
        if asked is not None:
            found = asked.get()
            # None: the greenlet that looked it up was killed first; ask again.
            return found if found is not None else self.getaddrinfo(host, port, *key[2:])
        asked = self._asked[key] = AsyncResult()
        try:
            found = self._inner.getaddrinfo(host, port, family, type, proto, flags)
        except Exception as exc:
            asked.set_exception(exc)
            raise
        except BaseException:
            asked.set(None)
            raise
        else:
            self._keep(key, found)
            asked.set(found)
            return found
        finally:
            del self._asked[key]

    def _keep(self, key: Key, found: list[Any]) -> None:
        self._kept.pop(key, None)
        if len(self._kept) >= MAX_NAMES:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (self._clock() + self._ttl, found)

    def looked_up_now(self, host: str, port: int, type: int = 0, proto: int = 0) -> list[Any]:
        """The inner resolver's answer, never a kept one (nor kept)."""
        return self._inner.getaddrinfo(host, port, 0, type, proto, 0)

    def __getattr__(self, name: str) -> Any:
        # gethostbyname, getnameinfo, close and the rest: the inner resolver's.
        return getattr(self._inner, name)


def install(ttl: float) -> Names | None:
    """Put ``Names`` in front of this thread's hub resolver, when gevent patched the socket
    module (a gunicorn gevent worker); otherwise sockets do not ask the hub and nothing is
    done (None). Installing twice keeps one."""
    if not _patched():
        return None
    hub = gevent.get_hub()
    if isinstance(hub.resolver, Names):
        return hub.resolver
    names = Names(hub.resolver, ttl)
    hub.resolver = names
    return names


def looked_up_now(host: str, port: int, type: int = 0, proto: int = 0) -> list[Any]:
    """``socket.getaddrinfo`` asked afresh, past ``Names``' kept answers where it is
    installed: for a lookup made to see a change."""
    import socket

    resolver = gevent.get_hub().resolver if _patched() else None
    if isinstance(resolver, Names):
        return resolver.looked_up_now(host, port, type, proto)
    return socket.getaddrinfo(host, port, type=type, proto=proto)


def _patched() -> bool:
    from gevent import monkey

    return bool(monkey.is_module_patched("socket"))
