"""llmgate: an OpenAI-compatible accelerating gateway.

Layers, imports flow downwards only:

    web            factory.py, routes.py, statuspage.py,     Flask, request/response shapes;
                   worker.py                                 gunicorn's own errors as JSON
    orchestration  gateway.py, relay.py, flight.py,          one call from request to response
                   coalesce.py, replay.py, observe.py,
                   race.py, access.py, cache/store.py,
                   lifecycle.py
    adapters       upstream.py, pools.py, cache/{memory,     the only owners of sockets and
                   memcached,tiered,discovery}.py,           clients
                   metrics.py, health.py, otel.py, outbox.py,
                   timers.py
    pure           config.py, errors.py, sse.py, schema.py,  stdlib only, no I/O
                   headers.py, policy.py, keys.py, calls.py,
                   admission.py, budget.py, jsonedit.py, streams.py,
                   status.py, upstreams.py, breaker.py, hedge.py, paths.py,
                   keyring.py, limits.py, tracing.py,
                   cache/{policy,entry,shapes,chunks}.py

Nothing here is created at import time: the app factory builds the urllib3 PoolManager,
the cache client, the metrics registry and the tracer (when tracing is on) inside the
gunicorn worker, after gevent patched.
"""
