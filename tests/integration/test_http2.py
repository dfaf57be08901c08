"""`make run`'s HTTPS port speaks HTTP/2, and a stream over it still arrives token by token.

The runner makes a self-signed certificate in its run directory (runner/tls.py); curl, a
real HTTP/2 client (nghttp2), trusts exactly that certificate, asks for h2 in ALPN, and
prints each line of the stream as it comes (-N), as a user would watch it.
"""

from __future__ import annotations

from tests.conftest import require_binary
from tests.support.runner_cli import Runner, curl_stream, token_arrivals


def test_make_run_streams_token_by_token_over_http2(runs_dir) -> None:
    require_binary("nginx")
    require_binary("memcached")
    require_binary("openssl")
    with Runner(runs_dir / "http2") as run:
        cert = run.run_dir / "tls" / "llmgate.crt"
        assert f"https://127.0.0.1:{run.tls_port} (HTTP/2; certificate {cert})" in run.banner
        url = f"https://localhost:{run.tls_port}/v1/chat/completions"
        lines = curl_stream(url, "--http2", "--cacert", str(cert),
                            "-w", "http_version=%{http_version}\n")  # fmt: skip
    assert run.returncode == 0, run.rest
    version = lines.pop()[1].decode().strip().removeprefix("http_version=")
    assert version == "2"
    tokens = token_arrivals(lines)
    assert len(tokens) == 20, lines
    assert [line for _, line in lines][-2:] == [b"data: [DONE]\n", b"\n"]
    # 20 tokens at the simulator's 100 tokens/s arrive over ~0.2 s, not in one piece.
    assert tokens[-1] - tokens[0] >= 0.1, "the tokens arrived together"
