"""The pymemcache clients the Memcached backend (app/store/memcached.py) runs on: a connection
that never survives an interrupted command, and a hash ring that can pipeline.

- pymemcache cleans up a connection only on ``Exception``: ``Client`` closes its socket in
  ``except Exception`` (client/base.py ``_fetch_cmd``/``_store_cmd``/``_misc_cmd``) and the
  pool's ``get_and_release(destroy_on_fail=True)`` handles only ``Exception`` (pool.py).
  A ``gevent.Timeout`` or ``GreenletExit`` mid-reply leaves the unread reply on an open
  socket and the client stuck in the pool's "used" list forever (after ``max_pool_size`` such
  interruptions the node's pool refuses every call). ``GuardedClient`` closes its socket on
  any ``BaseException`` and marks itself poisoned; the backend then destroys it from its
  pool. It is never used again, so no caller can read another caller's reply.
- Node health is the backend's, not HashClient's: ``GuardedClient`` turns ``OSError`` and
  unexpected closes into ``NodeFailure``, which HashClient re-raises untouched with
  ``ignore_exc=False``, so its own dead-node machinery never engages.
- A restarted node leaves every pooled connection to its old process closed on its side
  (CLOSE-WAIT here): a command on one is written, then reads EOF or a reset. The failure
  says when the dropped connection was opened (``NodeFailure.dropped``), so the backend can
  tell it from a node that cannot be reached, and ``close_idle`` closes the node's other
  idle connections, opened before the same restart: pymemcache's pool hands its free ones
  out in turn (pool.py), and each would have failed once in its turn.
- A pipeline (the limit counters' ``incr``s, which must never run twice) first looks whether
  the node already closed its pooled connection: a peek that does not wait. One that it did
  is never written to: the failure says the batch was not sent (``NodeFailure.unsent``), so
  the backend sends it again on a new connection, where before it failed (and the first
  call of each worker after a restart passed its limits uncounted).
- pymemcache's ring (``RendezvousHash``) scores every node for every key with a pure-Python
  murmur3, about 10 us a node, and a command looks its key up twice (the backend's breaker
  and HashClient); a call's limit counters asked it a dozen times for the same few keys.
  ``RememberedRing`` keeps each key's node until a node joins or leaves.
- pymemcache sends one command and waits for its reply before the next. ``pipeline`` writes
  several commands at once and reads their replies after: the batch ends with the meta
  no-op ``mn`` (Memcached 1.6 and later), whose ``MN`` line marks the last reply, so the
  batch is one round trip however long it is. Its replies are read by ``round_trip``, not
  pymemcache's ``raw_command``, which loses what came before the last read of a long reply.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient
from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.exceptions import (
    MemcacheClientError,
    MemcacheError,
    MemcacheServerError,
    MemcacheUnexpectedCloseError,
    MemcacheUnknownError,
)

T = TypeVar("T")

_END = b"MN\r\n"  # the reply of the meta no-op that ends every pipeline
_RECV = 65536


# What a node's end of an established connection going away looks like from here: EOF
# (pymemcache's unexpected close), a reset, or a write after the reset.
_DROPPED = (MemcacheUnexpectedCloseError, ConnectionResetError, BrokenPipeError)


class NodeFailure(MemcacheError):
    """The node could not be reached or dropped the connection (not an OSError on purpose).
    ``dropped``: when the connection was opened, if the node dropped one opened by an earlier
    command (a restart does that to every pooled one); None for a connect that failed, a
    timeout, or a connection opened by this very command. ``unsent``: it was found dropped
    before anything of the command was written (so running it again cannot run it twice)."""

    def __init__(self, node: str, dropped: float | None = None, unsent: bool = False) -> None:
        super().__init__(f"memcached node {node} failed")
        self.node = node
        self.dropped = dropped
        self.unsent = unsent


class _ClosedBeforeSent(MemcacheUnexpectedCloseError):
    """The node had closed the connection before a pipeline was written to it."""


def node_name(server: Any) -> str:
    # The same spelling HashClient uses for its ring (client/hash.py _make_client_key).
    if isinstance(server, list | tuple) and len(server) == 2:
        return f"{server[0]}:{server[1]}"
    return str(server)


class RememberedRing(RendezvousHash):
    """pymemcache's rendezvous hashing, the same node for every key, each key's remembered
    (up to ``KEEP`` keys, then all forgotten at once) until the ring changes."""

    KEEP = 4096

    def __init__(self) -> None:
        super().__init__()
        self._nodes_of: dict[str, str] = {}

    def add_node(self, node: str) -> None:
        super().add_node(node)
        self._nodes_of = {}

    def remove_node(self, node: str) -> None:
        super().remove_node(node)
        self._nodes_of = {}

    def get_node(self, key: str) -> str | None:
        node = self._nodes_of.get(key)
        if node is None:
            node = super().get_node(key)
            if node is not None:  # an empty ring is not remembered
                if len(self._nodes_of) >= self.KEEP:
                    self._nodes_of = {}
                self._nodes_of[key] = node
        return node


class GuardedClient(Client):
    """A pymemcache ``Client`` that never survives an interrupted command."""

    poisoned = False
    opened_at = 0.0  # when its socket was connected (time.monotonic)

    def _connect(self) -> None:
        super()._connect()
        self.opened_at = time.monotonic()

    def _guard(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        reused = self.sock is not None  # opened by an earlier command
        try:
            return call(*args, **kwargs)
        except (OSError, MemcacheUnexpectedCloseError) as exc:
            self.close()
            dropped = self.opened_at if reused and isinstance(exc, _DROPPED) else None
            unsent = isinstance(exc, _ClosedBeforeSent)
            raise NodeFailure(node_name(self.server), dropped, unsent) from exc
        except Exception:
            raise  # pymemcache already closed the socket (base.py `except Exception`)
        except BaseException:
            # gevent.Timeout, GreenletExit, KeyboardInterrupt: the request may be half
            # sent or its reply unread. Nothing may read this socket again.
            self.poisoned = True
            self.close()
            raise

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().get, *args, **kwargs)

    def get_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().get_many, *args, **kwargs)

    def set(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().set, *args, **kwargs)

    def set_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().set_many, *args, **kwargs)

    def add(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().add, *args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().delete, *args, **kwargs)

    def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().delete_many, *args, **kwargs)

    def incr(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().incr, *args, **kwargs)

    def decr(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().decr, *args, **kwargs)

    def touch(self, *args: Any, **kwargs: Any) -> Any:
        return self._guard(super().touch, *args, **kwargs)

    def round_trip(self, batch: bytes) -> bytes:
        """``batch`` (commands, the last an ``mn``) written at once, and every reply up to and
        with the ``MN`` that ends them. Not pymemcache's ``raw_command``: its reader keeps only
        the last ``recv``'s bytes before the end it looks for (client/base.py
        ``_readsegment``), so a batch's replies that arrive in more than one read were cut."""
        return self._guard(self._round_trip, batch)

    def _round_trip(self, batch: bytes) -> bytes:
        if self.sock is None:
            self._connect()
        sock = self.sock
        assert sock is not None
        if _closed_by_peer(sock):
            self.close()
            raise _ClosedBeforeSent()
        try:
            sock.sendall(batch)
            parts, tail = [], b""
            while True:  # MN may arrive in pieces too: the last bytes so far are looked at
                got = sock.recv(_RECV)
                if not got:
                    raise MemcacheUnexpectedCloseError()
                parts.append(got)
                tail = (tail + got)[-len(_END) :]
                if tail == _END:
                    return b"".join(parts)
        except Exception:
            self.close()  # as pymemcache's own commands do: the socket's state is unknown
            raise


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the node closed (or reset) this connection: a peek at what waits to be read,
    without waiting (an idle connection holds nothing: it would block). gevent's socket
    holds a non-blocking one (its ``_sock``), peeked at as it is; any other is made not to
    wait for the peek."""
    raw = getattr(sock, "_sock", None)
    if raw is not None and raw.gettimeout() == 0.0:
        try:
            return bool(raw.recv(1, socket.MSG_PEEK) == b"")
        except BlockingIOError:
            return False
        except OSError:
            return True
    timeout = sock.gettimeout()
    sock.settimeout(0.0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


class GuardedHashClient(HashClient):
    client_class = GuardedClient  # PooledClient builds its connections from this class

    def drop_server(self, server: tuple[str, int]) -> None:
        """Take a node out of the ring for good. HashClient's own ``remove_server`` only
        marks it dead (it comes back after ``dead_timeout``) and raises KeyError for a node
        that never failed (client/hash.py)."""
        key = self._make_client_key(server)
        self.hasher.remove_node(key)
        self._failed_clients.pop(server, None)
        self._dead_clients.pop(server, None)
        client = self.clients.pop(key, None)
        if client is not None:
            client.close()

    def close_idle(self, node: str) -> None:
        """Close the sockets of ``node``'s idle connections: each opens a new one at its next
        command. One in use is left to its command (it is destroyed if that fails)."""
        pool = getattr(self.clients.get(node), "client_pool", None)
        for idle in pool.free if pool is not None else ():
            idle.close()

    def pipeline(self, key: str, commands: list[bytes]) -> list[bytes]:
        """``commands``, each with its CRLFs and all on ``key``'s node, sent in one write; their
        replies, one line each (so storage, ``incr``/``decr``, ``touch``; never a ``get``).
        An error reply raises, as pymemcache's own commands do."""
        batch = b"".join(commands) + b"mn\r\n"
        client = self._get_client(key)
        pool = getattr(client, "client_pool", None)  # a PooledClient: one of its connections
        if pool is None:
            reply = client.round_trip(batch)
        else:
            # pool.py's ``get_and_release(destroy_on_fail=True)`` written out: the same get,
            # destroy on an Exception and release otherwise, without a generator's context
            # manager around every round trip of every keyed call. A BaseException (a
            # timeout) leaves the connection in ``used``, as the context manager does: the
            # backend destroys it, poisoned (app/store/memcached.py ``_discard_poisoned``).
            connection = pool.get()
            try:
                reply = connection.round_trip(batch)
            except Exception:
                pool.destroy(connection)
                raise
            pool.release(connection)
        lines = reply.split(b"\r\n")[:-2]  # every reply line ends with CRLF; the last is MN
        for line in lines:
            if line.startswith((b"ERROR", b"CLIENT_ERROR")):
                raise MemcacheClientError(line)
            if line.startswith(b"SERVER_ERROR"):
                raise MemcacheServerError(line)
        if len(lines) != len(commands):
            raise MemcacheUnknownError(f"{len(lines)} replies to {len(commands)} commands")
        return lines
