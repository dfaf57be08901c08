"""10,000 malformed requests through nginx on raw sockets: the gateway never fails itself.

A seeded generator (``LLMGATE_FUZZ_SEED``, ``LLMGATE_FUZZ_REQUESTS`` to change them) writes
requests no SDK would: broken and deeply nested JSON, huge numbers, NaN, invalid UTF-8 and
lone surrogates, odd methods, paths, versions and headers, duplicated or conflicting
lengths, chunked bodies gone wrong, oversized and truncated bodies, hostile cache controls,
and a few well-formed calls the simulator fails on purpose. Every answer must be an OpenAI
error in JSON (or, for a call that works, the answer itself); no 5xx may be the gateway's
own (an upstream's 502/504 is told apart by its error type and the X-LLMGate-Upstream
header); no log may hold a traceback; and afterwards the gateway answers normally.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

SEED = int(os.environ.get("LLMGATE_FUZZ_SEED", "20261130"))
REQUESTS = int(os.environ.get("LLMGATE_FUZZ_REQUESTS", "10000"))
MAX_BODY = 65536  # the stack's LLMGATE_MAX_BODY_BYTES: oversized bodies stay cheap to send
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
# 5xx answers that are an upstream's, relayed: their error type and code say so (nginx's own
# 504 is a timeout_error too, but gateway_timeout: the gateway's).
UPSTREAM_TYPES = {"upstream_error"}
UPSTREAM_TIMEOUTS = {"connect_timeout", "first_byte_timeout", "idle_timeout", "deadline_timeout"}


@dataclass
class Case:
    kind: str
    raw: bytes
    # Close our write side after sending: for a body shorter than its length, so the server
    # sees the end instead of waiting for the rest (nginx then answers nothing: 499).
    eof: bool = False


# -- bodies ---------------------------------------------------------------------------------


def _valid_body(rng: random.Random, path: str) -> dict:
    body: dict = {"model": rng.choice(["sim-model", "gpt-4o-mini", "", "x" * 300])}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": f"fuzz {rng.randrange(10**6)}"}]
    elif path.endswith("/completions"):
        body["prompt"] = rng.choice(["fuzz", ["a", "b"], [1, 2, 3]])
    else:
        body["input"] = rng.choice(["fuzz", ["a"], [[1, 2]]])
    body["max_tokens"] = rng.choice([1, 2, 3])
    if rng.random() < 0.3:
        body["stream"] = rng.choice([True, False, "yes", 1, None])
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0, 0.0, 1, -1, "0"])
    if rng.random() < 0.15:
        body["cache"] = rng.choice(
            [{"ttl": 5}, {"ttl": -1}, {"no-cache": True}, {"namespace": "x" * 70}, [], "x"]
        )
    return body


def _hostile_json(rng: random.Random, path: str) -> bytes:
    base = json.dumps(_valid_body(rng, path)).encode()
    choice = rng.randrange(14)
    if choice == 0:  # cut anywhere
        return base[: rng.randrange(len(base))]
    if choice == 1:  # a byte changed
        i = rng.randrange(len(base))
        return base[:i] + bytes([rng.randrange(256)]) + base[i + 1 :]
    if choice == 2:  # nested deep
        depth = rng.choice([63, 64, 65, 200, 5000, 30000])
        opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        return b'{"model":"sim-model","messages":' + opener * depth + b"1" + closer * depth + b"}"
    if choice == 3:  # huge or special numbers
        number = rng.choice(
            [b"1e999", b"-1e999", b"NaN", b"Infinity", b"-0", b"9" * 5000, b"1" * 4301,
             b"0." + b"0" * 3000 + b"1", b"1e-999", b"123456789012345678901234567890"]
        )  # fmt: skip
        field = rng.choice([b"max_tokens", b"temperature", b"n", b"seed", b"top_p"])
        return base[:-1] + b', "' + field + b'": ' + number + b"}"
    if choice == 4:  # invalid UTF-8 inside a string
        junk = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        return base.replace(b"fuzz", b"fu" + junk + b"zz", 1)
    if choice == 5:  # escaped lone surrogates
        return base.replace(b"fuzz", rng.choice([b"\\ud800", b"\\udfff\\ud800", b"\\u0000"]), 1)
    if choice == 6:  # not an object
        return rng.choice([b"[]", b"null", b"1", b'"x"', b"", b" ", b"{}", b"\x00"])
    if choice == 7:  # cache controls of any size
        ttl = rng.choice([b"1e999", b"NaN", b"-1", b"1e30", b'"5"', b"9" * 400, b"true"])
        key = rng.choice([b"ttl", b"s-maxage", b"namespace"])
        return base[:-1] + b', "temperature": 0, "cache": {"' + key + b'": ' + ttl + b"}}"
    if choice == 8:  # fields that steer the upstream
        steer = rng.choice(["api_base", "base_url", "azure_endpoint"])
        return json.dumps({**json.loads(base), steer: "http://169.254.169.254/"}).encode()
    if choice == 9:  # a long array
        return b'{"model":"sim-model","prompt":[' + b"0," * rng.choice([10, 30000]) + b"0]}"
    if choice == 10:  # duplicate keys, odd types
        return base[:-1] + b', "model": ["a"], "messages": {"x": 1}}'
    if choice == 11:  # oversized
        return (
            b'{"model":"sim-model","prompt":"' + b"x" * (MAX_BODY + rng.randrange(1, 5000)) + b'"}'
        )
    if choice == 12:  # random bytes
        return rng.randbytes(rng.randrange(1, 300))
    return base


# -- requests -------------------------------------------------------------------------------


def _request(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    version: str = "HTTP/1.1",
    eol: bytes = b"\r\n",
    length: bool = True,
) -> bytes:
    lines = [f"{method} {target} {version}".encode("latin-1")]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    if length and body:
        lines.append(f"Content-Length: {len(body)}".encode())
    return eol.join(lines) + eol + eol + body


def _basic_headers(rng: random.Random) -> list[tuple[str, str]]:
    headers = [("Host", "127.0.0.1"), ("Connection", "close")]
    if rng.random() < 0.9:
        headers.append(("Content-Type", "application/json"))
    if rng.random() < 0.3:
        headers.append(("Authorization", rng.choice(["Bearer sk-fuzz", "Bearer", "", "Basic !!"])))
    return headers


def make_case(rng: random.Random) -> Case:
    path = rng.choice(PATHS)
    headers = _basic_headers(rng)
    roll = rng.random()
    if roll < 0.45:
        return Case("json", _request("POST", path, headers, _hostile_json(rng, path)))
    if roll < 0.55:
        method = rng.choice(
            ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "HEAD", "get", "FOO",
             "CONNECT", "M" * 40, "PO ST", "POST\x00"]
        )  # fmt: skip
        return Case("method", _request(method, path, headers, b"{}"))
    if roll < 0.68:
        target = rng.choice(
            ["/v1/../admin", "/v1/%2e%2e/x", "/v1//models", "/v1/%2F..", "/v1/models/%00",
             "/v1/a%0d%0ab", "/v1/models?api-key=x&x=%ff", "/v1/\xff\xfe", "/v1/" + "a" * 5000,
             "/v1/models/" + "%41" * 2000, "*", "http://evil/v1/models", "/../../etc/passwd",
             "/v1/chat/completions/", "/V1/MODELS", "/v1/models#frag", "/v1/%zz", "",
             "/metrics/../v1/models", "/healthz?" + "q" * 9000]
        )  # fmt: skip
        body = json.dumps(_valid_body(rng, path)).encode() if rng.random() < 0.5 else b""
        return Case("path", _request(rng.choice(["GET", "POST"]), target, headers, body))
    if roll < 0.80:
        body = json.dumps(_valid_body(rng, path)).encode()
        extra = rng.choice(
            [[(f"X-Filler-{i}", "x") for i in range(rng.choice([99, 101, 200]))],
             [("X-Big", "b" * rng.choice([8000, 9000, 40000]))],
             [("Content-Type", "application/json")],
             [("Content-Type", "text/plain; charset=\xff")],
             [("Cache-Control", rng.choice(["max-age=\xb2", "max-age=" + "9" * 5000,
                                             "s-maxage=-1", "no-cache, max-age=x"]))],
             [("X-Request-ID", rng.choice(["", "x" * 500, "a b", "\x01"]))],
             [("Transfer-Encoding", "chunked")],
             [("Expect", "100-continue")],
             [("Host", "")], [("Host", "a"), ("Host", "b")],
             [("x-stainless-retry-count", rng.choice(["-1", "x", "99999999999999999999"]))],
             [("Content-Encoding", "gzip")], [("X-Forwarded-For", "1.1.1.1, evil")],
             [("Bad Name", "x")], [("X-Fold", "a\r\n b")]]
        )  # fmt: skip
        return Case("header", _request("POST", path, headers + extra, body))
    if roll < 0.88:
        body = json.dumps(_valid_body(rng, path)).encode()
        how = rng.randrange(6)
        if how == 0:  # says more than it sends (the write side is closed after sending)
            head = [*headers, ("Content-Length", str(len(body) + rng.randrange(1, 500)))]
            return Case("length", _request("POST", path, head, body, length=False), eof=True)
        if how == 1:  # says less than it sends: the rest is a second, broken request
            head = [*headers, ("Content-Length", str(rng.randrange(len(body))))]
            return Case("length", _request("POST", path, head, body, length=False))
        if how == 2:  # conflicting lengths
            head = [*headers, ("Content-Length", str(len(body))), ("Content-Length", "3")]
            return Case("length", _request("POST", path, head, body, length=False))
        if how == 3:  # chunked gone wrong
            chunked = rng.choice(
                [b"zz\r\n" + body + b"\r\n0\r\n\r\n", b"%x\r\n" % (len(body) + 9) + body,
                 b"%x\r\n" % len(body) + body + b"\r\n", b"-1\r\n\r\n"]
            )  # fmt: skip
            head = [*headers, ("Transfer-Encoding", "chunked")]
            return Case("chunked", _request("POST", path, head, chunked, length=False), eof=True)
        if how == 4:  # both framings
            head = [*headers, ("Transfer-Encoding", "chunked"), ("Content-Length", "5")]
            return Case("chunked", _request("POST", path, head, body, length=False))
        return Case("length", _request("POST", path, headers, body[: len(body) // 2] or b"{"))
    if roll < 0.95:
        version = rng.choice(["HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1 x", "HTTX/1.1", ""])
        eol = rng.choice([b"\r\n", b"\n"])
        body = json.dumps(_valid_body(rng, path)).encode()
        return Case("line", _request("POST", path, headers, body, version=version, eol=eol))
    # Well-formed calls the simulator fails: an upstream's 5xx, not the gateway's.
    body = json.dumps({**_valid_body(rng, PATHS[0]), "model": "sim-model"}).encode()
    fault = rng.choice(["500", "503", "reset", "reset-before", "error-after", "429"])
    return Case("upstream", _request("POST", PATHS[0], [*headers, ("x-sim-fault", fault)], body))


# -- the exchange ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int | None
    headers: dict[str, str]
    body: bytes


def exchange(port: int, case: Case) -> list[Answer]:
    """Send the case's bytes, read everything back until the server closes: the answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(case.raw)
            if case.eof:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before the whole request is sent
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return parse_answers(data)


