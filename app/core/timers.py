"""A timer armed again for every wait without a new object: ``Alarm``.

A stream waits once per event (the upstream read under the idle timeout, the caller's wait
for the next event under the heartbeat), so a new ``gevent.Timeout`` per wait is an object
and a libev watcher per event of every stream. But a ``gevent.Timeout`` cannot be started
again: libev keeps a stopped timer's remaining time, so a Timeout restarted fires at its
first deadline (once it has fired, at once). ``Alarm`` is a repeating libev timer armed with
``again``, which restarts it from the full interval each time.

Like ``gevent.Timeout`` it is a BaseException, thrown into the greenlet that armed it, so
that a library's ``except Exception`` does not swallow it; the waiter catches it by identity
(``except Alarm as exc: if exc is not alarm: raise``) and disarms it in a ``finally``.
"""

from __future__ import annotations

from typing import Any

import gevent
from greenlet import getcurrent


class Alarm(BaseException):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds
        self._timer: Any = gevent.get_hub().loop.timer(seconds, seconds)

    def arm(self) -> None:
        """Thrown into the current greenlet ``seconds`` from now, unless disarmed first."""
        # The same object is raised again and again: start each time without the last
        # traceback and context (they would hold frames and grow).
        self.__traceback__ = self.__context__ = self.__cause__ = None
        if self._timer is None:
            raise RuntimeError("the alarm was closed")
        self._timer.again(getcurrent().throw, self)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.stop()

    def close(self) -> None:
        """Release the watcher; disarming it after is harmless, arming it an error."""
        if self._timer is not None:
            self._timer.stop()
            self._timer.close()
            self._timer = None
