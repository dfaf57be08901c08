"""An https upstream: verified certificates, pooled TLS connections, streams, clear errors."""

from __future__ import annotations

import json
import ssl
import tempfile
from pathlib import Path

import pytest
import urllib3

from tests.conftest import require_binary
from tests.support.bodies import chat
from tests.support.calls import round_of_streams
from tests.support.sim import SimProcess
from tests.support.sse_reader import data_events, read_events
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


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_spare_connections_are_opened_with_their_tls_handshake_done(
    make_stack, tls_upstream, version: ssl.TLSVersion
) -> None:
    # TLS 1.3 servers send session tickets after the handshake: a spare nobody has used yet
    # must have read them, or urllib3 takes it for a closed connection and opens another.
    sim, _, cert = tls_upstream
    front = TLSFront(sim.port, cert, cert.with_name("upstream.key"), max_version=version)
    gw = make_stack(
        upstream_url=f"https://127.0.0.1:{front.port}/v1",
        memcached=False,
        workers=1,
        env={"LLMGATE_UPSTREAM_CA_BUNDLE": str(cert), "LLMGATE_POOL_SPARE_RATIO": "0.5"},
    )
    http = urllib3.PoolManager(maxsize=40, retries=False)
    try:
        before = front.handshakes
        assert set(round_of_streams(gw, http, 10)) == {200}
        made = front.handshakes - before
        assert 10 < made <= 15  # the spares' handshakes were made with the others'
        assert set(round_of_streams(gw, http, made)) == {200}  # each found a connection ready
        assert front.handshakes - before == made
        assert set(front.versions) == {version.name.replace("_", ".")}  # "TLSv1.3"
    finally:
        front.stop()
