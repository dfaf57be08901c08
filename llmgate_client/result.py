"""``Result``: a parsed JSON response body that is a plain ``dict``, plus facts about the call.

It subclasses ``dict`` so that code written for the OpenAI wire format (``r["choices"]``)
and ``json.dumps(r)`` work unchanged; the call's facts ride along as attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Result(dict[str, Any]):
    """A parsed JSON response body (a plain ``dict``) plus facts about the call."""

    def __init__(
        self,
        body: dict[str, Any],
        *,
        headers: Mapping[str, str],
        attempts: int,
        elapsed: float,
    ) -> None:
        super().__init__(body)
        self.headers = dict(headers)
        self.request_id: str | None = headers.get("x-request-id")
        self.attempts = attempts
        self.elapsed = elapsed

    @property
    def text(self) -> str | None:
        """The first choice's message content of a chat completion, else None."""
        choices = self.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                return str(message["content"])
        return None
