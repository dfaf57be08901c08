"""The dialects' names: the door a route's callers speak (app/request/routes.py) and the kind
of an upstream (app/upstream/catalog.py) are each one of these. No I/O here."""

from __future__ import annotations

OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"
KINDS = (OPENAI, ANTHROPIC, GEMINI)
