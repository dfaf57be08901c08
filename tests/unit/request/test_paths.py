"""app/request/paths.py: a forwarded path stays under /v1 and reaches the upstream as data."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.errors import BadRequest
from app.request.paths import forwarded_path


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        ("/v1", "/v1"),
        ("/v1/", "/v1/"),
        ("/v1/models", "/v1/models"),
        ("/v1/models/gpt-4o:free@x", "/v1/models/gpt-4o:free@x"),
        ("/v1/files/file-abc/content", "/v1/files/file-abc/content"),
        # Decoded by gunicorn from %3F, %23, %25, %20: encoded again, never syntax.
        ("/v1/foo?q=1", "/v1/foo%3Fq=1"),
        ("/v1/foo#frag", "/v1/foo%23frag"),
        ("/v1/100%", "/v1/100%25"),
        ("/v1/a b", "/v1/a%20b"),
        ("/v1/modèle", "/v1/mod%C3%A8le"),
        ("/v1/...", "/v1/..."),
        ("/v1/..a", "/v1/..a"),
    ],
)
def test_a_path_under_v1_is_forwarded_encoded(path: str, forwarded: str) -> None:
    assert forwarded_path(path) == forwarded


@pytest.mark.parametrize(
    "path",
    [
        "/v1/../admin",
        "/v1/./models",
        "/v1/models/..",
        "/v1/models/.",
        "/v1//models",
        "/v1/chat//completions",
        "/v1/a\\..\\admin",
        "/v1/a\r\nX: 1",
        "/v1/a\x00b",
        "/v1/a\x7f",
        "/v2/models",
        "/v1models",
        "/admin",
    ],
)
def test_a_path_that_could_leave_v1_is_refused(path: str) -> None:
    with pytest.raises(BadRequest) as caught:
        forwarded_path(path)
    assert caught.value.code == "invalid_path"
    assert caught.value.status == 400
    assert "\r" not in caught.value.message and "\n" not in caught.value.message


def _resolve(path: str) -> str:
    """RFC 3986 5.2.4's dot-segment removal, as urllib3 applies it to the URL it sends."""
    out: list[str] = []
    for segment in path.split("/")[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/" + "/".join(out)


@given(st.lists(st.text(min_size=0, max_size=6), max_size=6))
def test_whatever_is_forwarded_stays_under_v1_once_resolved(segments: list[str]) -> None:
    path = "/v1/" + "/".join(segments)
    try:
        forwarded = forwarded_path(path)
    except BadRequest:
        return
    resolved = _resolve(forwarded)
    assert resolved == forwarded  # nothing left for a resolver to act on
    assert resolved == "/v1" or resolved.startswith("/v1/")
    assert "?" not in forwarded and "#" not in forwarded


@given(st.text(alphabet="ab1-_~.:@!/?# %é\\\x00", max_size=20))
def test_the_plain_path_shortcut_answers_as_the_full_check(tail: str) -> None:
    """A plain path leaves without the segment-by-segment check: the same answer either way."""
    from app.request.paths import _checked

    path = "/v1" + tail

    def answer(check: Callable[[str], str]) -> str:
        try:
            return check(path)
        except BadRequest as exc:
            return f"refused: {exc.message}"

    assert answer(forwarded_path) == answer(_checked)
