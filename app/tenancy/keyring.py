"""Gateway keys: who may call, with what, and how much. No I/O here (the CLI aside).

Off unless ``LLMGATE_KEYS_FILE`` names a TOML file of ``[[keys]]`` tables. The file holds
only the SHA-256 of each key (hex), never the key: a leaked file lets nobody call. A caller
presents its key as ``Authorization: Bearer``, ``api-key`` or ``x-api-key`` (the three ways
OpenAI and Azure SDKs send one). An unknown, revoked or expired key is a 401
``invalid_api_key``; a model the key may not use a 403 ``model_not_allowed``.

    [[keys]]
    name = "team-search"               # metrics label and log field; a-z 0-9 _ . -
    sha256 = "<64 hex>"                # python -m app.tenancy.keyring new team-search
    models = ["gpt-4o-mini"]           # default: any model
    upstreams = ["openai-a"]           # default: any configured upstream
    requests_per_minute = 600          # limits: 0 or absent is no limit
    tokens_per_minute = 200000
    max_streams = 20
    tokens_per_day = 5000000
    tokens_per_month = 100000000
    usd_per_day = 50.0                 # money budgets: need the config file's [prices]
    usd_per_month = 1000.0
    max_tokens = 4096                  # caps on a request's max_tokens and n; a call that
    max_n = 1                          # names no max_tokens is sent this one
    cache_namespace = "search"         # keys naming one namespace share cached answers
    expires = 2027-01-01T00:00:00Z     # optional
    revoked = false

Make a key with ``python -m app.tenancy.keyring new NAME``: it prints the key once and the table to
paste into the file.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import re
import secrets
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.errors import BadRequest, InvalidApiKey, ModelNotAllowed
from app.core.tables import NAME, check_types
from app.request.bounds import MAX_TOKEN_FIELDS, is_count

KEY_PREFIX = "llmg-"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_LIMITS = (
    "requests_per_minute",
    "tokens_per_minute",
    "max_streams",
    "tokens_per_day",
    "tokens_per_month",
    "max_tokens",
    "max_n",
)
_BUDGETS = ("usd_per_day", "usd_per_month")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "sha256": str,
    "models": list,
    "upstreams": list,
    "cache_namespace": str,
    "expires": (datetime.datetime, datetime.date),
    "revoked": bool,
    **dict.fromkeys(_LIMITS, int),
    **dict.fromkeys(_BUDGETS, (int, float)),
}


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file, the key's table and field."""


@dataclass(frozen=True)
class GatewayKey:
    name: str
    sha256: str
    models: tuple[str, ...] = ("*",)
    upstreams: tuple[str, ...] = ("*",)
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_streams: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    max_tokens: int = 0
    max_n: int = 0
    usd_per_day: float = 0.0  # 0: no money budget
    usd_per_month: float = 0.0
    cache_namespace: str = ""
    expires: float | None = None  # Unix time
    revoked: bool = False

    @property
    def tenant(self) -> str:
        """Whose cached answers this key reads: its namespace's, else its own."""
        return "ns:" + self.cache_namespace if self.cache_namespace else "key:" + self.name

    def allows_model(self, model: str | None) -> bool:
        return "*" in self.models or model in self.models

    def allows_upstream(self, name: str) -> bool:
        return "*" in self.upstreams or name in self.upstreams

    @property
    def counts_tokens(self) -> bool:
        """Whether the key has a token limit or a money budget: its calls reserve their
        bound (app/request/bounds.py) before they go upstream."""
        return (
            bool(self.tokens_per_minute or self.tokens_per_day or self.tokens_per_month)
            or self.counts_money
        )

    @property
    def counts_money(self) -> bool:
        return bool(self.usd_per_day or self.usd_per_month)

    def check_request(self, model: str | None, body: Mapping[str, Any] | None) -> None:
        """ModelNotAllowed (403) or BadRequest (400) when the call exceeds what the key may."""
        if not self.allows_model(model):
            raise ModelNotAllowed(
                f"The key {self.name!r} may not use the model {model!r}.", param="model"
            )
        if body is None:
            return
        if self.max_tokens:
            for field_name in MAX_TOKEN_FIELDS:
                value = body.get(field_name)
                if is_count(value) and value > self.max_tokens:
                    raise BadRequest(
                        f"{field_name} is {value}; this key allows at most {self.max_tokens}.",
                        param=field_name,
                        code="max_tokens_above_limit",
                    )
        n = body.get("n")
        if self.max_n and is_count(n) and n > self.max_n:
            raise BadRequest(
                f"n is {n}; this key allows at most {self.max_n}.", param="n", code="n_above_limit"
            )


