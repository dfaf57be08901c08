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


def test_a_new_workers_first_call_spells_every_name_as_werkzeug_does(monkeypatch) -> None:
    # The names are remembered per worker, so only a worker's first calls spell them: here
    # with nothing remembered yet, then remembered.
    monkeypatch.setattr(headers, "_ENVIRON_NAMES", {})
    environ = {key: f"v{i}" for i, key in enumerate(SERVER_KEYS + BODY_KEYS)}
    environ |= {"HTTP_X_API_KEY": "k", "HTTP_ACCEPT": ""}
    expected = list(EnvironHeaders(environ).items())
    assert [name for name, _ in expected] == ["Content-Type", "Content-Length", "X-Api-Key",
                                              "Accept"]  # fmt: skip
    assert environ_headers(environ) == expected
    assert environ_headers(environ) == expected
    assert len(headers._ENVIRON_NAMES) == len(environ)


def test_each_key_is_spelled_once_per_worker(monkeypatch) -> None:
    # What the list saves over Werkzeug's: a name is spelled the first time its key is seen,
    # then remembered (every call of a worker brings the same few keys).
    monkeypatch.setattr(headers, "_ENVIRON_NAMES", {})
    spelled: list[str] = []
    spell = headers._environ_name

    def counted(key: str) -> str:
        spelled.append(key)
        return spell(key)

    monkeypatch.setattr(headers, "_environ_name", counted)
    environ = {"CONTENT_TYPE": "application/json", "HTTP_X_API_KEY": "k", "PATH_INFO": "/v1"}
    for _ in range(3):
        assert environ_headers(environ) == list(EnvironHeaders(environ).items())
    assert spelled == list(environ)
