"""The checks both TOML files (upstreams, gateway keys) make of each table they read: known
fields, each of its type, and the form of the names they give. No I/O here."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# The names both files give (an upstream's, a key's, a key's cache namespace): a lower-case
# letter or digit, then up to 62 more of those or '_', '.', '-'.
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def check_types(
    table: Mapping[str, Any],
    fields: Mapping[str, type | tuple[type, ...]],
    fail: Callable[[str, str], Exception],
) -> None:
    """Every entry of a TOML table is one of ``fields`` and of its type (a boolean only where
    a boolean is asked for: Python counts it as an int); else ``fail(field, why)`` raised."""
    for key, value in table.items():
        kinds = fields.get(key)
        if kinds is None:
            raise fail(key, "is not a known field")
        if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool):
            raise fail(key, f"has the wrong type ({type(value).__name__})")
