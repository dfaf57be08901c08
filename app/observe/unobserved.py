"""Metrics nobody watches: the observer a stage gets when it is built without the worker's
metrics (a unit test, a benchmark's part), so that no stage asks whether anyone listens.

``UNOBSERVED`` is a ``Metrics`` whose every metric is ``_Nothing``: its label lookups return
itself and its updates do nothing, and the ``observe_*`` methods, which only update metrics,
do nothing with it either. The app factory always builds the real one (app/factory.py).
"""

from __future__ import annotations

from typing import Any

from app.observe.metrics import Metrics


class _Nothing:
    """A metric that counts nothing."""

    def labels(self, *values: object, **named: object) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_NOTHING = _Nothing()


class Unobserved(Metrics):
    """Every metric of ``Metrics`` as ``_Nothing``; nothing to expose (``watched``: False)."""

    watched = False

    def __init__(self) -> None:  # no registry, no files: nothing is kept
        self.multiproc_dir = ""

    def __getattr__(self, name: str) -> Any:
        # Only what an instance of Metrics sets in its __init__ (its metrics) gets here.
        if name.startswith("__"):
            raise AttributeError(name)
        return _NOTHING

    def exposition(self) -> tuple[bytes, str]:
        return b"", "text/plain"

    def snapshot(self) -> dict[str, Any]:
        return {}


UNOBSERVED: Metrics = Unobserved()
