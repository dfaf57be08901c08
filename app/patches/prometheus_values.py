"""Patch: prometheus_client's multiprocess value class (``values.ValueClass``), for a
worker's metric values written as its multiprocess mode writes them, but cheaper to update
(bench/HISTORY.md, "The metrics' updates").

It fits (``fits``) a value class whose ``inc`` and ``set`` do nothing but what the lean ones
here do (write ``_value`` and ``_timestamp``, and ``_file.write_value(_key, ...)``) besides
the lock and the pid check it leaves out: prometheus_client 0.20 to 0.26. A class whose
updates touch anything more is left as it is. Where the file's ``write_value`` is what
``writes_fit`` knows (the value's place looked up, the two doubles packed into the mmap
there), the lean value writes them there itself: two Python calls fewer an update.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import mmap_dict, values

from app.patches import refuse

# What a multiprocess value's update may touch for the lean one to do the same: its own
# fields and the file's write; the pid check (name-mangled) is what the lean one leaves out.
_UPDATE_NAMES = {"_value", "_timestamp", "_file", "write_value", "_key"}
# What the file's write reads, in order, for the lean value to write in its place: the
# value's place in the mmap (made on first use: ``_init_value``), then the two doubles packed
# into the mmap there (``_m``, which a growing file replaces: read at each write).
_WRITE_NAMES = ("_positions", "_init_value", "_pack_two_doubles", "_m")
_PACK_NAMES = ("_pack_two_doubles_func",)
_PACK: Any = getattr(mmap_dict, "_pack_two_doubles_func", None)


def fits(value_class: Any) -> str | None:
    """None when ``value_class``'s updates are the ones ``lean_values`` rewrites."""
    for name in ("inc", "set"):
        update = getattr(value_class, name, None)
        code = getattr(update, "__code__", None)
        if code is None:
            return f"the value class has no plain {name} method"
        touched = {n for n in code.co_names if not n.endswith("__check_for_pid_change")}
        if touched != _UPDATE_NAMES:
            return f"its {name} touches {sorted(touched ^ _UPDATE_NAMES)} too"
    return None


def writes_fit() -> str | None:
    """None when the multiprocess file's ``write_value`` packs a value's two doubles (its
    value and timestamp, 16 bytes) into its mmap at the value's place, as the lean values
    write them themselves."""
    write: Any = getattr(getattr(mmap_dict, "MmapedDict", None), "write_value", None)
    pack: Any = getattr(mmap_dict, "_pack_two_doubles", None)
    if getattr(write, "__code__", None) is None or getattr(pack, "__code__", None) is None:
        return "the file's write_value or _pack_two_doubles is not a plain function"
    if write.__code__.co_names != _WRITE_NAMES or pack.__code__.co_names != _PACK_NAMES:
        return "the file's write_value reads other names"
    packer = getattr(_PACK, "__self__", None)
    if pack.__code__.co_consts != (None, 16) or getattr(packer, "format", None) != "dd":
        return "the file's two doubles are packed otherwise"
    return None


def use_lean_values() -> None:
    """Every metric value this process makes from now on is a lean one (when multiprocess:
    ``PROMETHEUS_MULTIPROC_DIR`` was set as prometheus_client was imported), when the class
    fits. Runs before the first metric is made (app/observe/metrics.py, at its import): a
    value made before would keep its own handle on the same files."""
    current = values.ValueClass
    if not getattr(current, "_multiprocess", False) or getattr(current, "lean", False):
        return
    reason = fits(current)
    if reason is None:
        values.ValueClass = lean_values(current)
    else:
        refuse("prometheus_values", reason)


def lean_values(value_class: Any) -> Any:
    """prometheus_client's multiprocess value (``values.ValueClass`` when
    ``PROMETHEUS_MULTIPROC_DIR`` was set as it was imported) without the two things each update
    pays for and a worker never needs: a lock, and ``getpid()`` to learn whether the process
    forked since the last update. 0.95 -> 0.21 us an update, a dozen updates a call
    (bench/HISTORY.md, "The metrics' updates").

    - The lock guards the value and its mmap file against another thread. A worker updates its
      metrics only from its gevent loop's greenlets, which cannot switch inside an update (it
      waits on nothing); the one real thread of a worker (app/observe/outbox.py) touches no
      metric. Creating a value still takes the lock, as before.
    - The fork: a value used in a forked child must move to the child's own files (named by
      its pid), or the child writes into its parent's. ``os.register_at_fork`` marks the
      fork, and the first update after it runs prometheus_client's own check, which moves
      every value of the process.

    Anything else (the in-memory values of a single process, or a class already lean) is
    returned as it is."""
    if not getattr(value_class, "_multiprocess", False) or getattr(value_class, "lean", False):
        return value_class
    forked = [False]
    os.register_at_fork(after_in_child=lambda: forked.__setitem__(0, True))
    unfit = writes_fit()
    if unfit is not None:
        refuse("prometheus_writes", unfit)
    pack: Any = _PACK if unfit is None else None

    class LeanValue(value_class):
        lean = True

        def _moved(self) -> None:
            """The first update since a fork: every value to this process's own files."""
            forked[0] = False
            value_class.get(self)  # prometheus_client's check of the pid, under its lock

        def inc(self, amount: float) -> None:
            if forked[0]:
                self._moved()
            self._value += amount
            self._timestamp = 0.0
            file = self._file
            place = None if pack is None else file._positions.get(self._key)
            if place is None:
                file.write_value(self._key, self._value, 0.0)
            else:  # what write_value does, without its two calls
                file._m[place : place + 16] = pack(self._value, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            if forked[0]:
                self._moved()
            self._value = value
            self._timestamp = timestamp or 0.0
            file = self._file
            place = None if pack is None else file._positions.get(self._key)
            if place is None:
                file.write_value(self._key, value, self._timestamp)
            else:
                file._m[place : place + 16] = pack(value, self._timestamp)

    return LeanValue
