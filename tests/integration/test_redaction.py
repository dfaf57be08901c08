"""No caller key and no prompt in any log the gateway's processes write.

Traffic carries known secrets in every place a key travels (Authorization, api-key,
x-api-key, ``?api-key=`` in the query) and a known prompt, over the ways a request can go:
answered, streamed, refused by the app, refused by gunicorn's parser (a malformed request
line, which gunicorn logs as it was received), refused by nginx, and failed upstream. Then
every log is scanned: the gateway's (gunicorn's error log, where the app logs too),
gunicorn's access log, nginx's access and error logs. The simulator's own log is the
upstream's, not ours, and is left out.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from tests.support.bodies import chat_about
from tests.support.raw_http import request_head, send_raw

TOKEN = secrets.token_hex(6)
KEYS = {
    "authorization": f"sk-auth-{TOKEN}",
    "api-key": f"azure-{TOKEN}",
    "x-api-key": f"xkey-{TOKEN}",
    "query": f"qkey-{TOKEN}",
}
PROMPT = f"the secret launch code is {TOKEN}-prompt"
SECRETS = [*KEYS.values(), PROMPT, f"{TOKEN}-prompt"]


def chat(stream: bool = False, **extra: object) -> dict:
    """A body carrying the secret prompt: no log or answer may show it."""
    return chat_about(PROMPT, **{"max_tokens": 5, "stream": stream, **extra})


def credentials() -> list[tuple[str, str]]:
    return [
        ("Authorization", f"Bearer {KEYS['authorization']}"),
        ("api-key", KEYS["api-key"]),
        ("x-api-key", KEYS["x-api-key"]),
        ("Content-Type", "application/json"),
    ]


def traffic(gw) -> None:
    query = f"?api-key={KEYS['query']}"
    for base in (gw.url, gw.app_url):
        for body in (chat(), chat(stream=True), chat(temperature=0), chat(temperature=0)):
            raw = json.dumps(body).encode()
            head = request_head("POST", "/v1/chat/completions" + query, credentials(), body=raw)
            assert send_raw(base, head, raw)[0] == 200
        refused = [
            (
                "/v1/chat/completions" + query,
                b'{"model": "sim-model", "messages": "' + PROMPT.encode(),
            ),
            ("/v1/chat/completions" + query, json.dumps({**chat(), "api_base": PROMPT}).encode()),
            ("/v1/../admin" + query, json.dumps(chat()).encode()),
        ]
        for target, raw in refused:
            head = request_head("POST", target, credentials(), body=raw)
            assert send_raw(base, head, raw)[0] in (400, 404)
        # The upstream fails: answers 500, resets, breaks a stream part-way.
        for fault, stream in (("500", False), ("reset", False), ("error-after", True)):
            raw = json.dumps(chat(stream=stream)).encode()
            headers = [*credentials(), ("x-sim-fault", fault)]
            head = request_head("POST", "/v1/chat/completions" + query, headers, body=raw)
            send_raw(base, head, raw)
        # Too many headers, a header too large: refused by nginx or gunicorn, not the app.
        many = [*credentials(), *[(f"X-Filler-{i}", PROMPT) for i in range(120)]]
        send_raw(base, request_head("GET", "/v1/models" + query, many))
        big = [*credentials(), ("X-Big", PROMPT * 400)]
        send_raw(base, request_head("GET", "/v1/models" + query, big))
    # Malformed request lines, which only gunicorn sees (nginx refuses them first): gunicorn
    # logs what it could not parse.
    for line in (
        f"GET /v1/models?api-key={KEYS['query']} HTTP/1.1 extra",
        f"GET /v1/models?api-key={KEYS['query']}\x01 HTTP/1.1",
        f"G@T /v1/models?api-key={KEYS['query']} HTTP/1.1",
        f"GET /v1/models?api-key={KEYS['query']} HTTP/9.9",
        f"Authorization: Bearer {KEYS['authorization']}",
    ):
        head = (line + "\r\nHost: x\r\nConnection: close\r\n\r\n").encode("latin-1")
        for base in (gw.url, gw.app_url):
            assert send_raw(base, head)[0] in (400, 505), line


def logs_of(gw, access_log: Path) -> dict[str, str]:
    run_dir = gw.stack.options.run_dir
    found = {
        str(path.relative_to(run_dir)): path.read_text(errors="replace")
        for folder in (run_dir / "logs", run_dir / "nginx" / "logs")
        for path in sorted(folder.glob("*.log"))
        if path.name not in ("simulator.log", "memcached.log")
    }
    found["gunicorn access log"] = access_log.read_text(errors="replace")
    return found


def test_no_key_or_prompt_in_any_log(make_stack, runs_dir: Path) -> None:
    access_log = runs_dir / "redaction-access.log"
    gw = make_stack(
        env={"LLMGATE_ACCESS_LOG": str(access_log), "LLMGATE_CACHE_MODE": "deterministic"},
        memcached=True,
        workers=1,
    )
    traffic(gw)
    time.sleep(0.5)  # gunicorn writes its access line after the response
    logs = logs_of(gw, access_log)
    assert {"logs/gunicorn.log", "logs/nginx.log", "nginx/logs/access.log"} <= logs.keys()
    # The traffic is in the logs (so the scan reads the right files)...
    assert "/v1/chat/completions" in logs["gunicorn access log"]
    assert "/v1/chat/completions" in logs["nginx/logs/access.log"]
    assert '"route":"chat"' in logs["logs/gunicorn.log"]
    assert "Invalid request from ip=" in logs["logs/gunicorn.log"]
    # ... and none of what it carried.
    leaks = [
        (name, secret, text[max(0, text.find(secret) - 120) : text.find(secret) + 40])
        for name, text in logs.items()
        for secret in SECRETS
        if secret in text
    ]
    assert not leaks, leaks
