"""The providers' SDKs as users run them, pointed at a gateway or a simulator by its URL:
no retries unless asked (a retry would hide the answer under test), a key the simulator
takes. No pytest here."""

from __future__ import annotations

import anthropic
import openai
from google import genai
from google.genai import types


def openai_sdk(url: str, *, api_key: str = "k", max_retries: int = 0) -> openai.OpenAI:
    """The OpenAI SDK on ``url`` (the server's root: the SDK's base URL is its /v1)."""
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=max_retries)


def anthropic_sdk(url: str, *, api_key: str = "k", max_retries: int = 0) -> anthropic.Anthropic:
    """The Anthropic SDK on ``url`` (the server's root, as Anthropic's own base URL is)."""
    return anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=max_retries)


def gemini_sdk(url: str, *, api_key: str = "k") -> genai.Client:
    """The Gemini SDK (google-genai) on ``url``, speaking its v1beta API."""
    options = types.HttpOptions(base_url=url, api_version="v1beta")
    return genai.Client(api_key=api_key, http_options=options)
