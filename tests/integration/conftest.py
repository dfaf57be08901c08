"""Fixtures that start the real stack on loopback: nginx → gunicorn (gevent) → simulator.

Stacks are session-scoped and keyed by their options, so tests that need the same shape
share one set of processes; each test resets the simulator's counters first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from runner.stack import Stack, StackOptions
from tests.conftest import require_binary


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
        found = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        ]
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


@pytest.fixture(scope="session")
def runs_dir(request) -> Iterator[Path]:
    """One folder for every stack's run directory; kept (logs!) when a test failed."""
    path = Path(tempfile.mkdtemp(prefix="llmgate-tests-"))
    path.chmod(0o755)  # nginx workers run as nobody when the tests run as root
    yield path
    if request.session.testsfailed == 0:
        shutil.rmtree(path, ignore_errors=True)
    else:
        print(f"\nstack logs kept in {path}")


@pytest.fixture(scope="session")
def stacks() -> Iterator[dict]:
    started: dict[str, StackHandle] = {}
    yield started
    for handle in started.values():
        handle.stack.stop()


@pytest.fixture(scope="session")
def make_stack(stacks: dict, runs_dir: Path):
    """make_stack(env={...}, **StackOptions fields) -> a running StackHandle (shared by key)."""

    def make(env: dict[str, str] | None = None, **options) -> StackHandle:
        env = dict(env or {})
        key = repr((sorted(env.items()), sorted(options.items())))
        if key not in stacks:
            if options.get("nginx", True):
                require_binary("nginx")
            if options.get("memcached", True):
                require_binary("memcached")
            run_dir = Path(tempfile.mkdtemp(prefix="stack-", dir=runs_dir))
            stack = Stack(StackOptions(run_dir=run_dir, env=env, **options)).start()
            stacks[key] = StackHandle(stack)
        return stacks[key]

    return make


@pytest.fixture
def gw(make_stack) -> StackHandle:
    """The default stack: 2 gevent workers behind nginx, memcached, the simulator."""
    handle = make_stack()
    handle.sim_reset()
    return handle
