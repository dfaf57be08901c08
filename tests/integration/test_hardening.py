"""Hostile input over real TCP: through nginx, and straight to gunicorn where nginx would
hide what the gateway itself does. Each test names the control it holds (docs/security.md).

What the upstream received is read from the simulator's request log (the raw request target
it parsed), and "the gateway never connected there" is counted by a scripted server at the
address the attack names (tests/support/scripted_server.py).
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.config import Settings
from runner.nginx import NginxParams, start_nginx
from runner.procs import free_port
from tests.support.raw_http import assert_json_error, request_head, send_raw
from tests.support.scripted_server import Exchange, LoopbackServer, Request, completion, serve

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
METADATA = "169.254.169.254"


def chat_bytes(**extra: object) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


def send(url: str, method: str, target: str, headers=(), body: bytes = b""):
    headers = list(headers)
    if body:
        headers.append(("Content-Type", "application/json"))
    return send_raw(url, request_head(method, target, headers, body=body), body)


def bases(gw) -> list[tuple[str, str]]:
    return [("nginx", gw.url), ("gunicorn", gw.app_url)]


@pytest.fixture
def elsewhere() -> Iterator[LoopbackServer]:
    """Another host on loopback that an attack names; nothing may ever connect to it."""

    def app(request, exchange) -> None:
        exchange.respond(200, completion("from elsewhere"))

    with serve(app) as server:
        yield server


def memcached_connections(address: str) -> int:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += sock.recv(65536)
    stats = dict(line.split()[1:3] for line in data.decode().splitlines() if line.count(" ") == 2)
    return int(stats["total_connections"])


# -- paths ---------------------------------------------------------------------------------

# request target -> (status, code) the gateway answers; None: forwarded (the simulator's 404).
PATHS = {
    "/v1/../admin": (400, "invalid_path"),
    "/v1/%2e%2e/admin": (400, "invalid_path"),
    "/v1/%2E%2E/%2e%2e/admin": (400, "invalid_path"),
    "/v1/models/..%2F..%2Fadmin": (400, "invalid_path"),
    "/v1/./models": (400, "invalid_path"),
    "/v1/chat//completions": (400, "invalid_path"),
    "/v1//models": (404, "unknown_url"),
    "/v1/%2F../admin": (404, "unknown_url"),
    "/v1/a%5C..%5Cadmin": (400, "invalid_path"),
    "/v1/a%00b": (400, "invalid_path"),
    "/v1/foo%3Fq=1": None,
    "/v1/foo%23frag": None,
}
# nginx refuses these itself: a path climbing above the root, an encoded NUL.
NGINX_REFUSES = {"/v1/%2E%2E/%2e%2e/admin", "/v1/a%00b"}
# What the simulator must receive for the forwarded ones: the caller's bytes, still data.
FORWARDED = {"/v1/foo%3Fq=1": ("/v1/foo%3Fq=1", ""), "/v1/foo%23frag": ("/v1/foo%23frag", "")}


@pytest.mark.parametrize("target", PATHS)
def test_paths_never_leave_v1(gw, target: str) -> None:
    """Dot segments, doubled slashes and their percent-encoded forms never reach the upstream
    outside /v1 (urllib3 resolves dot segments in the URL it is given, nginx passes the
    caller's target on as sent, gunicorn decodes it)."""
    expected = PATHS[target]
    for name, url in bases(gw):
        gw.sim_reset()
        status, headers, body = send(url, "GET", target)
        seen = [(r["path"], r["query"]) for r in gw.sim_requests()]
        if expected is None:
            assert seen == [FORWARDED[target]], (name, seen)
            assert status == 404 and json.loads(body)["error"], (name, status, body)
        else:
            if name == "nginx" and target in NGINX_REFUSES:
                assert_json_error((status, headers, body), 400, "bad_request")
            else:
                assert_json_error((status, headers, body), *expected)
            assert seen == [], (name, seen)


# -- where the gateway connects ------------------------------------------------------------


def test_host_and_absolute_form_never_choose_the_upstream(gw, elsewhere) -> None:
    """Host, an absolute-form request target and the forwarding headers name other hosts
    (another server, the cloud metadata address, Memcached, file://): the call still goes
    to the configured upstream, and nothing connects anywhere else."""
    other = f"127.0.0.1:{elsewhere.port}"
    memcached = gw.stack.memcached_addr
    before = memcached_connections(memcached)
    attempts = [
        ("/v1/chat/completions", [("Host", other)]),
        ("/v1/chat/completions", [("Host", METADATA)]),
        ("/v1/chat/completions", [("Host", memcached)]),
        (f"http://{other}/v1/chat/completions", []),
        (f"http://{memcached}/v1/chat/completions", [("Host", memcached)]),
        (f"http://{METADATA}/v1/chat/completions", []),
        (
            "/v1/chat/completions",
            [("X-Forwarded-Host", other), ("Forwarded", f"host={other}"), ("X-Host", other)],
        ),
    ]
    for name, url in bases(gw):
        for target, headers in attempts:
            gw.sim_reset()
            # request_head writes its own Host line first; a second one overrides it at
            # nginx (the absolute form wins there) and is a duplicate for gunicorn.
            head = request_head("POST", target, [], body=chat_bytes())
            if headers and headers[0][0] == "Host":
                head = head.replace(b"Host: 127.0.0.1", f"Host: {headers[0][1]}".encode())
                headers = headers[1:]
            head = head.replace(
                b"\r\n\r\n",
                b"".join(f"\r\n{k}: {v}".encode() for k, v in headers)
                + b"\r\nContent-Type: application/json\r\n\r\n",
            )
            status, _, body = send_raw(url, head, chat_bytes())
            assert status == 200, (name, target, headers, body[:300])
            assert json.loads(body)["object"] == "chat.completion"
            # The upstream sees its own name: a shared proxy in front of it routes by Host.
            seen = gw.sim_requests()
            assert [r["headers"]["host"] for r in seen] == [gw.sim_url.removeprefix("http://")]
    assert elsewhere.stats.connections == 0
    # Ours: the stats connection itself. The gateway's cache client is already connected,
    # and these calls are not cached (no temperature 0).
    assert memcached_connections(memcached) - before == 1


@pytest.mark.parametrize(
    "value",
    [
        "http://127.0.0.1:{port}/v1",
        f"http://{METADATA}/latest/meta-data/",
        "http://{memcached}/",
        "file:///etc/passwd",
    ],
)
def test_body_fields_naming_a_host_are_refused(gw, elsewhere, value: str) -> None:
    value = value.format(port=elsewhere.port, memcached=gw.stack.memcached_addr)
    for field in ("api_base", "base_url"):
        for name, url in bases(gw):
            answer = send(url, "POST", "/v1/chat/completions", body=chat_bytes(**{field: value}))
            error = assert_json_error(answer, 400, "parameter_not_allowed")
            assert error["param"] == field, (name, error)
    assert gw.sim_requests() == []
    assert elsewhere.stats.connections == 0


@pytest.fixture(scope="module")
def redirect_target() -> Iterator[LoopbackServer]:
    def app(request, exchange) -> None:
        exchange.respond(200, completion("followed"))

    with serve(app) as server:
        yield server


@pytest.fixture(scope="module")
def redirecting(redirect_target) -> Iterator[LoopbackServer]:
    """An upstream that answers every call with a redirect: to the metadata address for
    /v1/metadata/..., else to another server on loopback that counts its connections."""

    def app(request, exchange) -> None:
        status = 307 if "temporary" in request.path else 302
        where = (
            f"http://{METADATA}/latest/meta-data/"
            if "metadata" in request.path
            else (redirect_target.url + "/v1/chat/completions")
        )
        exchange.respond(status, b"", {"location": where})

    with serve(app) as server:
        yield server


def test_upstream_redirects_are_never_followed(make_stack, redirecting, redirect_target) -> None:
    """The gateway itself never connects where a redirect points, nor to the metadata address.
    A generation call's redirect is a 502 that names no location (the caller's SDK would
    send the prompt past the gateway); on other paths it goes back to the caller as the
    upstream's answer (a following client goes there from the caller's machine)."""
    gw = make_stack(upstream_url=redirecting.url + "/v1", memcached=False)
    cases = [
        ("POST", "/v1/chat/completions", chat_bytes(), 502, None),
        ("POST", "/v1/chat/completions", chat_bytes(stream=True), 502, None),
        ("GET", "/v1/metadata/models", b"", 302, METADATA),
        ("POST", "/v1/temporary/files", b"{}", 307, redirect_target.url),
    ]
    for name, url in bases(gw):
        for method, target, body, want, where in cases:
            requests = redirecting.stats.requests
            status, headers, answer = send(url, method, target, body=body)
            assert status == want, (name, target, status)
            if where is None:
                assert_json_error((status, headers, answer), 502, "upstream_redirect")
                assert "location" not in headers
            else:
                assert where in headers["location"]
            assert redirecting.stats.requests == requests + 1
    assert redirect_target.stats.connections == 0


# -- header values and forwarding headers ----------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [b"X-Test: a\rb", b"X-Test: a\r\n b", b"X-Test: a\x00b", b"Authorization: Bearer k\rX: y"],
)
def test_cr_lf_and_nul_in_header_values_are_refused(gw, line: bytes) -> None:
    """A bare CR, an obsolete line fold and a NUL are refused by whichever server reads the
    header first (the app refuses them too, tests/unit/request/test_header_values.py)."""
    for name, url in bases(gw):
        head = request_head("GET", "/v1/models", []).replace(
            b"\r\n\r\n", b"\r\n" + line + b"\r\n\r\n"
        )
        assert assert_json_error(send_raw(url, head), 400, "bad_request"), name
    assert gw.sim_requests() == []


