"""gunicorn settings for llmgate: gevent workers, no preload, nothing network-related here.

gevent patches the worker before it imports the app, so this file must not import ssl,
urllib3, requests or the app (gevent warns that ssl was patched too late, and sockets made
before the fork would be shared). Values come from LLMGATE_* variables, see README.
"""

import os
import resource
import tempfile
import time
from pathlib import Path

bind = os.environ.get("LLMGATE_BIND", "127.0.0.1:8000").split(",")
workers = int(os.environ.get("LLMGATE_WORKERS", "2"))
worker_class = "gevent"
# Each stream holds one connection for its whole life; gunicorn's default of 1000 left
# streams beyond it hanging. Descriptors are raised to match in on_starting.
worker_connections = int(os.environ.get("LLMGATE_WORKER_CONNECTIONS", "5000"))
wsgi_app = "app.factory:create_app()"
preload_app = False
# gevent workers answer gunicorn's liveness checks from the hub, so this is not a request
# timeout; the gateway's own timeouts bound every request.
timeout = 30
# Draining workers are killed after this on reload/stop: it must cover the longest stream
# we promise to finish (the gateway's total deadline).
graceful_timeout = int(os.environ.get("LLMGATE_GRACEFUL_TIMEOUT_S", "600"))
# Longer than nginx's upstream keepalive_timeout (60 s), so nginx closes idle connections
# first and never sends a request on a connection gunicorn is closing.
keepalive = 75
backlog = 4096
control_socket_disable = True
accesslog = os.environ.get("LLMGATE_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("LLMGATE_LOG_LEVEL", "info")
proc_name = "llmgate"

# Prometheus multiprocess mode: every worker writes its samples here and /metrics sums them.
# Set before the workers fork (they inherit it) and before they import prometheus_client.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="llmgate-metrics-")


def on_starting(server):
    # Shared by every worker, for the status page's uptime.
    os.environ["LLMGATE_STARTED_AT"] = str(time.time())
    # Samples of a previous run would be summed into this one's.
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    # Raise the soft descriptor limit to the hard one: each stream costs two descriptors
    # (client + upstream) and the default 1024 caps a worker near 500 streams.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1048576
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def child_exit(server, worker):
    # A dead worker's live gauges (active streams, pool use) must stop counting. The import
    # stays here: app.metrics imports only prometheus_client, and only the master runs this.
    from app.metrics import mark_process_dead

    mark_process_dead(worker.pid)
