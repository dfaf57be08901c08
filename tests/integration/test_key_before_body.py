"""The caller's key is checked before its body is read: a stranger's 15 MB upload is answered
401 while most of it is still unsent, through nginx and straight to gunicorn.

Each upload goes out on a raw socket: the headers, then the body in 64 KiB pieces with a
pause after each in which the answer may arrive. The client counts the body bytes it had
sent when the answer came: a gateway that read the body before the key, or an nginx that
buffered it first, cannot answer before the last piece, however fast the machine is.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import selectors
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.tenancy.keyring import hash_key
from tests.support.raw_http import assert_json_error

GOOD = "llmg-body-good-secret"
KEYS = {
    "good": (GOOD, ""),
    "gone": ("llmg-body-revoked-secret", "revoked = true"),
    "old": ("llmg-body-expired-secret", "expires = 2020-01-01"),
}
PIECE = 64 * 1024
BIG = 15_000_000  # under the default body limit, LLMGATE_MAX_BODY_BYTES (20 MiB)
OVER = 21 * 1024 * 1024
STRANGERS = {
    "no key": [],
    "unknown key": [("Authorization", "Bearer llmg-nobody-knows-this")],
    "revoked key": [("Authorization", f"Bearer {KEYS['gone'][0]}")],
    "expired key": [("api-key", KEYS["old"][0])],
}


@pytest.fixture(scope="module")
def keyed(make_stack, tmp_path_factory):
    path: Path = tmp_path_factory.mktemp("body-keys") / "keys.toml"
    tables = [
        "\n".join(filter(None, ["[[keys]]", f'name = "{n}"', f'sha256 = "{hash_key(s)}"', x]))
        for n, (s, x) in KEYS.items()
    ]
    path.write_text("\n\n".join(tables) + "\n")
    return make_stack(env={"LLMGATE_KEYS_FILE": str(path)})


@pytest.fixture(params=["nginx", "gunicorn"])
def base(request, keyed) -> str:
    keyed.sim_reset()
    return keyed.url if request.param == "nginx" else keyed.app_url


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the client had sent when the answer began to arrive
    sock: socket.socket  # still open: what the server does after its answer


def upload(
    url: str,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    pause: float = 0.05,
    chunked: bool = False,
    target: str = "/v1/chat/completions",
) -> Answer:
    """Send the headers, then ``body`` piece by piece, waiting up to ``pause`` after each
    piece for the answer to begin; stop sending once it has (or the server stops reading).
    The first piece goes with the headers, as a client's would: the server has body bytes
    it did not ask for when it answers."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    framing = [("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(len(body)))]
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers + framing]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sent = 0
    try:
        while sent < len(body):
            piece = body[sent : sent + PIECE]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
            if _readable(sock, pause):
                break
        if chunked and sent == len(body):
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server closed: its answer is still to be read
    try:
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        headers_in = {k.lower(): v for k, v in resp.getheaders()}
        return Answer(resp.status, headers_in, resp.read(), sent, sock)
    except BaseException:
        sock.close()
        raise


def _chat_body(size: int) -> tuple[bytes, int]:
    """A chat request of about ``size`` bytes and the words of its prompt (the simulator
    counts them as its prompt tokens: the whole body arrived)."""
    words = size // 5
    body = {"model": "sim-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": "word " * words}]}  # fmt: skip
    return json.dumps(body).encode(), words


