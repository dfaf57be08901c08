"""A request's body as the gateway reads it (app/edge/calls.py ``read_body``): whole, in as
few reads as its length allows, refused when larger than the limit or cut short."""

from __future__ import annotations

import io

import pytest
from werkzeug.sansio.utils import get_content_length

from app.core import errors
from app.edge.calls import declared_length, read_body


class Input:
    """A ``wsgi.input`` that hands out at most ``step`` bytes a read, and counts its reads."""

    def __init__(self, data: bytes, step: int = 1 << 20) -> None:
        self._data = io.BytesIO(data)
        self.step = step
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        return self._data.read(min(size, self.step))


def _environ(body: Input, length: int | None) -> dict:
    environ: dict = {"wsgi.input": body}
    if length is None:
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    else:
        environ["CONTENT_LENGTH"] = str(length)
    return environ


def test_a_body_of_known_length_is_one_read_when_the_server_has_it_all() -> None:
    body = Input(b'{"model":"m"}')
    assert read_body(_environ(body, 13), 100) == b'{"model":"m"}'
    assert body.reads == 1  # no last read to learn the end
    empty = Input(b"")
    assert read_body(_environ(empty, 0), 100) == b"" and empty.reads == 0


def test_a_body_handed_out_in_parts_is_read_whole() -> None:
    for length in (13, None):
        body = Input(b'{"model":"m"}', step=4)
        assert read_body(_environ(body, length), 100) == b'{"model":"m"}'
    assert body.reads == 5  # a body of unknown length: until a read returns nothing


def test_a_body_cut_short_is_refused() -> None:
    with pytest.raises(errors.BadRequest) as refused:
        read_body(_environ(Input(b'{"model"', step=4), 13), 100)
    assert refused.value.code == "incomplete_body"


def test_a_body_over_the_limit_is_refused_with_or_without_a_length() -> None:
    with pytest.raises(errors.PayloadTooLarge):
        read_body(_environ(Input(b"x" * 11), 11), 10)
    chunked = Input(b"x" * 1000, step=4)
    with pytest.raises(errors.PayloadTooLarge):
        read_body(_environ(chunked, None), 10)
    assert chunked.reads == 3  # refused once past the limit, not read to its end


@pytest.mark.parametrize(
    "length",
    [
        None,
        "",
        "0",
        "13",
        "007",
        " 13",
        "13 ",
        "\t13",
        "-1",
        "-0",
        "+13",
        "1_000",
        "1e3",
        "\u0663",  # an Arabic-Indic digit
        "\u00b2",  # a superscript two: a digit to str.isdigit, not to int()
        "13x",
        "99999999999999999999",
        "\uff11\uff13",  # full-width digits
    ],
)
@pytest.mark.parametrize("coding", [None, "chunked", "gzip, chunked", "gzip", ""])
def test_the_declared_length_is_werkzeugs(length, coding) -> None:
    environ = {"CONTENT_LENGTH": length, "HTTP_TRANSFER_ENCODING": coding}
    environ = {k: v for k, v in environ.items() if v is not None}
    assert declared_length(environ) == get_content_length(length, coding)
