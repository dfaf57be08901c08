"""Hypothesis strategies that several property tests draw from; each test still names its
own sizes. No assertions here.

- ``cut_places``: places to cut an input at, for tests/support/sse_feed.py's ``cut_at`` (which
  takes each modulo the input's length, so any integer is a place);
- ``json_values``: JSON documents grown from the given leaves, with objects keyed by the
  given keys;
- ``chat_json``: small JSON whose objects use a chat answer's member names (the names given
  by each test), for the translators that must never raise on any of it;
- ``utf8_text``: text UTF-8 can carry (no lone surrogates), without the characters named
  (an SSE field's line ends, a header's NUL).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# A chat answer's smallest values: enough to put every type where the translator expects
# another one.
SMALL_LEAVES: st.SearchStrategy[Any] = (
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4)
)


def cut_places(max_value: int | None, max_size: int) -> st.SearchStrategy[list[int]]:
    """Up to ``max_size`` places from 0 to ``max_value`` (None: no bound)."""
    return st.lists(st.integers(min_value=0, max_value=max_value), max_size=max_size)


def json_values(
    leaves: st.SearchStrategy[Any],
    keys: st.SearchStrategy[str],
    *,
    list_size: int,
    dict_size: int,
    max_leaves: int,
) -> st.SearchStrategy[Any]:
    """JSON values: ``leaves``, and lists (up to ``list_size`` items) and objects (up to
    ``dict_size`` members keyed by ``keys``) of them, with ``max_leaves`` leaves at most."""
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=list_size) | st.dictionaries(keys, inner, max_size=dict_size)
        ),
        max_leaves=max_leaves,
    )


def chat_json(names: list[str], *, max_leaves: int) -> st.SearchStrategy[Any]:
    """Small JSON (SMALL_LEAVES) whose objects are keyed by ``names``."""
    keys = st.sampled_from(names)
    return json_values(SMALL_LEAVES, keys, list_size=3, dict_size=5, max_leaves=max_leaves)


def utf8_text(exclude: str = "", *, max_size: int) -> st.SearchStrategy[str]:
    """Text without lone surrogates and without the characters of ``exclude``."""
    characters = st.characters(exclude_categories=["Cs"], exclude_characters=exclude)
    return st.text(characters, max_size=max_size)