def parse_answers(data: bytes) -> list[Answer]:
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            answers.append(Answer(None, {}, data))
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            data = rest
            continue
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0] or b"0", 16)
                if size == 0:
                    rest = rest.partition(b"\r\n")[2]
                    break
                body, rest = body + rest[:size], rest[size + 2 :]
        elif "content-length" in headers:
            length = int(headers["content-length"])
            body, rest = rest[:length], rest[length:]
        else:
            body, rest = rest, b""
        answers.append(Answer(status, headers, body))
        data = rest
    return answers


def judge(case: Case, answers: list[Answer]) -> str | None:
    """None when every answer is acceptable, else what is wrong."""
    for answer in answers:
        if case.raw.startswith(b"HEAD ") and answer.status is not None:
            continue  # no body to judge
        if answer.status is None:
            if not case.raw.split(b"\n", 1)[0].rstrip(b"\r").endswith(b" "):
                return f"an answer that is not HTTP: {answer.body[:100]!r}"
            # No version in the request line is HTTP/0.9 to nginx: a bare body comes back.
            answer = Answer(400, {"content-type": "application/json"}, answer.body)
        assert answer.status is not None  # set just above when the answer had none
        ctype = answer.headers.get("content-type", "")
        if answer.status < 400:
            if answer.status >= 300:
                return f"a redirect {answer.status}"
            if answer.status == 204 or case.raw.startswith(b"OPTIONS "):
                continue  # Flask answers OPTIONS itself: an empty 200 with Allow
            if ctype.startswith("text/event-stream"):
                continue  # a stream that works
            try:
                json.loads(answer.body)
            except ValueError:
                return f"{answer.status} not JSON: {answer.body[:100]!r}"
            continue
        if not ctype.startswith("application/json"):
            return f"{answer.status} {ctype}: {answer.body[:100]!r}"
        try:
            error = json.loads(answer.body)["error"]
            assert set(error) >= {"message", "type", "param", "code"}
        except (ValueError, KeyError, TypeError, AssertionError):
            return f"{answer.status} not an OpenAI error: {answer.body[:100]!r}"
        if answer.status in (501, 505) and error["type"] == "invalid_request_error":
            continue  # HTTP's own 5xx for what the caller sent: a transfer coding, a version
        if answer.status >= 500:
            upstream = (
                error["type"] in UPSTREAM_TYPES
                or error["code"] in UPSTREAM_TIMEOUTS
                or "x-llmgate-upstream" in answer.headers
            )
            if not upstream:
                return f"the gateway's own {answer.status}: {error}"
    return None


