"""Malformed and oversized requests still get OpenAI-shaped JSON errors, never HTML.

Some of these never reach Flask: nginx or gunicorn's HTTP parser refuses them. They are sent
on raw sockets, because urllib3 would refuse to send a duplicated header or a broken line.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.raw_http import assert_json_error, request_head, send_raw, send_raw_headers

LIMIT_BODY = b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"


@pytest.fixture
def new_gunicorn_log(gw) -> Callable[[], str]:
    """What gunicorn logged since the test started (its log is shared by the session)."""
    start = len(gw.log("gunicorn"))
    return lambda: gw.log("gunicorn")[start:]


def many_headers(n: int) -> list[tuple[str, str]]:
    return [(f"X-Filler-{i}", "x") for i in range(n)]


DUPLICATED_CONTENT_TYPE = [("Content-Type", "application/json")] * 2
SMALL_CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'

# name -> (request target, extra headers, body, expected status, expected code)
THROUGH_NGINX = {
    "nested 5000 deep": ("/v1/chat/completions", [], LIMIT_BODY, 400, "invalid_json"),
    "duplicated Content-Type": (
        "/v1/chat/completions",
        DUPLICATED_CONTENT_TYPE,
        SMALL_CHAT,
        400,
        "bad_request",
    ),
    "more headers than gunicorn's limit": (
        "/v1/models",
        many_headers(150),
        b"",
        431,
        "headers_too_large",
    ),
    "request line over the limits": ("/v1/models/" + "m" * 9000, [], b"", 414, "uri_too_long"),
    "header line over the limits": (
        "/v1/models",
        [("X-Big", "b" * 9000)],
        b"",
        431,
        "headers_too_large",
    ),
}

# Straight to gunicorn (behind nginx, nginx refuses some of these first): its parser's
# refusals must come out of the worker class as JSON too.
STRAIGHT_TO_GUNICORN = {
    **{k: v for k, v in THROUGH_NGINX.items() if k != "header line over the limits"},
    "header line over gunicorn's limit": (
        "/v1/models",
        [("X-Big", "b" * 40_000)],
        b"",
        431,
        "headers_too_large",
    ),
}


def _send(url: str, case: tuple) -> tuple[int, dict[str, str], bytes]:
    target, headers, body, _, _ = case
    method = "POST" if body else "GET"
    if body and not any(name == "Content-Type" for name, _ in headers):
        headers = [*headers, ("Content-Type", "application/json")]
    return send_raw(url, request_head(method, target, headers, body=body), body)


@pytest.mark.parametrize("case", THROUGH_NGINX)
def test_refused_requests_are_openai_json_through_nginx(gw, new_gunicorn_log, case: str) -> None:
    _, _, _, status, code = THROUGH_NGINX[case]
    answer = _send(gw.url, THROUGH_NGINX[case])
    error = assert_json_error(answer, status, code)
    if case == "nested 5000 deep":
        assert "limit of 64 levels" in error["message"]
    assert "Traceback" not in new_gunicorn_log()
    # Named like every answer, whoever refused it (the app, gunicorn's parser or nginx).
    named = answer[1].get("x-llmgate-request-id", "")
    assert re.fullmatch(r"[0-9a-f]{32}", named), answer[1]
    assert answer[1]["x-request-id"] == named


def test_every_answer_through_nginx_is_named_once_with_the_callers_request_id(gw) -> None:
    """gunicorn's parser refuses before the app reads X-Request-ID, and the app's own 404
    outside /v1 names no request: nginx names them with the id it sent along. An answer the
    app names keeps its own names, once each. (nginx's own refusals carry its id too, the
    caller's only when nginx read the headers: a request line too long for its buffers is
    refused before them.)"""

    def names(target: str, headers: list, body: bytes, status: int, code: str | None) -> dict:
        headers = [*headers, ("X-Request-ID", "req-given-1")]
        if body and not any(name == "Content-Type" for name, _ in headers):
            headers.append(("Content-Type", "application/json"))
        method = "POST" if body else "GET"
        got, head, answer = send_raw_headers(
            gw.url, request_head(method, target, headers, body=body), body
        )
        if code is not None:
            assert_json_error((got, {k.lower(): v for k, v in head}, answer), status, code)
        assert got == status, (got, answer[:200])
        return {
            name: [v for k, v in head if k.lower() == name]
            for name in ("x-request-id", "x-llmgate-request-id")
        }

    for case in (
        THROUGH_NGINX["duplicated Content-Type"],
        THROUGH_NGINX["more headers than gunicorn's limit"],
        ("/nope", [], b"", 404, "unknown_url"),
    ):
        assert names(*case) == {
            "x-request-id": ["req-given-1"],
            "x-llmgate-request-id": ["req-given-1"],
        }, case
    # A proxied answer: the gateway's name, and the upstream's own x-request-id, once each.
    upstream = names("/v1/models", [], b"", 200, None)
    assert upstream["x-llmgate-request-id"] == ["req-given-1"]
    assert len(upstream["x-request-id"]) == 1 and upstream["x-request-id"] != ["req-given-1"]


@pytest.mark.parametrize("case", STRAIGHT_TO_GUNICORN)
def test_gunicorn_own_refusals_are_openai_json(gw, new_gunicorn_log, case: str) -> None:
    _, _, _, status, code = STRAIGHT_TO_GUNICORN[case]
    assert_json_error(_send(gw.app_url, STRAIGHT_TO_GUNICORN[case]), status, code)
    assert "Traceback" not in new_gunicorn_log()


def test_a_broken_request_line_straight_to_gunicorn_is_json(gw, new_gunicorn_log) -> None:
    assert_json_error(send_raw(gw.app_url, b"BROKEN\r\n\r\n"), 400, "bad_request")
    assert "Traceback" not in new_gunicorn_log()


def test_a_long_model_id_in_the_path_is_a_json_414(gw, new_gunicorn_log) -> None:
    # 5,000 bytes fit both request-line limits (nginx's 8k buffer, gunicorn's 8190): the
    # gateway itself refuses a request target above 4 KiB, before anything goes upstream.
    answer = send_raw(gw.url, request_head("GET", "/v1/models/" + "m" * 5000, []))
    assert_json_error(answer, 414, "uri_too_long")
    assert gw.sim_stats()["requests"] == 0
    assert "Traceback" not in new_gunicorn_log()


def test_nginx_refuses_first_where_it_can(gw) -> None:
    """Request lines and header lines nginx accepts, gunicorn accepts too, so the refusals
    are nginx's own (its JSON pages), and what nginx passes on is served."""
    for target, headers in [
        ("/v1/models/" + "m" * 9000, []),
        ("/v1/models", [("X-Big", "b" * 9000)]),
    ]:
        status, response_headers, _ = send_raw(gw.url, request_head("GET", target, headers))
        assert status in (414, 431)
        assert "x-request-id" in response_headers  # set only on nginx's error pages
    # Just under nginx's limits: a request line of 8,100 bytes, and four X-Forwarded-For
    # lines of ~6 KB (nginx sends gunicorn its own instead).
    longest = send_raw(gw.url, request_head("GET", "/v1/models/" + "m" * 8070, []))
    assert longest[0] == 414, longest
    assert "x-llmgate-request-id" in longest[1]  # the gateway's answer: gunicorn let it in
    forwarded = [("X-Forwarded-For", "10.0.0.1, " * 600)] * 4
    assert send_raw(gw.url, request_head("GET", "/healthz", forwarded))[0] == 200


def test_access_log_has_the_path_without_the_query(make_stack, runs_dir: Path) -> None:
    access_log = runs_dir / "gunicorn-access.log"
    gw = make_stack(env={"LLMGATE_ACCESS_LOG": str(access_log)}, memcached=False)
    resp = gw.http.request("GET", gw.url + "/v1/models?api-key=SECRET&limit=2")
    assert resp.status == 200
    # gunicorn writes the line once the response is sent: the caller may read it first.
    give_up = time.monotonic() + 5
    while not (lines := [x for x in access_log.read_text().splitlines() if "/v1/models" in x]):
        assert time.monotonic() < give_up, access_log.read_text()
        time.sleep(0.05)
    assert "GET /v1/models HTTP/1.1" in lines[-1]
    assert '" 200 ' in lines[-1]
    nginx_access = gw.stack.options.run_dir / "nginx" / "logs" / "access.log"
    for log in (access_log.read_text(), gw.log("gunicorn"), nginx_access.read_text()):
        assert "SECRET" not in log
