"""`make run`: the gateway on http://127.0.0.1:8080 with whatever this machine has.

Starts memcached and nginx when installed (otherwise says how to install them and runs
without: gunicorn on the public port, no shared cache), the simulator when no upstream is
configured, and stops every child on Ctrl-C or when one of them dies. SIGHUP reloads:
the upstreams file is checked, gunicorn starts fresh workers while the old ones drain, and
nginx re-reads its config.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from app.upstreams import ConfigError
from runner.procs import StartError, find_binary
from runner.stack import ROOT, Stack, StackOptions

INSTALL_HINT = "sudo apt-get install -y nginx-light memcached"


def main() -> int:
    port = int(os.environ.get("LLMGATE_PORT", "8080"))
    upstream = os.environ.get("LLMGATE_UPSTREAM_URL", "")
    have_nginx = find_binary("nginx") is not None
    have_memcached = find_binary("memcached") is not None
    for name, present in (("nginx", have_nginx), ("memcached", have_memcached)):
        if not present:
            print(f"llmgate: {name} is not installed; running without it. Install: {INSTALL_HINT}")
    options = StackOptions(
        run_dir=Path(os.environ.get("LLMGATE_RUN_DIR", ROOT / ".run")),
        port=port,
        workers=int(os.environ.get("LLMGATE_WORKERS", "2")),
        upstream_url=upstream,
        nginx=have_nginx,
        memcached=have_memcached,
        env={k: v for k, v in os.environ.items() if k.startswith("LLMGATE_")},
    )
    stack = Stack(options)
    stopping = False

    reloading = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def reload(signum: int, frame: object) -> None:
        nonlocal reloading
        reloading = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, reload)
    try:
        stack.start()
    except StartError as exc:
        print(f"llmgate: could not start: {exc}", file=sys.stderr)
        return 1
    config = os.environ.get("LLMGATE_CONFIG", "")
    upstream_note = (
        f"the upstreams of {config}" if config else upstream or f"simulator at {stack.sim_url}"
    )
    print(
        f"""
llmgate is running on {stack.url}
  upstream:  {upstream_note}
  memcached: {stack.memcached_addr or "none (in-process only)"}
  logs:      {options.run_dir / "logs"}

Try it:
  curl -N {stack.url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model":"sim-model","stream":true,"messages":[{{"role":"user","content":"Hi"}}]}}'

  OPENAI_BASE_URL={stack.url}/v1 OPENAI_API_KEY=sk-anything python your_app.py

Ctrl-C stops everything.
""",
        flush=True,
    )
    try:
        while not stopping:
            if reloading:
                reloading = False
                try:
                    stack.reload()
                    print("llmgate: reloaded (new workers; old ones drain)", flush=True)
                except (OSError, ConfigError) as exc:
                    print(f"llmgate: not reloaded: {exc}", file=sys.stderr, flush=True)
            dead = [p for p in stack.procs if not p.alive()]
            if dead:
                print(f"llmgate: {dead[0].name} exited:\n{dead[0].log_tail()}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        print("llmgate: stopping", flush=True)
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
