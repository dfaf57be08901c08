"""`make run` as one process to whoever signals make, and its last line the runner's.

The Makefile runs the runner as one command without a shell, so under `make run` the
runner's parent is make itself. GNU make (4.3, commands.c ``fatal_error_signal``) passes
only SIGTERM on to its children: on SIGINT, SIGHUP or SIGQUIT sent to make alone (not to the
terminal's process group, as Ctrl-C is: `kill -INT <make's pid>`, a supervisor's stop) it
waits for its children to end first, and they never heard of it: nothing stopped. While it
waits there it keeps that signal blocked, which /proc/<pid>/status shows (``SigBlk``): the
runner looks every half second and stops as on its own Ctrl-C. A make gone (killed) stops
the runner too, rather than leave the stack behind.

make also ends a failed recipe with a line of its own (``make: *** [Makefile:10: run]
Error 1``) after the runner's one line that says why. A recipe's failure is always told
unless it is ignored, and then make exits 0; so when the runner ends with a failure it ends
make first, with SIGPIPE, the one signal make neither catches nor ignores (``SigCgt``,
``SigIgn``) and shells do not report: make exits 141 without a word, the runner's line stays
the last. A make that would catch it is left alone (its line follows, as before).
Linux only (/proc), as the runner is; elsewhere, or without make, nothing here acts.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

MAKES = ("make", "gmake")
# The signals GNU make handles by waiting for its children before dying of them.
STOPPING = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _mask(field: str, status: str) -> int:
    """A signal mask line of /proc/<pid>/status (``SigBlk:\t0000000000010002``)."""
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1], 16)
    return 0


def _has(mask: int, sig: int) -> bool:
    return bool(mask >> (sig - 1) & 1)


class MakeParent:
    """The make this runner was started by, watched through /proc."""

    def __init__(self, pid: int, status: str) -> None:
        self.pid = pid
        self._blocked = _mask("SigBlk", status)  # as make runs its recipe, unsignalled

    @classmethod
    def find(cls) -> MakeParent | None:
        """Our parent when it is make; None otherwise (a shell, a container's init)."""
        pid = os.getppid()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        return cls(pid, status) if comm in MAKES else None

    def _status(self) -> str | None:
        """Make's status now; None when it is gone (we were handed to another parent)."""
        if os.getppid() != self.pid:
            return None
        try:
            return Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None

    def stopping(self) -> bool:
        """make got a signal it waits on us for, or is gone."""
        status = self._status()
        if status is None:
            return True
        blocked = _mask("SigBlk", status) & ~self._blocked
        return any(_has(blocked, sig) for sig in STOPPING)

    def end_quietly(self) -> None:
        """End make without its line of failure, when SIGPIPE ends it (module docstring)."""
        status = self._status()
        if status is None:
            return
        handled = _mask("SigCgt", status) | _mask("SigIgn", status)
        if not _has(handled, signal.SIGPIPE):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGPIPE)