@pytest.fixture
def nginx_to_a_recorder() -> Iterator[tuple[str, LoopbackServer]]:
    """Our nginx config in front of a server that records what nginx sends on."""

    def app(request, exchange) -> None:
        exchange.respond(200, {"ok": True})

    with serve(app) as recorder, tempfile.TemporaryDirectory(prefix="nginx-") as prefix:
        listen = f"127.0.0.1:{free_port()}"
        params = NginxParams.for_settings(
            Settings(), listen=listen, app_servers=[f"127.0.0.1:{recorder.port}"]
        )
        Path(prefix).chmod(0o755)
        proc = start_nginx(Path(prefix), params, log_path=Path(prefix) / "nginx.log")
        try:
            yield f"http://{listen}", recorder
        finally:
            proc.stop()


def test_forwarding_headers_come_from_nginx_only(nginx_to_a_recorder) -> None:
    url, recorder = nginx_to_a_recorder
    seen: list[dict[str, str]] = []

    def record(request: Request, exchange: Exchange) -> None:
        seen.append(request.headers)
        exchange.respond(200, {"ok": True})

    recorder.app = record
    spoofed = [
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Real-IP", "6.6.6.6"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "evil.example"),
        ("X-Forwarded-Port", "443"),
        ("X-Forwarded-Ssl", "on"),
        ("X-Forwarded-Protocol", "ssl"),
        ("Forwarded", "for=6.6.6.6;host=evil.example;proto=https"),
    ]
    status, _, _ = send(url, "GET", "/v1/models", spoofed)
    assert status == 200
    forwarded = {k: v for k, v in seen[0].items() if "forward" in k or k == "x-real-ip"}
    assert forwarded == {
        "x-forwarded-for": "127.0.0.1",
        "x-real-ip": "127.0.0.1",
        "x-forwarded-proto": "http",
    }