@pytest.mark.parametrize("who", list(STRANGERS))
def test_a_stranger_gets_its_401_while_most_of_its_body_is_unsent(keyed, base, who) -> None:
    answer = upload(base, STRANGERS[who], b"x" * BIG)
    with answer.sock:
        assert_json_error((answer.status, answer.headers, answer.body), 401, "invalid_api_key")
        # Well before the end: the key was checked on the headers, and nobody buffered.
        assert answer.sent < BIG // 2, f"{answer.sent} of {BIG} bytes sent before the 401"
        if base == keyed.app_url:
            # gunicorn does not read the rest to keep the connection: it says so and ends it.
            assert answer.headers["connection"] == "close"
            answer.sock.settimeout(10)
            assert answer.sock.recv(1) == b""
    assert keyed.sim_stats()["requests"] == 0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_valid_key_with_a_big_body_is_answered(keyed, base, chunked) -> None:
    body, words = _chat_body(BIG)
    answer = upload(base, [("Authorization", f"Bearer {GOOD}")], body, pause=0, chunked=chunked)
    with answer.sock:
        assert answer.status == 200, answer.body[:300]
    assert answer.sent == len(body)
    assert json.loads(answer.body)["usage"]["prompt_tokens"] == words


def test_a_body_over_the_limit_is_a_json_413_before_it_is_sent(keyed, base) -> None:
    answer = upload(base, [("Authorization", f"Bearer {GOOD}")], b"x" * OVER)
    with answer.sock:
        assert_json_error((answer.status, answer.headers, answer.body), 413, "request_too_large")
    assert answer.sent < OVER // 2  # nginx and the app both refuse on Content-Length
    assert keyed.sim_stats()["requests"] == 0


def test_a_chunked_body_over_the_limit_is_a_json_413(keyed, base) -> None:
    # No length to refuse up front: the limit is found by counting (the app, and nginx).
    answer = upload(base, [("Authorization", f"Bearer {GOOD}")], b"x" * OVER, pause=0,
                    chunked=True)  # fmt: skip
    with answer.sock:
        assert_json_error((answer.status, answer.headers, answer.body), 413, "request_too_large")
    assert keyed.sim_stats()["requests"] == 0


def _upload_at_full_speed(url: str, size: int) -> int | str:
    """One upload with an unknown key, the body written as fast as the socket takes it by a
    thread while this one waits for the answer: its status, or how reading it failed."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer llmg-unknown\r\nContent-Length: {size}\r\n\r\n"
        )

        def write() -> None:
            with contextlib.suppress(OSError):  # refused and closed: expected
                sock.sendall(head.encode() + b"x" * size)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__
        finally:
            writer.join(30)


def test_an_early_answer_is_never_lost_to_the_unread_body(keyed, base) -> None:
    """Closing with body bytes unread sends a RST: nginx, still sending, then answers 502,
    and a client straight to gunicorn loses the answer. The worker lingers instead."""
    outcomes = Counter(_upload_at_full_speed(base, 2_000_000) for _ in range(100))
    assert outcomes == {401: 100}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_cut_short_is_refused_not_passed_on(keyed, base, chunked) -> None:
    """nginx passes the body on as it comes, so a caller that leaves mid-upload leaves the
    gateway part of a body: gunicorn reads a Content-Length body's early end as its end, and
    raises on a chunked one's. Either is a 400, never a 500, and nothing goes upstream."""
    request_id = uuid.uuid4().hex
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        framing = "Transfer-Encoding: chunked" if chunked else "Content-Length: 1000000"
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {GOOD}\r\n"
            f"X-Request-ID: {request_id}\r\n{framing}\r\n\r\n".encode()
            + (b"f4240\r\n" if chunked else b"")  # one chunk of 1,000,000 bytes, never ended
            + b"y" * 300_000
        )
        time.sleep(0.5)  # the gateway has the request before the caller leaves
    line = keyed.logged(request_id)  # the gateway is done with it
    assert keyed.sim_stats()["requests"] == 0
    assert line["status"] == 400 and line["route"] == "passthrough"


def _readable(fd: object, seconds: float) -> bool:
    """Whether ``fd`` has something to read within ``seconds``. A selector, not select(): in a
    test process with over 1,024 descriptors open (a whole suite's stacks) select() raises."""
    with selectors.DefaultSelector() as watch:
        watch.register(fd, selectors.EVENT_READ)  # type: ignore[arg-type]
        return bool(watch.select(seconds))
