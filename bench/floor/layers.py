"""What each of the floor's choices saves it: `python -m bench.floor.layers [--kinds
stream,non-stream] [--callers 50] [--rounds 3]`.

In turns, the stack with gunicorn serving bench/floor/app.py three ways: through Flask's view
with http.client's own header parser (``flask``), through its lane (``lane``: the call
answered from the WSGI environ, as the gateway's app/edge/lane.py answers its API calls), and
with the lane and the upstream's headers parsed as the gateway parses them (``lane+headers``,
app/patches/http_headers.py; the floor's default). Each is measured as bench/cpu/ab.py measures
a revision (issue 11's calls, CPU of the nginx and gunicorn trees per answered call after a
warm-up); the summaries compare each side with the one before.
"""

from __future__ import annotations

import argparse

from bench.cpu import ab
from bench.cpu.ab import CALLS, Run, measure
from bench.floor import FLOOR_APP

# Each side adds one of the floor's choices to the one before (bench/floor/app.py).
SIDES = {
    "flask": {"LLMGATE_FLOOR_LANE": "0", "LLMGATE_FLOOR_HEADERS": "email"},
    "lane": {"LLMGATE_FLOOR_HEADERS": "email"},
    "lane+headers": {},
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor.layers", description=__doc__)
    parser.add_argument("--kinds", default="stream,non-stream")
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: list[Run] = []
    for round_ in range(1, args.rounds + 1):
        for kind in args.kinds.split(","):
            for side, env in SIDES.items():
                run = measure(kind, args.callers, CALLS[kind], wsgi_app=FLOOR_APP, env=env)
                runs.append(Run(side, kind, run.cpu_ms, run.rps, run.errors, run.others))
                print(f"round {round_}: {kind} {side} {run.cpu_ms:.3f} ms/call", flush=True)
    print("\n".join(ab.summarize(runs, "flask", "lane")))
    print("\n".join(ab.summarize(runs, "lane", "lane+headers")))


if __name__ == "__main__":
    main()
