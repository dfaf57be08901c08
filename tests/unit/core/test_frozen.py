"""app/core/frozen.py: a frozen dataclass given ``quick_init`` is built as its generated
``__init__`` builds it (the same values, defaults, factories and errors), stays frozen, and
a class it could not rewrite exactly is refused."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import InitVar, dataclass, field
from typing import Any, ClassVar

import pytest

from app.core.admission import Load
from app.core.frozen import quick_init
from app.gateway import Caller, Plan
from app.request.call import Call
from app.upstream.reading import ReadRules

_made = itertools.count()


def _fresh() -> list[int]:
    return [next(_made)]


def _shape() -> Any:
    @dataclass(frozen=True)
    class Shape:
        name: str
        size: int = 3
        tags: list[int] = field(default_factory=_fresh)

    return Shape


def _state(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def test_it_builds_what_the_generated_init_builds() -> None:
    generated, quick = _shape(), quick_init(_shape())
    assert quick.__init__ is not generated.__init__
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("a",), {}),
        (("a", 7), {}),
        (("a",), {"tags": [1]}),
        ((), {"name": "b", "size": 0}),
    ]
    for args, kwargs in cases:
        made, built = generated(*args, **kwargs), quick(*args, **kwargs)
        made_state, built_state = _state(made), _state(built)
        # The default factory runs once per value, for each class alike.
        if "tags" not in kwargs:
            assert made_state.pop("tags") != built_state.pop("tags")
        assert made_state == built_state
    same = quick("a", 1, [2])
    assert repr(same) == repr(generated("a", 1, [2]))
    assert same == quick("a", 1, [2]) and same != quick("a", 2, [2])
    assert dataclasses.replace(same, size=5) == quick("a", 5, [2])


def test_the_same_arguments_are_refused() -> None:
    generated, quick = _shape(), quick_init(_shape())
    refused: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}),
        (("a", 1, [], 4), {}),
        (("a",), {"colour": 1}),
        (("a",), {"name": "b"}),
    ]
    for args, kwargs in refused:
        with pytest.raises(TypeError):
            generated(*args, **kwargs)
        with pytest.raises(TypeError):
            quick(*args, **kwargs)


def test_it_stays_frozen_and_hashable() -> None:
    @quick_init
    @dataclass(frozen=True)
    class Point:
        x: int
        y: int = 0

    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    assert hash(point) == hash(Point(1, 0)) and point == Point(x=1, y=0)


def test_the_gateways_values_are_the_quick_ones() -> None:
    # The values built on every call's path (bench/HISTORY.md, "Cache hits near the floor's").
    for cls in (Call, Caller, Plan, Load, ReadRules):
        assert (
            cls.__init__.__doc__
            == f"{cls.__qualname__}'s fields stored as they are (app/core/frozen.py)."
        )
    assert Load(1) == Load(requests=1, streams=0)


def test_a_class_it_cannot_rewrite_exactly_is_refused() -> None:
    @dataclass
    class Plain:
        x: int

    @dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    @dataclass(frozen=True)
    class Posted:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True)
    class KeywordOnly:
        x: int = field(kw_only=True)

    @dataclass(frozen=True)
    class NotInit:
        x: int = field(init=False, default=1)

    @dataclass(frozen=True)
    class WithInitVar:
        x: InitVar[int]

    @dataclass(frozen=True)
    class WithClassVar:
        x: int
        y: ClassVar[int] = 1

    @dataclass(frozen=True)
    class Clashing:
        d: int

    for cls in (Plain, Slotted, Posted, KeywordOnly, NotInit, WithInitVar, WithClassVar, Clashing):
        with pytest.raises(TypeError):
            quick_init(cls)
