"""Command line: ``python -m simulator --host 127.0.0.1 --port 0``.

Prints exactly one line, ``simulator listening on http://HOST:PORT``, once the socket
accepts, so a parent process can wait for it instead of polling. SIGTERM and SIGINT stop
accepting, give open connections ``--grace`` seconds, and exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import signal
import sys

import gevent
from gevent.event import Event

from .app import Config
from .behaviour import Behaviour
from .server import BACKLOG, Server


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m simulator", description="OpenAI-compatible fake LLM upstream."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=_non_negative, default=20.0, help="default 20")
    parser.add_argument("--tps", type=_positive, default=100.0, help="tokens/s, default 100")
    parser.add_argument("--require-key", default=None, help="demand 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--prompt-cache", action="store_true", help="keep a prompt cache per key (prompt_cache)"
    )
    parser.add_argument(
        "--prefill-us", type=_non_negative, default=0.0, help="us per uncached prompt token"
    )
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    parser.add_argument("--idle-timeout", type=_positive, default=300.0, help="seconds")
    parser.add_argument("--grace", type=_non_negative, default=1.0, help="seconds to drain")
    return parser.parse_args(argv)


def raise_fd_limit() -> None:
    """Thousands of concurrent streams need thousands of descriptors: soft limit := hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    # On e.g. macOS with an unlimited hard limit this fails: keep the soft one.
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    defaults = Behaviour(
        ttft_ms=args.ttft_ms,
        tps=args.tps,
        prompt_cache=args.prompt_cache,
        prefill_us=args.prefill_us,
    )
    config = Config(defaults=defaults, require_key=args.require_key)
    server = Server(
        config, args.host, args.port, backlog=args.backlog, idle_timeout=args.idle_timeout
    )
    server.start()
    stopping = Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stopping.set)
    print(f"simulator listening on {server.url}", flush=True)
    stopping.wait()
    server.stop(grace=args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
