"""``Event.of_data`` is ``Event(raw=..., data=...)`` made faster (llmgate_wire/sse.py): the
two must be the same event in every way a caller can look at one."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgate_wire.sse import Decoder, Event


@given(raw=st.binary(max_size=64), data=st.text(max_size=32))
def test_an_event_made_from_data_is_the_constructors_event(raw: bytes, data: str) -> None:
    made, built = Event.of_data(raw, data), Event(raw=raw, data=data)
    for field in dataclasses.fields(Event):  # a field with no class default would fail here
        assert getattr(made, field.name) == getattr(built, field.name), field.name
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert dataclasses.astuple(made) == dataclasses.astuple(built)
    assert dataclasses.replace(made, id="7") == dataclasses.replace(built, id="7")
    assert pickle.loads(pickle.dumps(made)) == built
    assert (made.is_comment, made.is_done) == (built.is_comment, built.is_done)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.data = "changed"  # type: ignore[misc]


def test_the_decoders_usual_event_is_one_of_them() -> None:
    (event,) = Decoder().feed(b'data: {"a":1}\n\n')
    assert event == Event(raw=b'data: {"a":1}\n\n', data='{"a":1}') and event.json() == {"a": 1}
    assert type(event) is Event and event.comments == () and event.retry is None
