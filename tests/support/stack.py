"""A running stack as the tests drive it: its URLs, the calls they make, what it logged and
counted. The fixtures that start stacks (make_stack, gw) are in tests/integration/conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import urllib3

from runner.stack import Stack
from tests.support.metrics import samples
from tests.support.waiting import wait_for

# The header naming the upstream that answered (the upstreams file's name).
UPSTREAM = "X-LLMGate-Upstream"


class StackHandle:
    """A running stack plus the calls tests make against it."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = urllib3.PoolManager(maxsize=32, retries=False)

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def app_url(self) -> str:
        return self.stack.app_url

    @property
    def sim_url(self) -> str:
        return self.stack.sim_url

    def sim_stats(self) -> dict:
        return json.loads(self.http.request("GET", self.sim_url + "/sim/stats").data)

    def sim_requests(self) -> list[dict]:
        return json.loads(self.http.request("GET", self.sim_url + "/sim/requests").data)

    def metric(self, name: str, *, default: float | None = None, **labels: str) -> float:
        """A sample of the gateway's /metrics, parsed with prometheus_client's own parser:
        the sum of the samples named ``name`` whose labels include ``labels``. None matching:
        ``default``, or an AssertionError when no default is given."""
        text = self.http.request("GET", self.url + "/metrics").data.decode()
        found = samples(text, name, **labels)
        if not found and default is None:
            raise AssertionError(f"{name}{labels} not in /metrics")
        return sum(found) if found else float(default or 0.0)

    def sim_reset(self) -> None:
        self.http.request("POST", self.sim_url + "/sim/reset")

    def post(self, path: str, body: dict | bytes, *, base: str | None = None, **kw):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        return self.http.request(
            "POST", (base or self.url) + path, body=data, headers=headers, **kw
        )

    def log(self, name: str) -> str:
        return (self.stack.options.run_dir / "logs" / f"{name}.log").read_text(errors="replace")

    def log_records(self, name: str = "gunicorn") -> list[dict]:
        """The JSON lines of a process's log, parsed (the gateway's: one line per call)."""
        return [json.loads(line) for line in self.log(name).splitlines() if line.startswith("{")]

    def logged(self, request_id: str, timeout: float = 10.0) -> dict:
        """The gateway's log line of the call ``request_id`` (written once its last byte has
        left, so it is waited for)."""

        def lines() -> list[dict]:
            return [r for r in self.log_records() if r.get("request_id") == request_id]

        if not wait_for(lines, timeout, every=0.05):
            raise AssertionError(f"no log line for {request_id}")
        return lines()[-1]


def config_stack(make_stack, tmp_path_factory, toml: str, **env: str) -> StackHandle:
    """A stack of one worker whose upstreams come from ``toml`` (an upstreams file), no cache
    and no Memcached; the default upstream URL is a port nobody listens on, so a call the
    file does not route is refused, never answered by accident."""
    path: Path = tmp_path_factory.mktemp("config") / "llmgate.toml"
    path.write_text(toml)
    env = {"LLMGATE_CONFIG": str(path), "LLMGATE_CACHE_MODE": "off", **env}
    return make_stack(env=env, workers=1, memcached=False, upstream_url="http://127.0.0.1:9/v1")
