"""runner/resolve.py: `make run` says at start which upstream host names do not resolve."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from app.core.config import Settings
from runner import resolve
from tests.conftest import ROOT


def _settings(**values: str) -> Settings:
    return Settings.from_env({f"LLMGATE_{k.upper()}": v for k, v in values.items()})


def test_the_targets_are_each_upstreams_fixed_host(tmp_path: Path) -> None:
    assert resolve.targets(_settings(), {}) == []  # the simulator
    url = _settings(upstream_url="https://api.example.invalid/v1")
    assert resolve.targets(url, {}) == [("default", "api.example.invalid", 443)]
    config = tmp_path / "llmgate.toml"
    config.write_text(
        '[[upstreams]]\nname = "a"\nbase_url = "http://10.0.0.1:8000/v1"\n'
        '[[upstreams]]\nname = "azure"\n'
        'base_url = "https://{model}.openai.azure.example/openai/deployments/{model}"\n'
    )
    assert resolve.targets(_settings(config=str(config)), {}) == [("a", "10.0.0.1", 8000)]
    config.write_text("[[upstreams]]\nname = 3\n")  # gunicorn refuses it with its line
    assert resolve.targets(_settings(config=str(config)), {}) == []


def test_a_name_that_does_not_resolve_is_one_line_naming_the_upstream_and_the_docs() -> None:
    found = [("a", "127.0.0.1", 80), ("b", "no-such-host.invalid", 443)]
    lines = resolve.unresolved(found)  # the real resolver: .invalid never resolves
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith("upstream b: host no-such-host.invalid does not resolve ("), line
    assert "502 upstream_unreachable" in line and line.endswith(f"({resolve.DOCS})")
    docs, _, anchor = resolve.DOCS.partition("#")
    text = (ROOT / docs).read_text()
    assert f"## {anchor.replace('-', ' ')}".lower() in text.lower(), anchor


def test_a_lookup_that_hangs_is_reported_not_waited_for() -> None:
    release = threading.Event()

    def hangs(host: str, port: int) -> object:
        if host == "slow.example":
            release.wait(10)
            raise socket.gaierror(-3, "Temporary failure in name resolution")
        return [()]

    try:
        lines = resolve.unresolved(
            [("a", "fast.example", 443), ("b", "slow.example", 443)], hangs, wait_s=0.2
        )
    finally:
        release.set()
    assert lines == [
        "upstream b: host slow.example does not resolve (no answer within 0.2 s); its calls "
        f"will fail with 502 upstream_unreachable ({resolve.DOCS})"
    ]
