"""The seed table, reproduced: what a WAN round trip and TLS cost a client, and what llmgate
saves it.

    direct    client ──TLS──▶ fault proxy (RTT) ──▶ TLS front ──▶ simulator
    llmgate   client ──http (loopback)──▶ nginx ▶ gunicorn ══pooled TLS══▶ the same proxy …

The simulator is behind a TLS front with a certificate made for the run
(tests/support/tls.py) and our fault proxy (tests/support/faultproxy.py), which adds half the
RTT each way and one more RTT to a new connection's first flight, the TCP handshake the
kernel finishes on loopback at once. The gateway trusts the certificate through
LLMGATE_UPSTREAM_CA_BUNDLE. Rows, each in a client process of its own (bench/client/seed_client.py,
so its peak RSS and tracemalloc see only the client):

    (a) naive client, a new HTTPS connection per call   (d) naive client through llmgate
    (b) pooled client (one requests Session)            (e) (d), streaming
    (c) pooled client, streaming                        (f) (d), a cache hit

Then the reuse saving, (a) - (b), at other RTTs and with TLS 1.2, to show that it is so many
round trips (bench/client/seed_math.py has the arithmetic) and not a fixed number of milliseconds.
Numbers, not asserts; WAN-bound rows barely move on a busy machine, the cache hit row does.

`python -m bench.client.seed [--rtt-ms 100] [--requests 50]` prints the tables; `python -m bench`
(`--only seed` for this part alone) puts them in the report through ``run``. The rows, the
sections and the plots are built in bench/client/seed_table.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

from bench.client.seed_client import HEADERS
from bench.client.seed_table import ROWS, SMOKE, Options, RowSpec, print_section, sections
from bench.kit.report import Config, Section
from runner.procs import find_binary
from runner.stack import Stack, StackOptions
from tests.support.faultproxy import FaultProxy
from tests.support.sim import SimProcess
from tests.support.tls import TLSFront, make_certificate

ROOT = Path(__file__).resolve().parents[2]


class Wan:
    """A TLS front on the simulator behind a fault proxy adding ``rtt_ms``."""

    def __init__(self, sim_port: int, cert: Path, key: Path, rtt_ms: float, **tls: Any) -> None:
        self.front = TLSFront(sim_port, cert, key, **tls)
        self.proxy = FaultProxy("127.0.0.1", self.front.port).start()
        self.url = f"https://127.0.0.1:{self.proxy.port}"
        self.set_rtt(rtt_ms)

    def set_rtt(self, rtt_ms: float) -> None:
        self.rtt_ms = rtt_ms
        self.proxy.latency(rtt_ms / 2000, to_target=rtt_ms / 2000)
        self.proxy.connect_latency(rtt_ms / 1000)

    def stop(self) -> None:
        self.proxy.stop()
        self.front.stop()


def ca_bundle(cert: Path, folder: Path) -> Path:
    """requests' own roots (certifi) plus the bench's certificate: what a client loads."""
    bundle = folder / "bundle.pem"
    roots = Path(requests.certs.where()).read_text()
    bundle.write_text(roots.rstrip("\n") + "\n" + cert.read_text())
    return bundle


def body(opts: Options, spec: RowSpec, prompt: str) -> dict[str, Any]:
    # temperature 0 is cached by LLMGATE_CACHE_MODE=deterministic (the default), 0.7 is not.
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": opts.max_tokens,
        "temperature": 0 if spec.cached else 0.7,
        "stream": spec.stream,
    }


def sim_headers(opts: Options, spec: RowSpec) -> dict[str, str]:
    """The simulator answers a non-stream call after its TTFT alone; a model sends it when
    the generation ends, so a non-stream call waits as long as a stream's last token."""
    return {} if spec.stream else {"x-sim-ttft-ms": f"{opts.generation_ms:g}"}


