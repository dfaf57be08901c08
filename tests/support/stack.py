"""A running stack as the tests drive it: its URLs, the calls they make, what it logged and
counted; the stacks a test asks for by their options, started once each (``StackPool``); a
stack whose upstreams (and gateway keys) come from files (``file_stack``). The fixtures that
start stacks (make_stack, gw, kinds_gw) are in tests/integration/conftest.py.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from runner.stack import Stack, StackOptions
from tests.support.metrics import samples
from tests.support.waiting import wait_for

# The header naming the upstream that answered (the upstreams file's name).
UPSTREAM = "X-LLMGate-Upstream"
# A default upstream URL on a port nobody listens on: a call that the upstreams file does
# not route is refused, never answered by accident.
NOWHERE = "http://127.0.0.1:9/v1"


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

    def per_instance(self, name: str, **labels: str) -> list[float]:
        """The samples named ``name`` whose labels include ``labels``, summed per instance:
        each instance's own /metrics, straight from its gunicorn on a connection of its own
        (nothing kept open), in the order of the stack's app_urls."""
        out = []
        for url in self.stack.app_urls:
            resp = self.http.request("GET", url + "/metrics", headers={"Connection": "close"})
            out.append(sum(samples(resp.data.decode(), name, **labels)))
        return out

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


class StackPool:
    """Stacks started by their options, each set once: asked again for the same ``env`` and
    options, the pool hands back the stack it started (tests/integration/conftest.py's
    make_stack is one, for the session). ``require(binary)`` is called before a stack that
    needs nginx or Memcached starts (tests/conftest.py's require_binary: a skip, or a
    failure in CI)."""

    def __init__(self, runs_dir: Path, require: Callable[[str], object]) -> None:
        self.runs_dir = runs_dir
        self.require = require
        self.started: dict[str, StackHandle] = {}

    def __call__(self, env: dict[str, str] | None = None, **options: Any) -> StackHandle:
        env = dict(env or {})
        key = repr((sorted(env.items()), sorted(options.items())))
        if key not in self.started:
            if options.get("nginx", True):
                self.require("nginx")
            if options.get("memcached", True):
                self.require("memcached")
            run_dir = Path(tempfile.mkdtemp(prefix="stack-", dir=self.runs_dir))
            stack = Stack(StackOptions(run_dir=run_dir, env=env, **options)).start()
            self.started[key] = StackHandle(stack)
        return self.started[key]

    def kill_all(self) -> None:
        """Every stack killed, not drained: no test watches these stop (the tests of stopping
        start stacks of their own), and a graceful stop costs a gunicorn about 1.2 s and a
        Memcached up to one; a run starts dozens of stacks."""
        for handle in self.started.values():
            handle.stack.stop(graceful=False)


def file_stack(
    make_stack: Callable[..., StackHandle],
    folder: Path,
    config: str,
    *,
    keys: str | None = None,
    env: dict[str, str] | None = None,
    **options: Any,
) -> StackHandle:
    """A stack whose upstreams come from ``config`` (an upstreams file) and, when ``keys``
    is given, whose gateway keys from it (a keys file), both written in ``folder``; no cache
    unless ``env`` (laid over those) says otherwise. ``options``: make_stack's, as they are."""
    (folder / "llmgate.toml").write_text(config)
    files = {"LLMGATE_CONFIG": str(folder / "llmgate.toml"), "LLMGATE_CACHE_MODE": "off"}
    if keys is not None:
        (folder / "keys.toml").write_text(keys)
        files["LLMGATE_KEYS_FILE"] = str(folder / "keys.toml")
    return make_stack(env={**files, **(env or {})}, **options)


def config_stack(
    make_stack, tmp_path_factory, toml: str, *, keys: str | None = None, **env: str
) -> StackHandle:
    """A stack of one worker whose upstreams come from ``toml`` (an upstreams file), and its
    gateway keys from ``keys`` when given (a keys file); no cache and no Memcached; the
    default upstream URL is NOWHERE."""
    folder: Path = tmp_path_factory.mktemp("config")
    return file_stack(
        make_stack, folder, toml, keys=keys, env=env, workers=1, memcached=False,
        upstream_url=NOWHERE,
    )  # fmt: skip