@pytest.mark.slow
def test_ten_thousand_malformed_requests_through_nginx(make_stack) -> None:
    gw = make_stack(
        env={
            "LLMGATE_MAX_BODY_BYTES": str(MAX_BODY),
            "LLMGATE_RETRIES": "0",
            "LLMGATE_CACHE_MODE": "all",
        }
    )
    gw.sim_reset()
    port = int(gw.url.rsplit(":", 1)[1])
    logs_before = {name: len(gw.log(name)) for name in ("gunicorn", "nginx")}
    rng = random.Random(SEED)
    cases = [make_case(rng) for _ in range(REQUESTS)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(lambda c: (c, exchange(port, c)), cases))
    elapsed = time.monotonic() - started
    statuses = Counter(a.status for _, answers in results for a in answers)
    silent = sum(1 for _, answers in results if not answers)
    kinds = Counter(c.kind for c in cases)
    print(f"\nfuzz corpus seed={SEED}: {REQUESTS} requests in {elapsed:.1f} s; "
          f"kinds {dict(kinds)}; statuses {dict(sorted(statuses.items(), key=str))}; "
          f"no answer (body cut short, connection closed) {silent}")  # fmt: skip
    failures = [(c.kind, c.raw[:160], why) for c, a in results if (why := judge(c, a))]
    reasons = Counter(why[:60] for _, _, why in failures)
    assert not failures, f"seed={SEED}: {len(failures)} bad answers {reasons}, e.g. {failures[:5]}"
    # No traceback (nor an unhandled error of the app) in any log, nginx's included.
    for name, start in logs_before.items():
        text = gw.log(name)[start:]
        for marker in ("Traceback", "unhandled error", "[crit]", "[alert]", "[emerg]"):
            assert marker not in text, (
                f"seed={SEED}: {name} log: {text[text.find(marker) - 300 :][:1500]}"
            )
    # Still answering normally.
    after = {"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
    resp = gw.post("/v1/chat/completions", after)
    assert resp.status == 200, resp.data[:300]
    assert json.loads(resp.data)["choices"][0]["message"]["content"]