def measure(
    spec: RowSpec, url: str, payload: dict, opts: Options, bundle: Path, front: TLSFront
) -> dict[str, Any]:
    """One row's client process; its JSON plus the TLS handshakes the front saw meanwhile."""
    child = {
        "url": url + "/v1/chat/completions",
        "client": spec.client,
        "body": payload,
        "headers": sim_headers(opts, spec),
        "requests": opts.requests,
        "concurrency": opts.concurrency,
        "ca_bundle": str(bundle),
        "trace_calls": opts.trace_calls,
    }
    handshakes = front.handshakes
    done = subprocess.run(
        [sys.executable, "-m", "bench.client.seed_client", json.dumps(child)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120 + opts.requests * 20,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"row {spec.key}: client failed:\n{done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout)
    out["handshakes"] = front.handshakes - handshakes
    out["calls"] = opts.requests * (2 if opts.concurrency > 1 else 1) + opts.trace_calls
    return out


def warm(url: str, payload: dict, calls: int, concurrency: int) -> None:
    """Fill the gateway's pools (and its workers' imports) before anything is timed."""

    def call(_: int) -> None:
        url_ = url + "/v1/chat/completions"
        session.post(url_, json=payload, headers=HEADERS, timeout=60).raise_for_status()

    with requests.Session() as session, ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(call, range(calls)))


def measure_all(opts: Options, cfg: Config, workdir: Path) -> dict[str, Any]:
    openssl = find_binary("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed (make setup installs it)")
    cert, key = make_certificate(workdir, openssl)
    bundle = ca_bundle(cert, workdir)
    results: dict[str, Any] = {"rows": {}, "scaling": []}
    load_before = os.getloadavg()
    with SimProcess(ttft_ms=opts.ttft_ms, tps=opts.tps) as sim:
        wan = Wan(sim.port, cert, key, opts.rtt_ms)
        stack = Stack(
            StackOptions(
                run_dir=workdir / "stack",
                workers=2,
                upstream_url=f"{wan.url}/v1",
                env={"LLMGATE_UPSTREAM_CA_BUNDLE": str(bundle)},
            )
        )
        try:
            stack.start()
            run_id = uuid.uuid4().hex[:8]
            plain = body(opts, ROWS[0], f"seed {run_id}")
            warm(stack.url, plain, 4 * opts.concurrency, opts.concurrency)
            results["gateway_warm_handshakes"] = dict(wan.front.versions)
            for spec in ROWS:
                cfg.progress(f"seed: ({spec.key}) {spec.name}, RTT {opts.rtt_ms:g} ms")
                payload = body(opts, spec, f"seed {run_id} {spec.key}")
                if spec.cached:  # the miss that stores it, outside the timed calls
                    warm(stack.url, payload, 1, 1)
                url = stack.url if spec.via_gateway else wan.url
                results["rows"][spec.key] = measure(spec, url, payload, opts, bundle, wan.front)
            results["upstream_tls_versions"] = dict(wan.front.versions)
            stack.stop()
            for rtt in opts.scaling_rtts_ms:
                wan.set_rtt(rtt)
                results["scaling"].append(scale(opts, cfg, wan, bundle, plain, rtt, "TLSv1.3"))
            wan.set_rtt(opts.rtt_ms)
        finally:
            stack.stop()
            wan.stop()
        if opts.tls12:
            old = Wan(sim.port, cert, key, opts.rtt_ms, max_version=ssl.TLSVersion.TLSv1_2)
            try:
                for rtt in (0.0, opts.rtt_ms):
                    old.set_rtt(rtt)
                    results["scaling"].append(scale(opts, cfg, old, bundle, plain, rtt, "TLSv1.2"))
            finally:
                old.stop()
    results["load"] = {"before": load_before, "after": os.getloadavg()}
    return results


def scale(
    opts: Options, cfg: Config, wan: Wan, bundle: Path, payload: dict, rtt: float, tls: str
) -> dict[str, Any]:
    """(a) and (b) alone at one RTT and TLS version: the reuse saving there."""
    small = replace(opts, requests=max(5, opts.requests // 2), concurrency=1, trace_calls=0)
    out: dict[str, Any] = {"rtt_ms": rtt, "tls_expected": tls}
    for spec in ROWS[:2]:
        cfg.progress(f"seed: ({spec.key}) at RTT {rtt:g} ms, {tls}")
        out[spec.key] = measure(spec, wan.url, payload, small, bundle, wan.front)
    return out


def run(cfg: Config) -> list[Section]:
    """The report's part (bench/kit/report.py): three sections and two plots."""
    opts = SMOKE if cfg.smoke else Options()
    workdir = Path(tempfile.mkdtemp(prefix="llmgate-seed-"))
    try:
        return sections(measure_all(opts, cfg, workdir), opts, cfg.out_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> list[Section]:
    parser = argparse.ArgumentParser(prog="python -m bench.client.seed", description=__doc__)
    parser.add_argument("--rtt-ms", type=float, default=Options.rtt_ms)
    parser.add_argument("--requests", type=int, default=Options.requests)
    parser.add_argument("--concurrency", type=int, default=Options.concurrency)
    parser.add_argument(
        "--scaling-rtts-ms",
        default=",".join(f"{v:g}" for v in Options.scaling_rtts_ms),
        help="RTTs at which (a) and (b) run again, comma-separated ('' for none)",
    )
    parser.add_argument("--no-tls12", action="store_true", help="skip the TLS 1.2 row")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--out", type=Path, help="write the plots (PNG) and results.json here")
    args = parser.parse_args(argv)
    opts = (
        SMOKE
        if args.smoke
        else Options(
            rtt_ms=args.rtt_ms,
            requests=args.requests,
            concurrency=args.concurrency,
            scaling_rtts_ms=tuple(float(v) for v in args.scaling_rtts_ms.split(",") if v),
            tls12=not args.no_tls12,
        )
    )
    workdir = Path(tempfile.mkdtemp(prefix="llmgate-seed-"))
    cfg = Config(
        out_dir=args.out or workdir, smoke=args.smoke, progress=lambda line: print(line, flush=True)
    )
    try:
        res = measure_all(opts, cfg, workdir)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "seed.json").write_text(json.dumps({"options": opts.__dict__, **res}))
        found = sections(res, opts, args.out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for section in found:
        print_section(section)
    return found


if __name__ == "__main__":
    main()
