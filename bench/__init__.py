"""Benchmarks: numbers, never asserts. What llmgate costs, measured against the simulator
reached directly, nginx alone, the shape's floor and the same call without a feature, on one
machine in one run (docs/performance.md says what each measures and how to run it).

    python -m bench          the report (bench/__main__.py): every section of
                             bench/kit/report.py's MODULES, into bench/results/<date>/
    kit/                     what every measurement shares: the report's contract, the load
                             generator, /proc readers, the machine's facts, the plots
    load/                    the whole stack under load: overhead against direct, nginx-only
                             and the floor; memory per held stream; cache hits; capacity;
                             the peers' measures (compare); a cluster (docs/scaling.md)
    floor/                   the floor: the app that only relays, and the gateway against it
    cpu/                     what one call costs: two revisions in turns (ab), the app alone
                             in one process (call_cpu, hit_cpu, grant_cpu), counted by
                             cachegrind, profiled (py-spy), Memcached's round trips, gunicorn's
                             parser, translated calls
    client/                  what a client sees of its connection: a WAN and TLS (the seed
                             table), HTTP/1.1 against HTTP/2
    tracing/                 what traces cost: the tail with a collector working, silent or
                             absent, and the CPU per call

`python -m bench.ab`, `python -m bench.call_cpu` and `python -m bench.compare` are quoted in
issues and notes: those three stay here as thin entry points of cpu/ and load/.
"""
