"""Memcached as resumable streams' logs use it (app/resume/writer.py, reader.py): the
backend's get, set and delete, and ``touch``, a new lifetime for each item of a log when its
stream ends, sent through the backend's ``run`` as the limit counters send their commands
(app/store/counters.py). The parts of a value split for its size keep their own lifetime."""

from __future__ import annotations

from typing import Any

from app.store.backends import clamp_ttl
from app.store.memcached import MemcachedBackend


class LogStore:
    def __init__(self, backend: MemcachedBackend) -> None:
        self.backend = backend

    def get(self, key: str) -> bytes | None:
        return self.backend.get(key)

    def lookup(self, key: str) -> bytes | None:
        """``get``; raises app/store/memcached.py's ``Unavailable`` when its node could not
        answer."""
        return self.backend.lookup(key)

    def set(self, key: str, value: bytes, ttl: int) -> bool:
        return self.backend.set(key, value, ttl)

    def delete(self, key: str, *, force: bool = False) -> None:
        self.backend.delete(key, force=force)

    def touch(self, key: str, ttl: int) -> bool:
        def command(client: Any) -> bool:
            return bool(client.touch(key, clamp_ttl(ttl), noreply=False))

        # A touch, run twice, does what it does once: it may run again on a new connection.
        return self.backend.run([key], command, False, read=True)
