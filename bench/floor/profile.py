"""Where the gateway's CPU goes beyond the floor's: `python -m bench.floor.profile [chat|stream|
hit] [--seconds 10] [--callers 32]`.

The floor (bench/floor/app.py) and then the gateway with its features off (cache off but for
``hit``, no keys, ``LLMGATE_LOG_REQUESTS=false``), each one gunicorn worker under the same
steady load (bench/cpu/profile.py's calls), sampled by py-spy (``pip install py-spy``, not a
requirement). Each side's CPU per call, read from /proc, is shared out over the source files
by their own samples; the table lists, per file, the microseconds a call spends there in
each and the difference, largest first: what stands between the gateway and its floor.
Samples are proportions of a busy worker, so the figures are estimates (±10 % or so); the
sum of the differences is the measured gap.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.cpu.profile import CALLS
from bench.floor import FLOOR_APP
from bench.kit import loadgen, proctree
from runner.stack import Stack, StackOptions

_WHERE = re.compile(r"\((.*?):\d+\)")


def area(frame: str) -> str:
    """The file a frame runs in, as py-spy names it (relative to the project, its package or
    the standard library: app/edge/calls.py, gevent/_socketcommon.py, http/client.py)."""
    found = _WHERE.search(frame)
    path = found.group(1) if found else ""
    return path.rsplit("site-packages/", 1)[-1] or "(native)"


def own_by_area(samples: Path) -> tuple[collections.Counter[str], int]:
    """Samples by the file of their innermost frame, and the total."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in samples.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            total += int(n)
            own[area(stack.rsplit(";", 1)[-1])] += int(n)
    return own, total


def profile(
    kind: str, wsgi_app: str, seconds: float, callers: int, keep: Path | None = None
) -> tuple[float, dict]:
    """(CPU ms per call, {file: ms per call}) of one worker serving ``kind``; py-spy's raw
    samples copied to ``keep`` when given (for the stacks behind a row)."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    fields, headers = CALLS[kind]
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-floor-profile-"))
    env = {"LLMGATE_CACHE_MODE": "deterministic" if kind == "hit" else "off",
           "LLMGATE_LOG_REQUESTS": "false"}  # fmt: skip
    stack = Stack(StackOptions(run_dir=run_dir, workers=1, memcached=False, env=env,
                               wsgi_app=wsgi_app)).start()  # fmt: skip
    try:
        host, port = stack.url.removeprefix("http://").rsplit(":", 1)
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "p"}], **fields}
        request = loadgen.request_bytes("/v1/chat/completions", body, headers)
        worker = proctree.tree(stack.proc("gunicorn").popen.pid)[1]
        results: list[loadgen.Result] = []
        load = threading.Thread(target=lambda: results.append(loadgen.run(
            host, int(port), request, callers, 10**7, timeout=seconds + 4)))  # fmt: skip
        load.start()
        time.sleep(2)
        samples = run_dir / "samples.txt"
        before = proctree.cpu_s([worker])
        subprocess.run([py_spy, "record", "-p", str(worker), "-d", str(int(seconds)), "-r", "250",
                        "-f", "raw", "-o", str(samples), "--nonblocking"],
                       check=True, capture_output=True)  # fmt: skip
        cpu = proctree.cpu_s([worker]) - before
        load.join()
        calls = len(results[0].total) / results[0].wall * int(seconds)
        per_call = 1000 * cpu / max(1.0, calls)
        own, total = own_by_area(samples)
        if keep is not None:
            shutil.copyfile(samples, keep)
        return per_call, {name: per_call * n / max(1, total) for name, n in own.items()}
    finally:
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor.profile", description=__doc__)
    parser.add_argument("kind", nargs="?", default="chat", choices=sorted(CALLS))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="a folder to keep py-spy's raw samples in (floor.txt, gateway.txt)",
    )
    args = parser.parse_args()
    keep = (lambda side: None) if args.keep is None else (lambda side: args.keep / f"{side}.txt")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    floor, floor_at = profile(args.kind, FLOOR_APP, args.seconds, args.callers, keep("floor"))
    gateway, gateway_at = profile(args.kind, "", args.seconds, args.callers, keep("gateway"))
    print(f"{args.kind}: floor {floor:.3f} ms/call, gateway {gateway:.3f} ms/call "
          f"({gateway / floor:.2f}x), gap {1000 * (gateway - floor):.0f} us")  # fmt: skip
    rows = sorted(
        ((gateway_at.get(n, 0.0) - floor_at.get(n, 0.0), n) for n in {*floor_at, *gateway_at}),
        reverse=True,
    )
    print(f"{'us/call more':>12}  {'file':50} {'floor':>7} {'gateway':>8}")
    for more, name in rows[: args.rows]:
        print(f"{1000 * more:12.1f}  {name[:50]:50} {1000 * floor_at.get(name, 0.0):7.1f} "
              f"{1000 * gateway_at.get(name, 0.0):8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
