"""Frozen dataclasses built at a plain one's cost. No I/O here.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__``
(its own ``__setattr__`` refuses every assignment): a call through a slot wrapper per field,
about 1,300 instructions each on CPython 3.11 against a plain store's few dozen. The values
built on every call's path (the ``Call`` three times, its ``Plan``, the admission's ``Load``
twice ...) paid ~50 thousand instructions a cache hit for it (bench/HISTORY.md, "Cache hits
near the floor's"). ``quick_init`` gives such a class an ``__init__`` that writes the fields
into the instance's ``__dict__`` instead: the same parameters, defaults and default
factories, the same values stored; the class stays frozen (assignment still raises
``FrozenInstanceError``) and keeps its generated ``__eq__``, ``__hash__`` and ``__repr__``.
It takes only what it can rewrite exactly: a frozen dataclass without slots, ``__post_init__``,
``InitVar``, keyword-only or ``init=False`` fields; anything else is refused at import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")
# Names the written __init__ uses itself, which no field may take.
_TAKEN = frozenset({"self", "MISSING", "d"})
_PREFIXES = ("_default_", "_factory_")


def quick_init(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass) with an ``__init__`` that stores straight into the
    instance's dict; TypeError for a class it cannot rewrite exactly."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__qualname__} is not a frozen dataclass")
    if "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__} has slots or a __post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__qualname__} has a ClassVar or InitVar pseudo-field")
    env: dict[str, Any] = {"MISSING": dataclasses.MISSING}
    names, lines = [], []
    for field in fields:
        name = field.name
        if not field.init or field.kw_only or name in _TAKEN or name.startswith(_PREFIXES):
            raise TypeError(f"{cls.__qualname__}.{name} is not a plain field")
        if field.default is not dataclasses.MISSING:
            env[f"_default_{name}"] = field.default
            names.append(f"{name}=_default_{name}")
            lines.append(f"    d[{name!r}] = {name}")
        elif field.default_factory is not dataclasses.MISSING:
            env[f"_factory_{name}"] = field.default_factory
            names.append(f"{name}=MISSING")
            lines.append(f"    d[{name!r}] = _factory_{name}() if {name} is MISSING else {name}")
        else:
            names.append(name)
            lines.append(f"    d[{name!r}] = {name}")
    source = f"def __init__(self, {', '.join(names)}):\n    d = self.__dict__\n"
    source += "\n".join(lines) + "\n" if lines else "    pass\n"
    exec(source, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"{cls.__qualname__}'s fields stored as they are (app/core/frozen.py)."
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
