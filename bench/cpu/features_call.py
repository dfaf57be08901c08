"""One variant of the features section, measured in a process of its own: `python -m
bench.cpu.features_call --features key,limits,log --upstream URL [--memcached HOST:PORT]
[--otlp URL] [--keys-dir DIR] --sizes JSON` prints one JSON line, each kind's CPU µs per
call of every round and the calls made.

bench/cpu/call_cpu.py's way: the app (`create_app`, the cache off, the status sampler off)
called as a WSGI callable in a gevent-patched process with the environ gunicorn would pass,
the simulator (started by the section, answering at once or at ``tps``) as the upstream;
the CPU of this process (the app's work, its side of the sockets to the simulator, Memcached
and the OTLP receiver, and its own background greenlets: the span exporter), not theirs.
The rounds of the two kinds alternate after a warm-up of each, the collector set up as a
worker's (collected, then frozen). Every answer must be 200 or the process stops.

Each feature switched on alone (bench/cpu/features_table.py's names):

- ``metrics``: the worker's Prometheus metrics, in a multiprocess directory as gunicorn's
  workers keep them; without it the app is built with app/observe/unobserved.py's
  ``Unobserved`` in their place (the factory always builds the real ones: no setting turns
  them off, so the bench swaps the class the factory calls);
- ``log``: LLMGATE_LOG_REQUESTS, each call's JSON line (to stderr: a file here);
- ``key``: a keys file whose one key has no limits, the caller presenting it; ``limits``:
  the key's per-key limits (bench/cpu/ab.py's KEY_LIMITS, far above the load) counted in
  Memcached;
- ``resumable``: LLMGATE_RESUME_WINDOW_S and a stream asking to be resumable, its log kept
  in Memcached (docs/streams.md);
- ``traces``: LLMGATE_OTEL_ENDPOINT, every call's spans exported to a receiver in another
  process;
- ``file``: the upstream named by an upstreams file (LLMGATE_CONFIG) instead of
  LLMGATE_UPSTREAM_URL; ``continuation``: that upstream's ``continuation = "prefix"``, which
  no stream here uses (none is cut): issue 44's "costs nothing until used";
- ``floor``: bench/floor/app.py in place of the gateway (it ignores the others).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from bench.cpu.hit_cpu import BODY, NGINX_HEADERS, App, call_once

FAST_TPS = 1_000_000.0
KEY_SECRET = "sk-bench-features"
KEYS_FILES = {False: "keys-no-limits.toml", True: "keys-limits.toml"}  # by limits
UPSTREAMS_FILES = {False: "upstreams.toml", True: "upstreams-continuing.toml"}  # by continuation


def upstreams_toml(upstream: str, continuation: bool) -> str:
    """The one upstream, the simulator, serving the bench's model (and any other)."""
    mode = 'continuation = "prefix"\n' if continuation else ""
    return f'[[upstreams]]\nname = "sim"\nbase_url = "{upstream}"\nmodels = ["*"]\n{mode}'


def environment(
    features: frozenset[str], upstream: str, memcached: str, otlp: str, keys_dir: str
) -> dict[str, str]:
    """The app's settings for ``features``."""
    env = {"LLMGATE_UPSTREAM_URL": upstream, "LLMGATE_CACHE_MODE": "off",
           "LLMGATE_STATUS_SAMPLE_S": "0",
           "LLMGATE_LOG_REQUESTS": str("log" in features).lower()}  # fmt: skip
    if "key" in features:
        env["LLMGATE_KEYS_FILE"] = str(Path(keys_dir) / KEYS_FILES["limits" in features])
    if features & {"key", "resumable"}:
        env["LLMGATE_MEMCACHED"] = memcached
    if "resumable" in features:
        env["LLMGATE_RESUME_WINDOW_S"] = "30"
    if "traces" in features:
        env["LLMGATE_OTEL_ENDPOINT"] = otlp
    if features & {"file", "continuation"}:
        name = UPSTREAMS_FILES["continuation" in features]
        env["LLMGATE_CONFIG"] = str(Path(keys_dir) / name)
    return env


def headers(features: frozenset[str], kind: str, tps: float) -> dict[str, str]:
    """What the caller sends beyond nginx's headers, as WSGI names them."""
    out = {**NGINX_HEADERS, "HTTP_X_SIM_TTFT_MS": "0", "HTTP_X_SIM_TPS": f"{tps:g}"}
    if "key" in features:
        out["HTTP_AUTHORIZATION"] = f"Bearer {KEY_SECRET}"
    if "resumable" in features and kind == "stream":
        out["HTTP_X_LLMGATE_RESUMABLE"] = "true"
    return out


def build(features: frozenset[str], env: dict[str, str], run_dir: Path) -> App:
    os.environ.update(env)  # the floor reads its upstream as its module is imported
    if "floor" in features:
        from bench.floor.app import app

        return app
    (run_dir / "metrics").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir / "metrics")
    from app import factory
    from app.factory import create_app
    from app.observe.unobserved import Unobserved

    if "metrics" in features:
        return create_app(environ=env)
    with mock.patch.object(factory, "Metrics", Unobserved):
        return create_app(environ=env)


def calls(app: App, body: bytes, head: dict[str, str], n: int, callers: int) -> int:
    """``n`` calls by ``callers`` greenlets at once (the n rounded down to a multiple)."""
    import gevent

    def caller(count: int) -> None:
        for _ in range(count):
            status, _ = call_once(app, body, head)
            if not status.startswith("200"):  # an error answer costs less: not this measure
                raise SystemExit(f"a call was answered {status}")

    each = max(1, n // callers)
    if callers == 1:
        caller(each)
    else:
        gevent.joinall([gevent.spawn(caller, each) for _ in range(callers)], raise_error=True)
    return each * callers


def measure(features: frozenset[str], sizes: dict[str, Any], **where: str) -> dict[str, Any]:
    """Each kind's CPU µs per call of every round, and the calls made in all."""
    from gevent import monkey

    monkey.patch_all()  # as gunicorn's gevent worker does before it loads the app
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-features-"))
    app = build(features, environment(features, **where), run_dir)
    kinds = sizes["kinds"]
    work = {}
    for kind, size in kinds.items():
        body = json.dumps({**BODY, "stream": kind == "stream"}).encode()
        work[kind] = (body, headers(features, kind, size.get("tps", FAST_TPS)), size)
    made = 0
    for body, head, size in work.values():
        made += calls(app, body, head, size["warm"], size["callers"])
    gc.collect()
    gc.freeze()
    rounds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(sizes["rounds"]):
        for kind, (body, head, size) in work.items():
            began = time.process_time()
            done = calls(app, body, head, size["calls"], size["callers"])
            rounds[kind].append((time.process_time() - began) / done * 1e6)
            made += done
    return {"rounds": rounds, "calls": made}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.features_call", description=__doc__)
    parser.add_argument("--features", default="", help="comma-separated, e.g. key,limits")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--memcached", default="")
    parser.add_argument("--otlp", default="")
    parser.add_argument("--keys-dir", default="")
    parser.add_argument("--sizes", required=True, help="JSON: rounds, kinds: {kind: size}")
    args = parser.parse_args()
    features = frozenset(f for f in args.features.split(",") if f)
    where = {"upstream": args.upstream, "memcached": args.memcached, "otlp": args.otlp,
             "keys_dir": args.keys_dir}  # fmt: skip
    print(json.dumps(measure(features, json.loads(args.sizes), **where)), flush=True)


if __name__ == "__main__":
    main()
