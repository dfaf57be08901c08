"""Where the client points and with which key. Pure: the environment is passed in.

``base_url`` is the API root, the same string as the OpenAI SDK's ``OPENAI_BASE_URL``
(``http://host:8080/v1``). A URL without ``/v1`` at the end of its path gets it appended, so
``http://host:8080`` and ``http://host:8080/v1`` name the same API; a path prefix before it is
kept (``https://edge/llm`` becomes ``https://edge/llm/v1``).

Resolution order for each value: the explicit argument, then ``LLMGATE_*``, then
``OPENAI_*``, then the local gateway (``http://127.0.0.1:8080``) and no key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
API_PREFIX = "/v1"


@dataclass(frozen=True)
class Endpoint:
    """``origin`` (scheme://host:port) for the connection pool, ``prefix`` for request paths."""

    origin: str
    prefix: str

    @property
    def base_url(self) -> str:
        return self.origin + self.prefix

    def url(self, path: str) -> str:
        return self.prefix + "/" + path.lstrip("/")


def parse_base_url(base_url: str) -> Endpoint:
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"base_url must not have a query or fragment: {base_url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(API_PREFIX):
        path += API_PREFIX
    return Endpoint(origin=f"{parts.scheme}://{parts.netloc}", prefix=path)


def resolve_base_url(explicit: str | None, environ: Mapping[str, str]) -> str:
    for value in (explicit, environ.get("LLMGATE_BASE_URL"), environ.get("OPENAI_BASE_URL")):
        if value:
            return value
    return DEFAULT_BASE_URL


def resolve_api_key(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    for value in (explicit, environ.get("LLMGATE_API_KEY"), environ.get("OPENAI_API_KEY")):
        if value:
            return value
    return None
