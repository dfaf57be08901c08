"""The request's headers read from the WSGI environ: exactly Werkzeug's EnvironHeaders list
(names, values, order), for any environ a server could hand over."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from werkzeug.datastructures import EnvironHeaders

from app.request import headers
from app.request.headers import environ_headers

SERVER_KEYS = ["REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_NAME", "REMOTE_ADDR",
               "wsgi.input", "wsgi.url_scheme", "gunicorn.socket", "RAW_URI"]  # fmt: skip
BODY_KEYS = ["CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"]
names = st.from_regex(r"HTTP_[A-Z0-9_]{1,12}", fullmatch=True)
keys = st.one_of(names, st.sampled_from(SERVER_KEYS + BODY_KEYS))
values = st.one_of(st.just(""), st.text(min_size=1, max_size=20))


@given(st.lists(st.tuples(keys, values), max_size=25))
def test_the_headers_are_werkzeugs_list(pairs) -> None:
    environ = dict(pairs)
    assert environ_headers(environ) == list(EnvironHeaders(environ).items())
    assert environ_headers(environ) == list(EnvironHeaders(environ).items())  # names kept


def test_a_body_header_counts_only_when_set_and_an_empty_header_still_counts() -> None:
    environ = {"CONTENT_TYPE": "", "CONTENT_LENGTH": "12", "HTTP_X_EMPTY": "",
               "HTTP_CONTENT_LENGTH": "99", "HTTP_X_API_KEY": "k", "PATH_INFO": "/v1"}  # fmt: skip
    assert environ_headers(environ) == [("Content-Length", "12"), ("X-Empty", ""),
                                        ("X-Api-Key", "k")]  # fmt: skip


def test_made_up_names_beyond_the_bound_are_spelled_but_not_kept(monkeypatch) -> None:
    monkeypatch.setattr(headers, "_ENVIRON_NAMES", {})
    monkeypatch.setattr(headers, "_ENVIRON_NAMES_MAX", 3)
    environ = {f"HTTP_X_MADE_UP_{i}": "v" for i in range(10)}
    assert [name for name, _ in environ_headers(environ)] == [f"X-Made-Up-{i}" for i in range(10)]
    assert len(headers._ENVIRON_NAMES) == 3
