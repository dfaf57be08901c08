"""llmgate_client: a sync, thread-safe client for llmgate (and any OpenAI-compatible API).

Modules, imports flow downwards only:

    cli.py, __main__.py   command line: ``chat`` streams to the terminal, ``batch`` runs JSONL
    client.py             Client: chat, chat_stream, embeddings, models, map/imap
    batch.py              bounded fan-out on a ThreadPoolExecutor, results in input order
    stream.py             ChatStream: SSE (llmgate_wire.sse) to chunks and text deltas
    resume.py             a dropped resumable stream: the offer, event numbers, the reconnect
    transport.py          the only urllib3 importer: one keep-alive pool, error translation
    policy.py, config.py  pure values: Timeout, Deadline, RetryPolicy, ResumePolicy; base URL
                          and env
    errors.py             the error tree

It imports nothing from the gateway (``app``): what both read off the wire, the SSE codec and
the retry-after parser, is ``llmgate_wire``, which ships with it in the ``llmgate-client``
distribution. It needs urllib3 and the standard library only, so importing it pulls in neither
Flask nor gevent. Nothing opens a socket at import time.
"""

from __future__ import annotations

from .batch import Outcome
from .client import Client, Result
from .errors import (
    APIConnectionError,
    APIResponseError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadGatewayError,
    BadRequestError,
    DeadlineExceeded,
    GatewayTimeoutError,
    IncompleteStreamError,
    InternalServerError,
    LLMGateError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    ServiceUnavailableError,
    StreamError,
    UnprocessableEntityError,
)
from .policy import ResumePolicy, RetryPolicy, Timeout
from .stream import ChatStream

__all__ = [
    "APIConnectionError",
    "APIResponseError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadGatewayError",
    "BadRequestError",
    "ChatStream",
    "Client",
    "DeadlineExceeded",
    "GatewayTimeoutError",
    "IncompleteStreamError",
    "InternalServerError",
    "LLMGateError",
    "NotFoundError",
    "Outcome",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "Result",
    "ResumePolicy",
    "RetryPolicy",
    "ServiceUnavailableError",
    "StreamError",
    "Timeout",
    "UnprocessableEntityError",
]
