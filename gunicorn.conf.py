"""gunicorn settings for llmgate: gevent workers, no preload, nothing network-related here.

gevent patches the worker before it imports the app, so this file must not import ssl,
urllib3, requests or the app (gevent warns that ssl was patched too late, and sockets made
before the fork would be shared). Values come from LLMGATE_* variables, see README.
"""

import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

bind = os.environ.get("LLMGATE_BIND", "127.0.0.1:8000").split(",")
workers = int(os.environ.get("LLMGATE_WORKERS", "2"))
# gevent's worker, with gunicorn's own error pages (requests its parser refuses) written as
# OpenAI JSON instead of HTML. A dotted path (gunicorn does not take "module:Class" here):
# this file must not import the app.
worker_class = "app.edge.worker.JSONErrorGeventWorker"
# Each stream holds one connection for its whole life; gunicorn's default of 1000 left
# streams beyond it hanging. Descriptors are raised to match in on_starting.
# The admission limits (LLMGATE_MAX_REQUESTS/STREAMS_PER_WORKER) default to 4/5 and 2/5 of
# it (app/core/config_reading.py, admission_defaults), so the app refuses before gunicorn
# stops accepting.
worker_connections = int(os.environ.get("LLMGATE_WORKER_CONNECTIONS", "15000"))
wsgi_app = "app.factory:create_app()"
preload_app = False
# gevent workers answer gunicorn's liveness checks from the hub, so this is not a request
# timeout; the gateway's own timeouts bound every request.
timeout = 30
# Draining workers are killed after this on reload/stop: it must cover the longest stream
# we promise to finish (the gateway's total deadline).
graceful_timeout = int(os.environ.get("LLMGATE_GRACEFUL_TIMEOUT_S", "600"))
# Longer than nginx's upstream keepalive_timeout (15 s), so nginx closes idle connections
# first and never sends a request on a connection gunicorn is closing (a draining worker
# waits app/edge/worker.py's IDLE_CLOSE_AFTER_S, also longer, before closing its idle ones).
keepalive = 75
backlog = 4096
# Header limits, aligned with nginx (nginx/llmgate.conf.template) so that what nginx accepts
# gunicorn accepts too and nginx's JSON 414/431 answers come first:
# - request line: nginx refuses lines that do not fit one 8k large_client_header_buffer;
#   gunicorn's default (4094) sat below that and answered 4-8 KB URLs itself. 8190 is
#   gunicorn's maximum, and nginx sends gunicorn the caller's request line unchanged
#   (measured: both take a line of 8,190 bytes; nginx refuses 8,191 with its JSON 414).
limit_request_line = 8190
# - one header line: nginx passes none longer than its 8k buffer (its X-Forwarded-For is
#   its own, one address); gunicorn allows more, so nginx's JSON 431 comes first.
limit_request_field_size = 4 * 8192 + 4096
# - header count: nginx limits bytes, not headers, so this one is gunicorn's to enforce
#   (gunicorn's default; clients send ~10-20); the worker class answers it as JSON 431.
limit_request_fields = 100
control_socket_disable = True
# Forwarding headers (X-Forwarded-Proto and its kin) are believed only from nginx, which
# writes its own (nginx/llmgate.conf.template): gunicorn's default, written out. Headers that
# would set SCRIPT_NAME or PATH_INFO are believed from nobody: with gunicorn's default a
# local caller's `SCRIPT_NAME: /v1` header moved the path the app routes on.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
forwarder_headers = ""
accesslog = os.environ.get("LLMGATE_ACCESS_LOG") or None
# gunicorn's default format with the path (%(U)s) instead of the request line (%(r)s): the
# query string stays out of the log, because some callers put their key in it (?api-key=).
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s "%(f)s" "%(a)s"'
errorlog = "-"
loglevel = os.environ.get("LLMGATE_LOG_LEVEL", "info")
proc_name = "llmgate"

# Prometheus multiprocess mode: every worker writes its samples here and /metrics sums them.
# Set before the workers fork (they inherit it) and before they import prometheus_client.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="llmgate-metrics-")


def on_starting(server):
    # A wrong upstreams file stops the start here, once, with its line and field, instead
    # of every worker failing to boot. app.upstream.catalog is pure (standard library only).
    config = os.environ.get("LLMGATE_CONFIG", "").strip()
    if config:
        from app.upstream.catalog import ConfigError, load

        try:
            load(Path(config).read_text(), os.environ, path=config)
        except (OSError, ConfigError) as exc:
            sys.exit(f"llmgate: LLMGATE_CONFIG: {exc}")
    # The gateway keys file likewise (app.tenancy.keyring is pure too). Workers re-read it when it
    # changes; a later bad edit is logged and ignored there, the keys in force stay.
    keys_file = os.environ.get("LLMGATE_KEYS_FILE", "").strip()
    if keys_file:
        from app.tenancy.keyring import KeysFileError
        from app.tenancy.keyring import load as load_keys

        try:
            load_keys(Path(keys_file).read_text(), path=keys_file)
        except (OSError, KeysFileError) as exc:
            sys.exit(f"llmgate: LLMGATE_KEYS_FILE: {exc}")
    # Shared by every worker, for the status page's uptime.
    os.environ["LLMGATE_STARTED_AT"] = str(time.time())
    # Samples of a previous run would be summed into this one's, and the status page's
    # history (app/edge/status_history.py: standard library only) would chart them.
    from app.edge.status_history import DIRECTORY

    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    shutil.rmtree(directory / DIRECTORY, ignore_errors=True)
    # Raise the soft descriptor limit to the hard one: each stream costs two descriptors
    # (client + upstream) and the default 1024 caps a worker near 500 streams.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1048576
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# Net allocations between the young generation's collections in a worker (Python's default 700).
YOUNG_GENERATION = 7000


def post_worker_init(worker):
    # The worker's imports and its app live as long as it does: frozen, they are out of the
    # garbage collector's full passes, which stop the worker while they walk every object
    # they track (~47,000 here: ~15 ms a pass on a 2-core box, 20-35 ms with tracing on and
    # its queue full; 1-4 ms once frozen). Collected first: no garbage is frozen with them.
    gc.collect()
    gc.freeze()
    # The young generation collected every 7,000 net allocations, not 700: a worker's calls
    # allocate and free in bursts, and with a hundred calls in flight the default ran a pass
    # every few calls, 4-5 % of a worker's CPU at 200 callers (timed with gc.callbacks); at
    # 7,000, 0.4-0.8 %. Older generations keep their defaults (docs/performance.md).
    gc.set_threshold(YOUNG_GENERATION, 10, 10)


# How long a worker that is exiting waits for its spend ledger's last rows to be written.
LEDGER_CLOSE_S = 5.0


def worker_exit(server, worker):
    # In the worker, after its last call (SIGTERM, a reload, SIGQUIT): the rows of the calls
    # that settled since the ledger's last batch are written now (app/store/spend_ledger.py).
    app = getattr(worker, "_application", None)
    ledger = getattr(app, "extensions", {}).get("llmgate.ledger")
    if ledger is not None:
        ledger.close(LEDGER_CLOSE_S)


def child_exit(server, worker):
    # A dead worker's live gauges (active streams, pool use) must stop counting. The import
    # stays here: app.observe.metrics imports only prometheus_client, and only the master runs this.
    from app.observe.metrics import mark_process_dead

    mark_process_dead(worker.pid)
