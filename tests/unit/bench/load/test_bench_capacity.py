"""The capacity benchmark's stack: make run's shape, but never a real upstream or a fixed port."""

from __future__ import annotations

from pathlib import Path

from bench.load.capacity import stack_options


def test_the_capacity_stack_ignores_a_real_upstream_and_fixed_ports(monkeypatch) -> None:
    monkeypatch.setenv("LLMGATE_UPSTREAM_URL", "https://api.example/v1")
    monkeypatch.setenv("LLMGATE_UPSTREAM_API_KEY", "sk-real")
    monkeypatch.setenv("LLMGATE_CONFIG", "/etc/llmgate/upstreams.toml")
    monkeypatch.setenv("LLMGATE_TLS_PORT", "8443")
    monkeypatch.setenv("LLMGATE_WORKER_CONNECTIONS", "12000")  # sizing is kept
    options = stack_options(Path("/tmp/run"), heartbeat_s=2.5)
    assert options.upstream_url == "" and options.tls_port is None and options.port == 0
    assert not {"LLMGATE_UPSTREAM_URL", "LLMGATE_UPSTREAM_API_KEY", "LLMGATE_CONFIG"} & set(
        options.env
    )
    assert options.env["LLMGATE_WORKER_CONNECTIONS"] == "12000"
    assert options.env["LLMGATE_HEARTBEAT_S"] == "2.5"
