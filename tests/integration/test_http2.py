"""`make run`'s HTTPS port speaks HTTP/2, and a stream over it still arrives token by token.

The runner makes a self-signed certificate in its run directory (runner/tls.py); curl, a
real HTTP/2 client (nghttp2), trusts exactly that certificate, asks for h2 in ALPN, and
prints each line of the stream as it comes (-N), as a user would watch it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from runner.procs import free_port
from tests.conftest import ROOT, require_binary

BODY = {
    "model": "sim-model",
    "stream": True,
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "hello"}],
}


def _curl_h2(url: str, cacert: str) -> tuple[list[tuple[float, bytes]], str]:
    """The stream's lines with the moment each arrived, and the HTTP version curl used."""
    curl = require_binary("curl")
    argv = [
        curl,
        "--http2",
        "-N",
        "-s",
        "--cacert",
        cacert,
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(BODY),
        "-w",
        "http_version=%{http_version}\n",
        url,
    ]
    lines = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line))
    version = lines[-1][1].decode().strip().removeprefix("http_version=")
    return lines[:-1], version


def test_make_run_streams_token_by_token_over_http2(runs_dir) -> None:
    require_binary("nginx")
    require_binary("memcached")
    require_binary("openssl")
    port, tls_port = free_port(), free_port()
    run_dir = runs_dir / "http2"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
    env.update(
        LLMGATE_PORT=str(port),
        LLMGATE_TLS_PORT=str(tls_port),
        LLMGATE_RUN_DIR=str(run_dir),
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    banner: list[str] = []
    try:
        for line in proc.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        cert = run_dir / "tls" / "llmgate.crt"
        assert f"https://127.0.0.1:{tls_port} (HTTP/2; certificate {cert})" in "".join(banner)
        url = f"https://localhost:{tls_port}/v1/chat/completions"
        lines, version = _curl_h2(url, str(cert))
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, rest
    assert version == "2"
    tokens = [at for at, line in lines if b'"content":"' in line and b'"content":""' not in line]
    assert len(tokens) == 20, lines
    assert [line for _, line in lines][-2:] == [b"data: [DONE]\n", b"\n"]
    # 20 tokens at the simulator's 100 tokens/s arrive over ~0.2 s, not in one piece.
    assert tokens[-1] - tokens[0] >= 0.1, "the tokens arrived together"