class KeyRing:
    """The keys of one file, by the SHA-256 of the key."""

    def __init__(self, keys: Iterable[GatewayKey]) -> None:
        self.keys = tuple(keys)
        self._by_hash = {k.sha256: k for k in self.keys}

    def authenticate(self, headers: Iterable[tuple[str, str]], now: float) -> GatewayKey:
        presented = presented_key(headers)
        if presented is None:
            raise InvalidApiKey(
                "This gateway needs an API key: send it as 'Authorization: Bearer <key>'."
            )
        found = self._by_hash.get(hash_key(presented))
        if found is None or found.revoked or (found.expires is not None and now >= found.expires):
            # One answer for all three: which keys exist is nobody's business.
            raise InvalidApiKey("The API key is not valid (unknown, revoked or expired).")
        return found


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def presented_key(headers: Iterable[tuple[str, str]]) -> str | None:
    """The caller's key: ``Authorization: Bearer``, else ``api-key``, else ``x-api-key``."""
    found: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered in ("authorization", "api-key", "x-api-key") and lowered not in found:
            found[lowered] = value.strip()
    auth = found.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return found.get("api-key") or found.get("x-api-key") or None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of two secrets (the operator token)."""
    return hmac.compare_digest(given.encode(), expected.encode())


def load(text: str, *, path: str = "keys") -> KeyRing:
    """The key ring of a keys file's text, or KeysFileError naming the key and field."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeysFileError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(doc) - {"keys"}
    if unknown:
        raise KeysFileError(f"{path}: unknown section or key {sorted(unknown)[0]!r}")
    tables = doc.get("keys", [])
    if not isinstance(tables, list):
        raise KeysFileError(f"{path}: keys must be [[keys]] tables")
    ring = [_key(table, i, path) for i, table in enumerate(tables)]
    for what in ("name", "sha256"):
        seen: set[str] = set()
        for i, key in enumerate(ring):
            value = getattr(key, what)
            if value in seen:
                raise KeysFileError(f"{path}: keys[{i}].{what} is used twice")
            seen.add(value)
    return KeyRing(ring)


def _key(table: dict[str, Any], index: int, path: str) -> GatewayKey:
    def fail(field_name: str, why: str) -> KeysFileError:
        return KeysFileError(f"{path}: keys[{index}].{field_name} {why}")

    check_types(table, _FIELDS, fail)
    for required in ("name", "sha256"):
        if required not in table:
            raise fail(required, "is missing")
    if not NAME.match(table["name"]):
        raise fail("name", "must be 1-63 of a-z 0-9 _ . - (it is a metrics label)")
    if not _HEX64.match(table["sha256"]):
        raise fail("sha256", "must be 64 lowercase hex digits (the key's SHA-256)")
    for limit in _LIMITS:
        if table.get(limit, 0) < 0:
            raise fail(limit, "must be >= 0 (0: no limit)")
    for budget in _BUDGETS:
        if not 0 <= table.get(budget, 0) < 1e7:  # NaN and inf too
            raise fail(budget, "must be a number of USD >= 0 and < 10,000,000 (0: none)")
    lists = {}
    for list_name in ("models", "upstreams"):
        values = table.get(list_name, ["*"])
        if not values or not all(isinstance(v, str) and v for v in values):
            raise fail(list_name, 'must be a non-empty list of names (or ["*"])')
        lists[list_name] = tuple(values)
    namespace = table.get("cache_namespace", "")
    if namespace and not NAME.match(namespace):
        raise fail("cache_namespace", "must be 1-63 of a-z 0-9 _ . -")
    return GatewayKey(
        name=table["name"],
        sha256=table["sha256"],
        models=lists["models"],
        upstreams=lists["upstreams"],
        cache_namespace=namespace,
        expires=_unix_time(table["expires"]) if "expires" in table else None,
        revoked=table.get("revoked", False),
        usd_per_day=float(table.get("usd_per_day", 0)),
        usd_per_month=float(table.get("usd_per_month", 0)),
        **{limit: table.get(limit, 0) for limit in _LIMITS},
    )


def _unix_time(value: datetime.datetime | datetime.date) -> float:
    """A TOML date or date-time as Unix time; without a zone it is UTC."""
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.timestamp()


def new_key() -> str:
    """A fresh key: the prefix and 32 random bytes, URL-safe base64."""
    return KEY_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def main(argv: list[str]) -> int:
    """``python -m app.tenancy.keyring new NAME``: a new key on stderr, its [[keys]] table on
    stdout."""
    if len(argv) != 2 or argv[0] != "new" or not NAME.match(argv[1]):
        print(
            "usage: python -m app.tenancy.keyring new NAME   (NAME: a-z 0-9 _ . -)", file=sys.stderr
        )
        return 2
    key = new_key()
    print(f"key for {argv[1]} (shown once; give it to its owner): {key}", file=sys.stderr)
    print(f'[[keys]]\nname = "{argv[1]}"\nsha256 = "{hash_key(key)}"')
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
