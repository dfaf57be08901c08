"""`make run`: the gateway on http://127.0.0.1:8080 with whatever this machine has.

Starts memcached and nginx when installed (otherwise says how to install them and runs
without: gunicorn on the public port, no shared cache), the simulator when no upstream is
configured, and stops every child on Ctrl-C or when one of them dies. SIGHUP reloads:
the upstreams file is checked, gunicorn starts fresh workers while the old ones drain, and
nginx re-reads its config. SIGTERM drains (runner/drain.py): /readyz answers 503 at once
while calls are served for LLMGATE_DRAIN_DELAY_S, then gunicorn ends its calls within
LLMGATE_GRACEFUL_TIMEOUT_S while nginx goes on answering, then nginx quits (deploy/Dockerfile
runs this same command; a Kubernetes pod is stopped with SIGTERM).

A start that cannot be is one line, last: a bad setting (runner/settings.py for the runner's
own, app/core/config.py for the gateway's), a port or run directory another server or runner
holds (runner/claims.py: nginx's reuseport would let a second one join the port), or the
cause a child gave as it died (runner/procs.py), whose log keeps the rest. Under make, make
adds no line after it, and a SIGINT to make alone stops the stack (runner/make_parent.py).

`make run-cluster` is the same runner with ``--instances 3 --memcached-nodes 2``: several
gunicorn instances behind one nginx upstream block, sharing two Memcached nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from app.core.config import Settings, SettingsError
from app.store.spend_db import redacted
from app.upstream.catalog import ConfigError
from runner import limits, postgres, resolve
from runner.drain import drain, turn_unready
from runner.make_parent import MakeParent
from runner.procs import StartError, find_binary
from runner.settings import RunnerSettings, with_values
from runner.stack import Stack, StackOptions

INSTALL_HINT = "sudo apt-get install -y nginx-light memcached"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runner", description=__doc__)
    parser.add_argument("--instances", type=int, default=1, help="gunicorn instances")
    parser.add_argument("--memcached-nodes", type=int, default=1, help="Memcached nodes")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.memcached_nodes < 1:
        parser.error("--instances and --memcached-nodes must be at least 1")
    return args


def options_from_env(
    args: argparse.Namespace, runner: RunnerSettings | None = None
) -> StackOptions:
    """Every setting checked first (a bad value stops the start before anything is said or
    started), then what this machine has."""
    env = os.environ
    runner = runner or RunnerSettings.from_env(env)
    settings = Settings.from_env(env)
    have_nginx = find_binary("nginx") is not None
    # Nodes given in LLMGATE_MEMCACHED (a Kubernetes Service, a system memcached) are used
    # as they are; only without them does the runner start its own.
    external_memcached = bool(env.get("LLMGATE_MEMCACHED", "").strip())
    have_memcached = external_memcached or find_binary("memcached") is not None
    for name, present in (("nginx", have_nginx), ("memcached", have_memcached)):
        if not present:
            print(f"llmgate: {name} is not installed; running without it. Install: {INSTALL_HINT}")
    if args.instances > 1 and not have_nginx:
        raise StartError("several instances need nginx in front of them")
    # Several instances keep their spend in a PostgreSQL of their own where it is installed;
    # one instance (or none installed) in a SQLite file of the run directory.
    use_postgres = args.instances > 1 and not settings.ledger_url.strip() and postgres.installed()
    if args.instances > 1 and not settings.ledger_url.strip() and not use_postgres:
        print(
            "llmgate: PostgreSQL is not installed; the spend ledger is a SQLite file in the run "
            f"directory. Install: {postgres.INSTALL_HINT}"
        )
    tls_port: int | None = runner.tls_port if have_nginx and runner.tls_port else None
    if tls_port is not None and not settings.tls_cert and find_binary("openssl") is None:
        print(
            "llmgate: openssl is not installed and LLMGATE_TLS_CERT is not set: no HTTPS "
            "listener. Install: sudo apt-get install -y openssl"
        )
        tls_port = None
    return StackOptions(
        run_dir=runner.run_dir,
        port=runner.port,
        host=runner.host,
        app_bind=runner.bind_setting if args.instances == 1 else "",
        workers=runner.workers,
        upstream_url=env.get("LLMGATE_UPSTREAM_URL", ""),
        nginx=have_nginx,
        memcached=have_memcached and not external_memcached,
        env={k: v for k, v in env.items() if k.startswith("LLMGATE_")},
        logs_to_stdout=runner.logs_to_stdout,
        instances=args.instances,
        memcached_nodes=args.memcached_nodes,
        memcached_port=runner.memcached_port,
        simulator_port=runner.simulator_port,
        tls_port=tls_port,
        tls_cert=settings.tls_cert,
        tls_key=settings.tls_key,
        postgres=use_postgres,
    )


def write_scrape_targets(stack: Stack) -> Path:
    """Each instance's own metrics address, in Prometheus' file_sd format: Prometheus adds
    the `instance` label per target, and the Grafana dashboard sums over it."""
    path = stack.options.run_dir / "prometheus-targets.json"
    targets = [u.removeprefix("http://") for u in stack.app_urls]
    path.write_text(json.dumps([{"targets": targets, "labels": {"job": "llmgate"}}], indent=2))
    return path


STREAM_BODY = '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hi"}]}'


def banner(stack: Stack, options: StackOptions) -> str:
    config = os.environ.get("LLMGATE_CONFIG", "")
    upstream = os.environ.get("LLMGATE_UPSTREAM_URL", "")
    upstream_note = (
        f"the upstreams of {config}" if config else upstream or f"simulator at {stack.sim_url}"
    )
    memcached = stack.memcached_addr or os.environ.get("LLMGATE_MEMCACHED", "")
    lines = [f"llmgate is running on {stack.url}"]
    if stack.tls_url:
        lines.append(f"  https:     {stack.tls_url} (HTTP/2; certificate {stack.tls_cert})")
    lines.append(f"  upstream:  {upstream_note}")
    if options.instances > 1:
        lines.append(f"  instances: {', '.join(stack.app_urls)} (metrics: each one's /metrics)")
        lines.append(f"  scrape:    {write_scrape_targets(stack)}")
    lines.append(f"  memcached: {memcached or 'none (in-process only)'}")
    if os.environ.get("LLMGATE_KEYS_FILE", "").strip():
        ledger = stack.ledger_url
        lines.append(f"  ledger:    {'none' if ledger == 'off' else redacted(ledger)}")
    if stack.sizing is not None:
        lines.append(f"  capacity:  {capacity(stack)}")
    logs = "stdout" if options.logs_to_stdout else options.run_dir / "logs"
    lines.append(f"  logs:      {logs}")
    https = ""
    if stack.tls_url:
        url = stack.tls_url.replace("127.0.0.1", "localhost") + "/v1/chat/completions"
        https = (
            f"\n  curl --http2 -N --cacert {stack.tls_cert} {url} \\\n"
            "    -H 'Content-Type: application/json' \\\n"
            f"    -d '{STREAM_BODY}'\n"
        )
    return (
        "\n"
        + "\n".join(lines)
        + f"""

