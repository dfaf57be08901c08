"""An https upstream: verified certificates, pooled TLS connections, streams, clear errors."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.conftest import require_binary
from tests.integration.sse_reader import chat, data_events, read_events
from tests.support.sim import SimProcess
from tests.support.tls import TLSFront, make_certificate


@pytest.fixture(scope="module")
def tls_upstream():
    openssl = require_binary("openssl")
    folder = Path(tempfile.mkdtemp(prefix="llmgate-tls-"))
    cert, key = make_certificate(folder, openssl)
    with SimProcess(ttft_ms=0, tps=200) as sim:
        front = TLSFront(sim.port, cert, key)
        yield sim, front, cert
        front.stop()


def test_streams_and_answers_over_verified_pooled_tls(make_stack, tls_upstream) -> None:
    sim, front, cert = tls_upstream
    gw = make_stack(
        upstream_url=f"https://127.0.0.1:{front.port}/v1",
        memcached=False,
        workers=1,
        env={"LLMGATE_UPSTREAM_CA_BUNDLE": str(cert)},
    )
    handshakes = front.handshakes
    sim.reset()
    for i in range(20):
        stream = i % 2 == 0
        resp = gw.post(
            "/v1/chat/completions", chat(stream, max_tokens=3), preload_content=not stream
        )
        assert resp.status == 200
        if stream:
            assert data_events(read_events(resp))[-1].event.is_done
        else:
            assert json.loads(resp.data)["choices"][0]["message"]["content"]
    assert sim.stats()["requests"] == 20  # every call went through the TLS front
    # One TLS handshake for the worker's pooled connection, not one per call.
    assert front.handshakes - handshakes <= 1


def test_an_untrusted_certificate_is_a_clear_502(make_stack, tls_upstream) -> None:
    _, front, _ = tls_upstream
    gw = make_stack(
        upstream_url=f"https://127.0.0.1:{front.port}/v1", memcached=False, workers=1
    )  # the system store does not trust our self-signed certificate
    resp = gw.post("/v1/chat/completions", chat())
    assert resp.status == 502
    error = json.loads(resp.data)["error"]
    assert error["code"] == "upstream_tls_error"
    assert "certificate" in error["message"].lower()