def test_gunicorn_takes_no_path_from_a_header(gw) -> None:
    """gunicorn's default believed `SCRIPT_NAME` from a loopback caller and routed on what
    was left of the path (/v1/models became /models, a 404)."""
    status, _, body = send(gw.app_url, "GET", "/v1/models", [("SCRIPT_NAME", "/v1")])
    assert status == 200, body[:200]
    assert [r["path"] for r in gw.sim_requests()] == ["/v1/models"]


# -- sizes -------------------------------------------------------------------------------------


def test_header_count_and_total_size_limits(gw) -> None:
    """Counts and sizes at both layers (single lines and counts over the limit are in
    test_error_shapes.py): 90 headers pass nginx and gunicorn with nginx's own added; six
    lines of 7 KB (each under nginx's 8k buffer, together over its four) are nginx's 431."""
    filler = [(f"X-Filler-{i}", "x") for i in range(90)]
    for name, url in bases(gw):
        assert send(url, "GET", "/v1/models", filler)[0] == 200, name
    assert_json_error(send(gw.app_url, "GET", "/v1/models", filler * 2), 431, "headers_too_large")
    wide = [(f"X-Wide-{i}", "w" * 7000) for i in range(6)]
    status, headers, body = send(gw.url, "GET", "/v1/models", wide)
    assert_json_error((status, headers, body), 431, "headers_too_large")
    assert "x-request-id" in headers  # nginx's page, not gunicorn's


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        pytest.param(
            b'{"model": "sim-model", "prompt": [' + b"0," * 1_000_000 + b"0]}",
            "more than 1000000 items",
            id="an array longer than the limit",
        ),
        # 100,001 empty objects in 300 KB: parsed, each a dict. At the body limit, ~500 MiB.
        pytest.param(
            b'{"model": "sim-model", "prompt": "x", "extra": [' + b"{}," * 100_000 + b"{}]}",
            "more than 100000 JSON arrays and objects",
            id="more arrays and objects than the limit",
        ),
    ],
)
def test_a_body_over_a_json_size_limit_is_refused(gw, body: bytes, refusal: str) -> None:
    for name, url in bases(gw):
        answer = send(url, "POST", "/v1/completions", body=body)
        error = assert_json_error(answer, 400, "invalid_json")
        assert refusal in error["message"], name
    assert gw.sim_requests() == []
