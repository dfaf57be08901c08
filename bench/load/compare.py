"""Numbers users can compare with other gateways': `python -m bench.compare`.

Users read gateways' published numbers measured two ways, and this measures llmgate both
ways on this machine (docs/performance.md, "Against peers"):

- **added latency of sequential calls** against an instant mock: one caller, a non-stream
  chat call, 15 calls of warm-up then 7 rounds of 25; each round's p50, straight to the
  simulator and through the gateway; the median of the rounds' differences;
- **req/s at concurrency 10** against the same mock, for chat, Responses and Messages,
  streamed and not, with p50 and p99 of each call's whole time; the gateway's **peak RSS**
  (nginx and gunicorn trees, sampled after each case) and its **cold start** (from starting
  the stack to its first ready answer).

With ``--public``, the public cross-gateway method instead (bench/load/public.py): added p99
at one caller, sustained req/s against a 20 ms mock, stall-free streams, translated req/s.

Twice: features off (`make run`'s shape, cache off) and on (a keys file with per-key limits
counted in Memcached; the JSON log line and metrics are always on). The mock is the built-in
simulator answering at once (no time to the first token, 100,000 tokens a second), 16 tokens
an answer. Peers often publish with their features off.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.tenancy.keyring import hash_key
from bench.kit import loadgen, proctree
from runner.stack import Stack, StackOptions

INSTANT = ["--ttft-ms", "0", "--tps", "100000"]
SECRET = "llmg-bench-compare-secret"
PROMPT = [{"role": "user", "content": "Say something short."}]
DOORS = {
    "chat": ("/v1/chat/completions", {"model": "sim-small", "messages": PROMPT, "max_tokens": 16}),
    "responses": ("/v1/responses", {"model": "sim-small", "input": "Say something short.",
                                    "max_output_tokens": 16}),
    "messages": ("/v1/messages", {"model": "sim-small", "messages": PROMPT, "max_tokens": 16}),
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    door: str
    stream: bool
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def request(door: str, stream: bool, headers: dict[str, str]) -> bytes:
    path, body = DOORS[door]
    extra = {"anthropic-version": "2023-06-01"} if door == "messages" else {}
    return loadgen.request_bytes(path, {**body, "stream": stream}, {**extra, **headers})


def write_keys(directory: Path, secret: str) -> Path:
    """A keys file with one key, ``secret``, whose per-key limits are far above any bench's
    load (so the limits are counted on every call and never refuse one); its path."""
    keys = directory / "keys.toml"
    keys.write_text(
        f'[[keys]]\nname = "bench"\nsha256 = "{hash_key(secret)}"\n'
        "requests_per_minute = 10000000\ntokens_per_minute = 1000000000\n"
        "tokens_per_day = 1000000000\nmax_streams = 100000\n"
    )
    return keys


Address = tuple[str, int]


def added_latency_ms(
    gateway: Address, direct: Address, auth: dict[str, str], rounds: int, per_round: int, warm: int
) -> tuple[float, list[float]]:
    """The median over rounds of (gateway p50 - direct p50), sequential non-stream chat."""
    to_gateway, to_direct = request("chat", False, auth), request("chat", False, {})
    loadgen.run(*gateway, to_gateway, 1, warm)
    loadgen.run(*direct, to_direct, 1, warm)
    added = []
    for _ in range(rounds):
        through = loadgen.run(*gateway, to_gateway, 1, per_round)
        straight = loadgen.run(*direct, to_direct, 1, per_round)
        added.append(loadgen.pct(through.total, 0.5) - loadgen.pct(straight.total, 0.5))
    return statistics.median(added), added


def start(run_dir: Path, env: dict[str, str]) -> tuple[Stack, float]:
    options = StackOptions(run_dir=run_dir, workers=2, simulator_args=INSTANT,
                           env={"LLMGATE_CACHE_MODE": "off", **env})  # fmt: skip
    began = time.monotonic()
    stack = Stack(options).start()  # returns once nginx and gunicorn answer as ready
    return stack, time.monotonic() - began


def side(name: str, env: dict[str, str], auth: dict[str, str], args: argparse.Namespace) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-compare-"))
    stack: Stack | None = None
    try:
        stack, cold = start(run_dir, env)
        host, port = stack.url.removeprefix("http://").rsplit(":", 1)
        sim_host, sim_port = stack.sim_url.removeprefix("http://").rsplit(":", 1)
        gateway, direct = (host, int(port)), (sim_host, int(sim_port))
        pids = [p for n in ("nginx", "gunicorn") for p in proctree.tree(stack.proc(n).popen.pid)]
        median, rounds = added_latency_ms(gateway, direct, auth, 7, 25, 15)
        print(f"\n{name}: cold start {cold:.2f} s; added latency p50 {median:.2f} ms "
              f"(rounds: {', '.join(f'{r:.2f}' for r in rounds)})")  # fmt: skip
        peak = proctree.rss_kb(pids)
        print("| door | stream | req/s | p50 ms | p99 ms | errors | direct req/s |")
        print("|---|---|---|---|---|---|---|")
        for door in DOORS:
            for stream in (False, True):
                call = request(door, stream, auth)
                loadgen.run(*gateway, call, 10, 100)
                done = loadgen.run(*gateway, call, 10, args.calls)
                mock = loadgen.run(*direct, request(door, stream, {}), 10, args.calls)
                peak = max(peak, proctree.rss_kb(pids))
                print(f"| {door} | {stream} | {done.rps:.0f} | {loadgen.pct(done.total, 0.5):.2f}"
                      f" | {loadgen.pct(done.total, 0.99):.2f} | {len(done.errors)}"
                      f" | {mock.rps:.0f} |")  # fmt: skip
        print(f"{name}: peak RSS of nginx + gunicorn {peak / 1024:.0f} MB")
    finally:
        if stack is not None:
            stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def public(smoke: bool) -> None:
    """The public method's section (bench/load/public.py), printed as the report shows it."""
    from bench.kit.report import Config, table, verdicts
    from bench.load.public import run

    out = Path(tempfile.mkdtemp(prefix="llmgate-compare-public-"))
    try:
        section = run(Config(out_dir=out, smoke=smoke))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("\n".join([f"\n## {section.title}\n", *table(section.columns, section.rows, ".1f")]))
    print("\n".join(["", *(f"- {note}" for note in section.notes), "", *verdicts(section.checks)]))
    print(f"\nfigures: {section.data['figures']}\nsettings: {section.data['settings']}")


