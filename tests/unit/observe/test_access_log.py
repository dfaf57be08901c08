"""The request log's line (app/observe/access_log.py): written straight to the factory's
handler's stream only where ``logging`` would have written exactly that there and nowhere
else; any other configuration gets its records as before."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.observe import access_log
from app.observe.access_log import ACCESS
from tests.support.strategies import json_values

OWNER = logging.getLogger("llmgate")


@pytest.fixture
def factory_handler() -> Iterator[logging.StreamHandler[io.StringIO]]:
    """The ``llmgate`` logger as app/factory.py leaves it, on a stream of the test's; every
    logger put back afterwards. Made in the test itself: pytest's log capture adds its own
    handler to each logger that does not propagate as each phase of a test starts."""
    saved = [(lg, lg.handlers[:], lg.filters[:], lg.level, lg.propagate) for lg in (OWNER, ACCESS)]
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter(access_log.BARE))
    handler.llmgate = True  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        for logger, handlers, filters, level, propagate in saved:
            logger.handlers, logger.filters, logger.propagate = handlers, filters, propagate
            logger.setLevel(level)


def _as_the_factory_leaves_it(handler: logging.StreamHandler[io.StringIO]) -> None:
    OWNER.handlers, OWNER.filters, OWNER.propagate = [handler], [], False
    OWNER.setLevel(logging.INFO)
    ACCESS.handlers, ACCESS.filters, ACCESS.propagate = [], [], True
    ACCESS.setLevel(logging.NOTSET)


def _written(handler: logging.StreamHandler[io.StringIO]) -> str:
    return handler.stream.getvalue()


def test_the_factorys_handler_gets_the_line_as_logging_would_write_it(
    factory_handler, monkeypatch
) -> None:
    _as_the_factory_leaves_it(factory_handler)
    access_log.write('{"a":1}')
    ACCESS.info('{"b":2}')  # the same line through logging: the same bytes
    assert _written(factory_handler) == '{"a":1}\n{"b":2}\n'

    def no_record(*args: object, **kwargs: object) -> logging.LogRecord:
        raise AssertionError("a record was made")

    monkeypatch.setattr(ACCESS, "makeRecord", no_record)
    access_log.write('{"c":3}')  # written directly: no record on the way
    assert _written(factory_handler).endswith('{"c":3}\n')


def test_any_other_configuration_gets_its_record(factory_handler) -> None:
    _as_the_factory_leaves_it(factory_handler)

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    keep = Keep()
    OWNER.addHandler(keep)  # a second handler on the way
    access_log.write("one")
    OWNER.removeHandler(keep)
    ACCESS.addHandler(keep)  # a handler of the access logger's own
    access_log.write("two")
    ACCESS.removeHandler(keep)
    assert keep.lines == ["one", "two"]

    ACCESS.addFilter(lambda record: record.getMessage() != "dropped")  # a filter decides
    access_log.write("dropped")
    access_log.write("kept")
    ACCESS.filters = []
    ACCESS.setLevel(logging.WARNING)  # a level that drops the line
    access_log.write("too low")
    ACCESS.setLevel(logging.NOTSET)
    factory_handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    access_log.write("formatted")
    factory_handler.setFormatter(logging.Formatter(access_log.BARE))
    assert _written(factory_handler) == "one\ntwo\nkept\nINFO formatted\n"

    logging.disable(logging.INFO)
    try:
        access_log.write("disabled")
    finally:
        logging.disable(logging.NOTSET)
    OWNER.propagate = True  # the root's handlers would see it too: through logging
    root_keep = Keep()
    logging.getLogger().addHandler(root_keep)
    try:
        access_log.write("propagated")
    finally:
        logging.getLogger().removeHandler(root_keep)
    assert root_keep.lines == ["propagated"]
    assert "disabled" not in _written(factory_handler)


def test_a_stream_that_cannot_be_written_never_fails_the_call(factory_handler) -> None:
    _as_the_factory_leaves_it(factory_handler)
    factory_handler.stream.close()  # stderr gone (a closed pipe, say)
    access_log.write("lost")  # as logging's handler would: no exception reaches the call


# What a log line may hold: the gateway's own values, and usage as a provider sent it
# (any JSON, with json.loads's integers of any size and its lone surrogates).
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.text(alphabet=st.characters(codec="ascii"))
    | st.sampled_from(["\ud800", "a\udfffb", "\u2028", "\x00\x1f\x7f", "é"])
)
_VALUES = json_values(_SCALARS, st.text(), list_size=4, dict_size=4, max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(), _VALUES, max_size=8))
def test_a_line_is_the_json_value_json_would_write_in_ascii(line) -> None:
    """The same value as json's encoder writes, all in ASCII, whichever encoder wrote it."""
    text = access_log.encode(line)
    assert text.isascii()
    assert json.loads(text) == json.loads(json.dumps(line))


def test_the_usual_line_takes_orjsons_path_and_the_rest_take_jsons(monkeypatch) -> None:
    """Which encoder wrote a line: orjson for the usual one, json for a line whose orjson
    text is not ASCII or that orjson refuses."""
    written: list[str] = []
    json_encode = access_log._JSON.encode

    class Watched(json.JSONEncoder):
        def encode(self, o: object) -> str:
            written.append("json")
            return json_encode(o)

    monkeypatch.setattr(access_log, "_JSON", Watched())
    usual = {"ts": 1796274317.195, "route": "chat", "status": 200, "usage": {"total": 55}}
    assert access_log.encode(usual) == json.dumps(usual, separators=(",", ":"))
    assert written == []
    for other in ({"model": "é"}, {"n": 2**64}, {"model": "\ud800"}):
        assert access_log.encode(other) == json.dumps(other, separators=(",", ":"))
    assert written == ["json"] * 3


def test_a_float_that_is_not_a_number_is_null() -> None:
    """JSON has no word for it: null, where json would write NaN (which parsers refuse)."""
    assert json.loads(access_log.encode({"usage": {"cost": float("nan")}})) == {
        "usage": {"cost": None}
    }