Try it:
  curl -N {stack.url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model":"sim-model","stream":true,"messages":[{{"role":"user","content":"Hi"}}]}}'
{https}
  OPENAI_BASE_URL={stack.url}/v1 OPENAI_API_KEY=sk-anything python your_app.py

Ctrl-C stops everything.
"""
    )


def capacity(stack: Stack) -> str:
    sizing = stack.sizing
    assert sizing is not None
    return (
        f"{sizing.stream_capacity} streams, {sizing.request_capacity} API requests at once "
        f"(LLMGATE_WORKER_CONNECTIONS={sizing.worker_connections} x {sizing.app_workers} "
        f"workers; nginx: {sizing.nginx_workers} workers x {sizing.nginx_connections} "
        "connections)"
    )


def check_limits(stack: Stack) -> None:
    """Our soft descriptor limit up to the hard one (the children inherit it), then a
    warning for each kernel limit too low for the stack's size (runner/limits.py)."""
    limits.raise_nofile()
    for line in limits.warnings(
        limits.read_kernel(), stack.size(), instances=stack.options.instances
    ):
        print(f"llmgate: warning: {line}", file=sys.stderr, flush=True)


def check_upstream_names() -> None:
    """A warning for each upstream host name that does not resolve (runner/resolve.py)."""
    env = os.environ
    for line in resolve.unresolved(resolve.targets(Settings.from_env(env), env)):
        print(f"llmgate: warning: {line}", file=sys.stderr, flush=True)


def could_not_start(exc: StartError | SettingsError | OSError) -> int:
    """The cause, last and alone: the log it came from (which keeps the whole story) is
    named on the line before."""
    log = getattr(exc, "log", None)
    if log is not None:
        print(f"llmgate: the whole output is in {log}", file=sys.stderr)
    line = with_values(str(exc), os.environ) if isinstance(exc, SettingsError) else str(exc)
    print(f"llmgate: could not start: {line}", file=sys.stderr, flush=True)
    return 1


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`make run`: under make, a failure ends make quietly so its own line does not follow
    ours, and make's SIGINT stops us (runner/make_parent.py)."""
    args = parse_args(argv)
    make = MakeParent.find()
    code = run(args, make)
    if code and make is not None:
        make.end_quietly()
    return code


def run(args: argparse.Namespace, make: MakeParent | None) -> int:
    try:
        runner = RunnerSettings.from_env(os.environ)
        options = options_from_env(args, runner)
    except (StartError, SettingsError) as exc:
        return could_not_start(exc)
    stack = Stack(options)
    try:
        # Ports and run directory first: a second runner is refused before it says more.
        stack.claim()
    except (StartError, OSError) as exc:
        stack.stop()
        return could_not_start(exc)
    stopping = draining = reloading = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping, draining
        if signum == signal.SIGTERM and not draining:
            # Unready now, not at the main loop's next turn (runner/drain.py).
            turn_unready(stack.drain_file)
        stopping = True
        draining = draining or signum == signal.SIGTERM

    def reload(signum: int, frame: object) -> None:
        nonlocal reloading
        reloading = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, reload)
    try:
        check_limits(stack)
        check_upstream_names()
        stack.start()
    except (StartError, OSError) as exc:
        return could_not_start(exc)
    print(banner(stack, options), flush=True)
    try:
        while not stopping:
            if make is not None and make.stopping():
                stopping = True  # as on our own Ctrl-C
                break
            if reloading:
                reloading = False
                try:
                    stack.reload()
                    print("llmgate: reloaded (new workers; old ones drain)", flush=True)
                except (OSError, ConfigError) as exc:
                    print(f"llmgate: not reloaded: {exc}", file=sys.stderr, flush=True)
            dead = next((p for p in stack.procs if not p.alive()), None)
            if dead is not None:
                failure = dead.failure(f"exited ({dead.popen.returncode})")
                if failure.log is not None:
                    print(f"llmgate: the whole output is in {failure.log}", file=sys.stderr)
                print(f"llmgate: {failure}", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
    finally:
        if draining:
            drain(stack, runner.graceful_timeout_s, runner.drain_delay_s, say=_say)
        else:
            print("llmgate: stopping", flush=True)
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