def overload(callers: list[int], rounds: int) -> None:
    """The public method's sustained steps at ``callers`` only, through a fresh `make run`
    stack: each step's row, its fair bound and its tail's own stages (bench/load/public.py)."""
    from bench.kit.report import table
    from bench.load import public as method

    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-compare-overload-"))
    try:
        with method.started(method.options(run_dir)) as stack:
            gateway = method.address(stack.url)
            rows = []
            for n in callers:
                for _ in range(rounds):
                    found = method.step(gateway, method.chat(), n, max(3000, n * 10), stack.sim_url)
                    rows.append(method.row("chat", found))
        print("\n".join(table(method.COLUMNS, rows, ".1f")))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per case at 10")
    parser.add_argument(
        "--public",
        action="store_true",
        help="the public cross-gateway method instead (bench/load/public.py; `python -m bench "
        "--only public` writes it into the report)",
    )
    parser.add_argument("--smoke", action="store_true", help="with --public: tiny sizes")
    parser.add_argument(
        "--callers",
        default="",
        help="with --public: only the sustained method's chat steps at these callers, "
        "comma-separated, each run --rounds times (e.g. 800: the overload's fair share)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --callers: runs of each")
    args = parser.parse_args()
    if args.public and args.callers:
        overload([int(c) for c in args.callers.split(",")], args.rounds)
        return
    if args.public:
        public(args.smoke)
        return
    side("features off", {}, {}, args)
    keys = write_keys(Path(tempfile.mkdtemp(prefix="llmgate-compare-keys-")), SECRET)
    try:
        side("features on", {"LLMGATE_KEYS_FILE": str(keys)},
             {"Authorization": f"Bearer {SECRET}"}, args)  # fmt: skip
    finally:
        shutil.rmtree(keys.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
