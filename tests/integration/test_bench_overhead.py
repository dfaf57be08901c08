"""The overhead bench's five paths (bench/load/overhead_paths.py) are what its report says they
are: every one relays the bench's calls to the one simulator, and gateway+keys is the gateway
with its features on — its key is checked (a call without it is refused) and its limits are
counted in its Memcached on every call — while the floor and the gateway run without one."""

from __future__ import annotations

from pathlib import Path

from bench.kit import loadgen
from bench.kit.report import Config
from bench.load import overhead_paths
from bench.load.overhead import kinds
from runner.stack import StackOptions
from tests.conftest import require_binary
from tests.support.memcached import memcached_get, memcached_keys
from tests.support.sim import sim_stats

CALLS = 4  # per path and kind


def test_every_path_relays_and_gateway_keys_checks_and_counts_its_key(tmp_path: Path) -> None:
    for binary in ("nginx", "memcached"):
        require_binary(binary)
    options = StackOptions(
        run_dir=tmp_path / "run", memcached=False, workers=1, env={"LLMGATE_CACHE_MODE": "off"}
    )
    cfg = Config(out_dir=tmp_path, progress=lambda _: None)
    with overhead_paths.started(cfg, tmp_path / "run", options) as paths:
        assert list(paths.routes) == ["direct", "nginx-only", "floor", "gateway", "gateway+keys"]
        for path, route in paths.routes.items():
            host, port = route.url.removeprefix("http://").split(":")
            for kind in kinds(smoke=True):
                done = loadgen.run(host, int(port), kind.request(route.headers), 2, CALLS)
                assert (len(done.total), done.errors) == (CALLS, []), (path, kind.name)
        keyed = paths.stacks["gateway+keys"]
        host, port = keyed.url.removeprefix("http://").split(":")
        plain = kinds(smoke=True)[1]
        refused = loadgen.run(host, int(port), plain.request(), 1, 1)
        assert refused.errors == ["HTTP 401"]
        # The simulator saw every path's calls, and not the refused one.
        assert sim_stats(paths.gateway.sim_url)["requests"] == 5 * 2 * CALLS
        # The key's request counter, in gateway+keys' own Memcached: one per call it let by.
        mc_port = int(keyed.memcached_addr.rsplit(":", 1)[1])
        counters = memcached_keys(mc_port, "llmgate:rl:v1:bench:requests:")
        assert counters, "no request counter for the key"
        assert sum(int(memcached_get(mc_port, k) or 0) for k in counters) == 2 * CALLS
        # Features off: the floor and the gateway have no Memcached and no keys file.
        for name in ("floor", "gateway"):
            stack = paths.stacks[name]
            assert stack.memcached_addr == ""
            assert "LLMGATE_KEYS_FILE" not in stack.options.env
        assert [paths.routes["gateway+keys"].memcached] == [[keyed.proc("memcached").popen.pid]]
    assert not [p for p in paths.procs if p.popen.poll() is None], "left running"
