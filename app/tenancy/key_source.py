"""The gateway keys file, re-read when it changes.

Each worker looks at the file's modification time at most every ``CHECK_EVERY_S`` seconds,
on a call, so a revoked key stops working everywhere within that time (SIGHUP reloads still
work: new workers read the file). A file that no longer parses is ignored, loudly, and the
keys in force stay in force. What the file means is app/tenancy/keyring.py's; this module
only reads it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from app.tenancy.keyring import KeyRing, KeysFileError, load

# Access's logger (app/tenancy/access.py): a reload and a limit refused are one subject to
# an operator filtering the gateway's log by logger name.
log = logging.getLogger("llmgate.access")
CHECK_EVERY_S = 0.25


class KeySource:
    """The key ring of a file, re-read when the file changes."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self.reload_errors = 0
        self.ring = self._read()  # at start a bad file is an error: it stops the worker

    def current(self) -> KeyRing:
        now = self._clock()
        if now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            try:
                stamp = _stamp(self.path)
            except OSError:
                stamp = None
            if stamp != self._stamp:
                try:
                    self.ring = self._read()
                    log.info("keys file %s re-read: %d keys", self.path, len(self.ring.keys))
                except (OSError, KeysFileError) as exc:
                    self._stamp = stamp  # do not re-read it on every call until it changes
                    self.reload_errors += 1
                    log.error("keys file not re-read, the keys in force stay: %s", exc)
        return self.ring

    def _read(self) -> KeyRing:
        stamp = _stamp(self.path)
        with open(self.path, encoding="utf-8") as f:
            ring = load(f.read(), path=self.path)
        self._stamp = stamp
        return ring


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)
