"""A scripted HTTP/1.1 server on loopback for the client's unit tests (no tests in here).

Real TCP, keep-alive, chunked streaming and precise faults (stall, reset, cut a stream), with
counters the tests assert on: connections accepted, requests, streams abandoned, the most
requests in flight at once. Each test passes an ``app(request, exchange)`` function.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    number: int  # 1-based, across the server's life

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    abandoned: int = 0
    completed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    paths: list[str] = field(default_factory=list)


class Exchange:
    """The server side of one request: write a response, stream events, or misbehave."""

    def __init__(self, sock: socket.socket, server: LoopbackServer) -> None:
        self.sock = sock
        self.server = server
        self.keep_alive = True

    def respond(
        self, status: int = 200, body: Any = b"", headers: dict[str, str] | None = None
    ) -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"content-type": "application/json", **(headers or {})}
        head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(head.encode() + b"\r\n" + body)

    def start_stream(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        merged = {"content-type": "text/event-stream", "x-request-id": "req-stream"}
        merged.update(headers or {})
        head = f"HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in merged.items())
        self.sock.sendall(head.encode() + b"\r\n")

    def send(self, data: bytes) -> bool:
        """One chunk; False (and the stream counted abandoned) when the client has gone."""
        if self.client_gone():
            return self._abandoned()
        try:
            self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError:
            return self._abandoned()
        return True

    def finish(self) -> None:
        """End the body. Counted before the last bytes leave: a client that has read the end
        of the body (and a test that asserts right after it) always finds it counted."""
        with self.server.lock:
            self.server.stats.completed += 1
        try:
            self.sock.sendall(b"0\r\n\r\n")
        except OSError:
            with self.server.lock:
                self.server.stats.completed -= 1
            self._abandoned()
            raise

    def client_gone(self, wait: float = 0.0) -> bool:
        """True when the client closed its end (EOF or reset on our side)."""
        self.sock.settimeout(wait or 0.0001)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            return True
        finally:
            self.sock.settimeout(None)

    def wait_gone(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return early (True) when the client disconnects."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.client_gone(min(0.05, max(0.001, end - time.monotonic()))):
                return True
        return False

    def reset(self) -> None:
        """Abort the connection with a TCP RST."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        self.keep_alive = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _abandoned(self) -> bool:
        with self.server.lock:
            self.server.stats.abandoned += 1
        self.close()
        return False


App = Callable[[Request, Exchange], None]


class LoopbackServer:
    """``with LoopbackServer(app) as srv: srv.url``; one thread per connection."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.stats = Stats()
        self.lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._stopping = False

    def __enter__(self) -> LoopbackServer:
        thread = threading.Thread(target=self._accept_loop, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        for sock in list(self._socks):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in list(self._socks):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.stats.connections += 1
                self._socks.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        exchange = Exchange(sock, self)
        try:
            while exchange.keep_alive and not self._stopping:
                request = self._read_request(reader)
                if request is None:
                    return
                with self.lock:
                    self.stats.in_flight += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
                try:
                    self.app(request, exchange)
                finally:
                    with self.lock:
                        self.stats.in_flight -= 1
        except OSError:
            return
        finally:
            reader.close()
            with contextlib.suppress(OSError):
                sock.close()

    def _read_request(self, reader: Any) -> Request | None:
        line = reader.readline()
        if not line:
            return None
        method, path, _ = line.decode().split(" ", 2)
        headers: dict[str, str] = {}
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = reader.read(int(headers.get("content-length", "0")))
        with self.lock:
            self.stats.requests += 1
            self.stats.paths.append(path)
            number = self.stats.requests
        return Request(method, path, headers, body, number)


# -- canned responses ----------------------------------------------------------------------


def completion(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        **extra,
    }


def chunk(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    body = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error_body(message: str, type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def stream_tokens(exchange: Exchange, tokens: list[str], gap: float = 0.0) -> bool:
    """Stream ``tokens`` then [DONE]; False when the client left part way."""
    exchange.start_stream()
    for token in tokens:
        if not exchange.send(chunk(token)):
            return False
        if gap and exchange.wait_gone(gap):
            return exchange._abandoned()
    if not exchange.send(chunk(None, "stop")) or not exchange.send(DONE):
        return False
    exchange.finish()
    return True


@contextlib.contextmanager
def serve(app: App) -> Iterator[LoopbackServer]:
    with LoopbackServer(app) as server:
        yield server
