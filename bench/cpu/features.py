"""What each feature costs a call, against the same call without it, in one run (issue 45).

The report's ``features`` section: the app alone, in one process per variant
(bench/cpu/features_call.py), each a non-stream call and a stream with its features off,
each feature added alone, the features on together (a key, its limits, the log line, the
metrics) and every feature, beside the floor app. The variants run in turns (in order,
then in reverse), each a fresh process; every one reaches the same simulator, Memcached and
OTLP receiver, started here, whose CPU is not counted. bench/cpu/features_table.py makes
the table and the targets from the processes' rounds.

Why the app alone and not the whole stack: the features are the app's; what nginx and
gunicorn's HTTP cost a call is the same with or without them and is the overhead section's
(whose gateway+keys row is the features on through the stack). Leaving it out makes each
ratio larger than through the stack, never smaller. Why CPU timed and not instructions
counted (`python -m bench.call_cpu --instructions`): a stream's count depends on how its
events fall into reads under valgrind; timed, the best of several rounds in turns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from app.tenancy.keyring import hash_key
from bench.cpu import features_table as table
from bench.cpu.ab import KEY_LIMITS
from bench.cpu.features_call import KEY_SECRET, KEYS_FILES, UPSTREAMS_FILES, upstreams_toml
from bench.kit.report import Config, Section
from bench.tracing.trace_latency import Sink
from runner.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[2]


def sizes(smoke: bool) -> dict[str, Any]:
    """Calls per round of each kind (and at once: ``callers``), rounds per process, turns.
    A stream's 50 events paced at ``tps`` tokens a second (each event its own read, as
    bench/load/overhead.py's streams at 100), so the per-event work is in its figure."""
    if smoke:
        kinds = {"non-stream": {"calls": 8, "callers": 1, "warm": 4},
                 "stream": {"calls": 4, "callers": 2, "warm": 2, "tps": 1_000_000}}  # fmt: skip
        return {"rounds": 1, "turns": 1, "kinds": kinds}
    kinds = {"non-stream": {"calls": 600, "callers": 1, "warm": 300},
             "stream": {"calls": 160, "callers": 16, "warm": 48, "tps": 300}}  # fmt: skip
    return {"rounds": 3, "turns": 2, "kinds": kinds}


def sim_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/sim/stats", timeout=10) as answer:
        return int(json.loads(answer.read())["requests"])


def one(variant: table.Variant, size: dict[str, Any], where: dict[str, str], log: Path) -> Any:
    """One process measuring ``variant``: its rounds by kind, and the calls it made."""
    kinds = {k: v for k, v in size["kinds"].items() if k in variant.kinds()}
    argv = [sys.executable, "-m", "bench.cpu.features_call",
            "--features", ",".join(sorted(variant.features)),
            "--sizes", json.dumps({"rounds": size["rounds"], "kinds": kinds}),
            *(f"--{k.replace('_', '-')}={v}" for k, v in where.items())]  # fmt: skip
    with log.open("w") as stderr:  # the log lines (the log line's variants) and any failure
        done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    if done.returncode:
        raise RuntimeError(f"{variant.name}: exited {done.returncode}: {log.read_text()[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def run(cfg: Config) -> Section:
    size = sizes(cfg.smoke)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-features-"))
    procs: list[Proc] = []
    sink = None
    try:
        for limits, name in KEYS_FILES.items():
            line = f'[[keys]]\nname = "bench"\nsha256 = "{hash_key(KEY_SECRET)}"\n'
            (run_dir / name).write_text(line + (KEY_LIMITS if limits else ""))
        port, mc_port = free_port(), free_port()
        argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        procs.append(Proc("simulator", argv, log_path=run_dir / "simulator.log"))
        sim = f"http://127.0.0.1:{port}"
        procs[-1].wait_http(f"{sim}/healthz")
        argv = ["memcached", "-l", "127.0.0.1", "-p", str(mc_port), "-U", "0", "-m", "64"]
        argv += ["-u", "nobody"] if os.geteuid() == 0 else []
        procs.append(Proc("memcached", argv, log_path=run_dir / "memcached.log"))
        procs[-1].wait_port(mc_port)
        for continuation, name in UPSTREAMS_FILES.items():
            (run_dir / name).write_text(upstreams_toml(f"{sim}/v1", continuation))
        sink = Sink()
        where = {"upstream": f"{sim}/v1", "memcached": f"127.0.0.1:{mc_port}",
                 "otlp": sink.url, "keys_dir": str(run_dir)}  # fmt: skip
        runs: dict[str, list[table.Rounds]] = {v.name: [] for v in table.VARIANTS}
        for turn in range(size["turns"]):
            order = table.VARIANTS if turn % 2 == 0 else tuple(reversed(table.VARIANTS))
            for v in order:
                cfg.progress(f"features: turn {turn + 1}, {v.name}")
                before = sim_requests(sim)
                found = one(v, size, where, run_dir / "variant.log")
                served = sim_requests(sim) - before
                if served != found["calls"]:  # each call went upstream, once
                    raise RuntimeError(f"{v.name}: {found['calls']} calls, {served} upstream")
                runs[v.name].append(found["rounds"])
        spans = sink.spans()
        return section(runs, size, spans)
    finally:
        if sink is not None:
            sink.stop()
        for proc in procs:
            proc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def section(runs: dict[str, list[table.Rounds]], size: dict[str, Any], spans: int) -> Section:
    on = {k: table.turn_ratios(runs, "features on", "none", k) for k in table.KINDS}
    notes = [
        "CPU µs per call of the app alone in one process (python -m bench.cpu.features_call), "
        "the best round of each variant over its turns; `x`: the row's call over the same "
        "call without its feature (`over`), measured in this run; `x floor`: over "
        "bench/floor/app.py's call, a figure, not a target.",
        "Features on over none, each turn's own ratio: "
        + "; ".join(f"{k} " + ", ".join(f"{r:.2f}" for r in on[k]) for k in table.KINDS),
        f"Spans the receiver got: {spans} (the traces rows export every call's).",
    ]
    missed = table.missed(runs)
    if missed:
        notes.append(f"Over {table.TARGET:g}x the call without it: " + "; ".join(missed) + ".")
    return Section(
        key="features",
        title="Features measured against themselves: CPU per call, each over the call without it",
        columns=table.COLUMNS,
        rows=table.rows(runs),
        data={"runs": runs, "settings": size},
        checks=table.checks(runs),
        notes=notes,
    )
