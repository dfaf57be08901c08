"""gunicorn's HTTP parsers side by side: `python -m bench.cpu.parser`.

The CPU gunicorn spends parsing one request as nginx sends it to the gateway (a chat call from
the OpenAI SDK: 14 headers, a 120-byte body), with its pure-Python parser and, when the
``gunicorn_h1c`` package is installed, its C parser (``http_parser = "fast"``, gunicorn 25+).
The request is read from memory, so this is the parser alone: what choosing it can save a
call at most (bench/HISTORY.md, "gunicorn's C parser"). The best and the median of five
rounds, µs per request.
"""

from __future__ import annotations

import importlib.util
import io
import statistics
import time

from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

HEADERS = [
    ("Host", "127.0.0.1:8080"),
    ("X-Real-IP", "127.0.0.1"),
    ("X-Forwarded-For", "127.0.0.1"),
    ("X-Forwarded-Proto", "http"),
    ("X-Request-ID", "0123456789abcdef0123456789abcdef"),
    ("Connection", "keep-alive"),
    ("Content-Length", "120"),
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer sk-test"),
    ("User-Agent", "OpenAI/Python 1.0"),
    ("Accept", "application/json"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Package-Version", "1.0"),
    ("X-Stainless-Retry-Count", "0"),
]
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\n"
    + b"".join(f"{k}: {v}\r\n".encode() for k, v in HEADERS)
    + b"\r\n"
    + b"x" * 120
)


class _Socket:
    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def recv(self, size: int) -> bytes:
        return self._data.read(size)


def us_per_request(parser: str, requests: int = 20000, rounds: int = 5) -> tuple[float, float]:
    cfg = Config()
    cfg.set("http_parser", parser)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(requests):
            request = next(RequestParser(cfg, _Socket(REQUEST), ("127.0.0.1", 1)))
            request.body.read()
        times.append((time.perf_counter() - started) / requests * 1e6)
    return min(times), statistics.median(times)


def main() -> None:
    parsers = ["python"]
    if importlib.util.find_spec("gunicorn_h1c") is not None:
        parsers.append("fast")
    else:
        print("gunicorn_h1c is not installed: the C parser is not measured")
    for parser in parsers:
        best, median = us_per_request(parser)
        print(f"{parser:7} {best:6.1f} µs/request best, {median:6.1f} median")


if __name__ == "__main__":
    main()
