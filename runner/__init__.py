"""Starts llmgate's processes (memcached, simulator, gunicorn, nginx) on loopback.

One code path for `make run`, the integration tests and the benchmarks, so what the tests
exercise is what users run. Nothing here is imported by the gateway itself.
"""
