"""llmgate: an OpenAI-compatible accelerating gateway.

Layers, imports flow downwards only:

    web            factory.py, routes.py, statuspage.py,     Flask, request/response shapes;
                   worker.py, unread_body.py                 gunicorn's own errors as JSON,
                                                             its connections
    orchestration  gateway.py, relay.py, flight.py,          one call from request to response
                   coalesce.py, replay.py, observe.py,
                   race.py, access.py, cache/store.py,
                   lifecycle.py
    adapters       upstream.py, pools.py, cache/{memory,     the only owners of sockets and
                   memcached,tiered,discovery}.py,           clients
                   metrics.py, health.py, otel.py, outbox.py,
                   timers.py, history.py
    pure           config.py, errors.py, schema.py,          stdlib and llmgate_wire only,
                   headers.py, policy.py, keys.py, calls.py, no I/O
                   admission.py, budget.py, logmemory.py, jsonedit.py,
                   streams.py, status.py, upstreams.py, breaker.py, outliers.py,
                   hedge.py, paths.py, keyring.py, limits.py, bounds.py, prices.py,
                   metering.py, tracing.py, reasons.py,
                   cache/{policy,entry,shapes,chunks}.py

Beneath them all: ``llmgate_wire`` (the SSE codec and the retry-after parser, also the
client's; stdlib only), a package of its own so that the client ships without the gateway.

Nothing here is created at import time: the app factory builds the urllib3 PoolManager,
the cache client, the metrics registry and the tracer (when tracing is on) inside the
gunicorn worker, after gevent patched.
"""
