"""llmgate: an OpenAI-compatible accelerating gateway.

Layers, imports flow downwards only:

    web            factory.py, routes.py, wsgi.py           Flask, request/response shapes
    orchestration  gateway.py, relay.py                      one call from request to response
    adapters       upstream.py, cache/, metrics.py           the only owners of sockets and clients
    pure           config.py, errors.py, sse.py, schema.py,  stdlib only, no I/O
                   headers.py, policy.py

Nothing here is created at import time: the app factory builds the urllib3 PoolManager,
the cache client and the metrics registry inside the gunicorn worker, after gevent patched.
"""
