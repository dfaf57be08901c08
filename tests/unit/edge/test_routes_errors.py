"""A bug in the gateway still answers JSON, and is counted and logged like any request."""

from __future__ import annotations

import pytest

from app.core.config import Settings
from app.factory import create_app


def test_an_unexpected_exception_is_a_counted_json_500(monkeypatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1"))
    gateway = app.extensions["llmgate"]

    def broken(call, caller=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(gateway, "handle", broken)
    resp = app.test_client().post("/v1/chat/completions", json={"model": "m"})
    assert resp.status_code == 500
    assert resp.get_json()["error"]["code"] == "internal_error"
    assert "a bug" not in resp.get_data(as_text=True)  # no internals to the caller
    text = gateway.metrics.exposition()[0].decode()
    assert 'llmgate_requests_total{cache="bypass",route="chat",status="500"} 1.0' in text


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/nope", 404), ("PUT", "/v1/models", 405)]
)
def test_werkzeug_errors_are_openai_json(monkeypatch, method, path, status) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1"))
    resp = app.test_client().open(path, method=method)
    assert resp.status_code == status
    assert set(resp.get_json()["error"]) == {"message", "type", "param", "code"}
