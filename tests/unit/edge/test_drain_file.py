"""LLMGATE_DRAIN_FILE: a preStop hook's file turns /readyz red while the instance serves on."""

from __future__ import annotations

import socket
from pathlib import Path

from app.core.config import Settings
from app.factory import create_app


def test_readyz_is_503_while_the_drain_file_exists(tmp_path: Path) -> None:
    drain = tmp_path / "draining"
    with socket.create_server(("127.0.0.1", 0)) as upstream:  # a reachable upstream
        port = upstream.getsockname()[1]
        settings = Settings(upstream_url=f"http://127.0.0.1:{port}/v1", drain_file=str(drain))
        client = create_app(settings).test_client()
        assert client.get("/readyz").status_code == 200
        drain.touch()
        resp = client.get("/readyz")
        assert resp.status_code == 503 and resp.get_json()["checks"]["draining"] is True
        assert client.get("/healthz").status_code == 200  # alive: the kubelet must not restart
        drain.unlink()
        assert client.get("/readyz").status_code == 200


def test_no_drain_file_setting_never_reads_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("draining").touch()  # a relative file of that name means nothing without the setting
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        port = upstream.getsockname()[1]
        client = create_app(Settings(upstream_url=f"http://127.0.0.1:{port}/v1")).test_client()
        assert client.get("/readyz").status_code == 200
