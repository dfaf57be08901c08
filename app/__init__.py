"""llmgate: an OpenAI-compatible accelerating gateway.

The tree follows a request's path, one package per stage, each importing only the ones
below it. app/layers.toml is the one table of that layering (what each package is, what it
may import, which of its modules are pure, which own a client library); the layer test holds
every module to it, and docs/architecture.md draws the map and a chat request's path
through it. Beside the packages: ``gateway.py``, the orchestrator, and ``factory.py``.

Beneath them all: ``llmgate_wire`` (the SSE codec and the retry-after parser, also the
client's; stdlib only), a package of its own so that the client ships without the gateway.

Nothing here is created at import time: the app factory builds the urllib3 PoolManager,
the cache client, the metrics registry and the tracer (when tracing is on) inside the
gunicorn worker, after gevent patched.
"""
