"""simulator: an OpenAI-compatible fake LLM upstream for tests, ``make run`` and benchmarks.

Layers, imports flow downwards only:

    process   __main__.py                  command line, fd limit, signals
    network   server.py                    gevent accept loop, keep-alive loop, TCP_NODELAY
    routing   app.py                       routes, API key, fault decision, /sim/* controls
    timing    playback.py, wire.py         TTFT, tokens/s, stalls, resets; socket writes
    state     stats.py                     counters, request log, fail-once counts
    pure      http11.py, behaviour.py,     bytes/dicts in, values out; no I/O, no gevent
              endpoints.py, responses.py,
              responses_api.py, text.py

Per-request behaviour comes from ``x-sim-<name>`` headers or a ``sim/<name>=<value>,...``
model name (see behaviour.py). Output is deterministic: the same prompt gives the same words
and the same embedding. Nothing runs at import time; gevent is never monkey-patched.
"""
