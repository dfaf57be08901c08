"""The CLI (``python -m llmgate_client``) and the package's import isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llmgate_client.cli import main
from tests.conftest import ROOT
from tests.support.resumable import SID, WHOLE, ResumableGateway
from tests.support.scripted_server import (
    Exchange,
    Request,
    completion,
    error_body,
    serve,
    stream_tokens,
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGATE_", "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_import_pulls_in_neither_flask_nor_gevent() -> None:
    code = (
        "import sys, llmgate_client, llmgate_client.cli\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "bad = sorted(roots & {'flask', 'gevent', 'werkzeug'})\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_chat_streams_tokens_as_they_arrive() -> None:
    seen: list[Request] = []

    def app(request: Request, ex: Exchange) -> None:
        seen.append(request)
        stream_tokens(ex, ["one ", "two ", "three ", "four"], gap=0.4)

    with serve(app) as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgate_client", "chat", "count", "--model", "m"],
            env=_env(LLMGATE_BASE_URL=srv.url, LLMGATE_API_KEY="sk-cli"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        arrivals: list[tuple[float, bytes]] = []
        while data := os.read(proc.stdout.fileno(), 4096):
            arrivals.append((time.monotonic(), data))
        proc.wait(timeout=10)
        stderr = proc.stderr.read() if proc.stderr else b""
        proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == 0, stderr
    assert b"".join(d for _, d in arrivals) == b"one two three four\n"
    first_token = next(t for t, d in arrivals if b"one" in d)
    last_token = next(t for t, d in arrivals if b"four" in d)
    # 3 gaps of 0.4 s on the server: tokens must reach stdout spread out, not all at the end
    assert last_token - first_token > 0.6
    assert len(arrivals) >= 3
    assert seen[0].headers["authorization"] == "Bearer sk-cli"


def _ok_app(request: Request, ex: Exchange) -> None:
    ex.respond(200, completion("whole answer"))


def test_chat_flags_beat_env_and_llmgate_env_beats_openai(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(_ok_app) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        monkeypatch.setenv("LLMGATE_BASE_URL", srv.url)
        assert main(["chat", "hi", "--model", "m", "--no-stream"]) == 0
        monkeypatch.setenv("LLMGATE_BASE_URL", "http://127.0.0.1:9")
        assert main(["chat", "hi", "--no-stream", "--base-url", srv.url + "/v1"]) == 0
        monkeypatch.delenv("LLMGATE_BASE_URL")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url + "/v1")
        assert main(["chat", "hi", "--no-stream"]) == 0
        assert srv.stats.requests == 3
    assert capsys.readouterr().out == "whole answer\n" * 3


def test_chat_error_exit_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(401, error_body("bad key", "authentication_error"))

    with serve(app) as srv:
        assert main(["chat", "hi", "--base-url", srv.url, "--api-key", "nope"]) == 1
    assert "AuthenticationError" in capsys.readouterr().err


def test_chat_resumes_a_dropped_stream(capsys: pytest.CaptureFixture[str]) -> None:
    gateway = ResumableGateway(cut_at=0)
    gateway.cut_at = gateway.offset_after(3)
    with serve(gateway.app) as srv:
        assert main(["chat", "hi", "--model", "m", "--base-url", srv.url]) == 0
    captured = capsys.readouterr()
    assert captured.out == "".join(WHOLE) + "\n"  # each piece once
    assert "resumed after 1 dropped connection" in captured.err
    assert gateway.gets[0].headers["last-event-id"] == f"{SID}:3"


def test_chat_no_resume_ends_at_the_drop(capsys: pytest.CaptureFixture[str]) -> None:
    gateway = ResumableGateway(cut_at=0)
    gateway.cut_at = gateway.offset_after(3)
    with serve(gateway.app) as srv:
        assert main(["chat", "hi", "--model", "m", "--base-url", srv.url, "--no-resume"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "".join(WHOLE[:3]) + "\n"
    assert "IncompleteStreamError" in captured.err
    assert [r.method for r in gateway.requests] == ["POST"]
    assert "x-llmgate-resumable" not in gateway.requests[0].headers


def test_batch_writes_one_line_per_input_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    active = 0
    peak = 0
    models: dict[int, str] = {}
    lock = threading.Lock()

    def app(request: Request, ex: Exchange) -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        n = int(request.json()["messages"][0]["content"])
        time.sleep(0.002 * (20 - n))
        with lock:
            active -= 1
        if n == 5:
            ex.respond(400, error_body("too long", "invalid_request_error"), {"x-request-id": "r5"})
        else:
            models[n] = request.json()["model"]
            ex.respond(200, completion(f"a{n}"))

    lines = []
    for n in range(20):
        body: dict[str, Any] = {"messages": [{"role": "user", "content": str(n)}]}
        if n != 2:
            body["model"] = "m"
        lines.append(json.dumps(body))
    lines.insert(8, "{not json")
    lines.insert(3, "")  # blank lines are not requests
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")

    with serve(app) as srv:
        status = main(
            [
                "batch",
                str(src),
                str(dst),
                "--workers",
                "3",
                "--base-url",
                srv.url,
                "--model",
                "fill-in",
            ]
        )
    assert status == 1  # some lines failed
    assert peak <= 3
    assert models[2] == "fill-in" and models[3] == "m"  # --model only fills a missing one
    records = [json.loads(line) for line in dst.read_text().splitlines()]
    assert len(records) == 21
    assert [r["line"] for r in records] == [n for n, line in enumerate(lines, 1) if line.strip()]
    failed = [r for r in records if not r["ok"]]
    assert len(failed) == 2
    assert failed[0]["error"]["error"] == "BadRequestError" and failed[0]["error"]["status"] == 400
    assert failed[0]["request_id"] == "r5"
    assert (
        failed[1]["error"]["error"] == "InvalidRequest"
        and "not JSON" in failed[1]["error"]["message"]
    )
    assert (failed[0]["attempts"], failed[1]["attempts"]) == (1, 0)  # the line never sent
    answers = [r["response"]["choices"][0]["message"]["content"] for r in records if r["ok"]]
    assert answers == [f"a{n}" for n in range(20) if n != 5]
    err = capsys.readouterr().err
    assert "ok=19 failed=2" in err and "p50=" in err and "p95=" in err
    assert "21/21" in err  # the progress bar reached the end


def test_batch_from_stdin_to_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO('{"model": "m", "messages": []}\n' * 3))
    with serve(_ok_app) as srv:
        assert (
            main(["batch", "-", "-", "--workers", "2", "--base-url", srv.url, "--no-progress"]) == 0
        )
    captured = capsys.readouterr()
    assert [json.loads(line)["ok"] for line in captured.out.splitlines()] == [True] * 3
    assert "ok=3 failed=0" in captured.err
