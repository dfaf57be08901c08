"""Stopping the stack on SIGTERM without cutting a call, and without a moment in which a
balancer finds the instance gone before it has stopped sending (`make run`, the container,
systemd's stop; Ctrl-C stops at once instead).

1. **Unready, still serving.** The drain file appears (a Kubernetes preStop hook may have
   made it already): gunicorn's ``/readyz`` (app/edge/routes.py) and nginx's own
   (nginx/llmgate.conf.template) answer 503 ``"draining": true``; every other call is
   served as before. This lasts LLMGATE_DRAIN_DELAY_S, counted from when the file
   appeared, so a preStop hook's sleep counts toward it.
2. **gunicorn drains.** SIGTERM: its workers stop listening and finish their calls, or end
   them with ``gateway_shutdown`` (app/streams/drain.py), within LLMGATE_GRACEFUL_TIMEOUT_S.
   nginx keeps answering meanwhile: ``/readyz`` 503, and a call gunicorn no longer takes a
   503 ``gateway_shutdown`` rather than a refused connect. It is reloaded (SIGHUP) at that
   moment so that its idle connections to gunicorn close at once instead of holding a
   draining worker for their idle timeout.
3. **nginx quits** once gunicorn is gone: SIGQUIT, which finishes what it has open (SIGTERM
   would cut it). Then the rest (simulator, memcached) stops, and the file goes.

Only ``turn_unready`` and ``drain`` touch files and processes; the delay left is
``delay_left``'s arithmetic.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from runner.procs import Proc
from runner.stack import Stack

# nginx's share once gunicorn is gone: its requests have all been answered by then, but a
# caller slow to read the end of a stream still gets it (send_timeout bounds a stalled one).
NGINX_QUIT_S = 30.0


def delay_left(delay_s: float, unready_for_s: float) -> float:
    """How much longer to serve unready: what the delay asks beyond what has passed."""
    return max(0.0, delay_s - max(0.0, unready_for_s))


def turn_unready(path: Path, now: float | None = None) -> float:
    """Create the drain file unless it exists; the seconds it has existed (0: made now).
    An existing file keeps its time: a preStop hook's sleep counts toward the delay."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("x"):
            return 0.0
    except FileExistsError:
        return max(0.0, (time.time() if now is None else now) - path.stat().st_mtime)


def _signal_and_wait(procs: list[Proc], sig: int, timeout: float) -> None:
    """Send ``sig`` (0: none) and wait up to ``timeout`` for every one of ``procs`` to end."""
    for proc in procs:
        if sig:
            proc.send_signal(sig)
    end = time.monotonic() + timeout
    while any(p.alive() for p in procs) and time.monotonic() < end:
        time.sleep(0.1)


def drain(
    stack: Stack,
    grace_s: float,
    delay_s: float,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """The three steps above, then ``stack.stop()``: whatever is left after the grace (plus
    a few seconds for gunicorn's own cut) is stopped the hard way."""
    wait = delay_left(delay_s, turn_unready(stack.drain_file))
    say(
        f"llmgate: draining: /readyz answers 503; serving on for {round(wait, 1):g} s, then "
        f"calls get up to {grace_s:g} s to finish"
    )
    try:
        sleep(wait)
        gunicorns = [p for p in stack.procs if p.name.startswith("gunicorn")]
        nginx = [p for p in stack.procs if p.name == "nginx"]
        for proc in gunicorns:
            proc.send_signal(signal.SIGTERM)
        # nginx's idle keep-alive connections to gunicorn would each hold a draining worker
        # until one side's idle timeout (15-16 s, app/edge/worker.py). A reload closes them at
        # once: the old nginx workers finish the calls they carry and close the idle ones,
        # the new ones answer as before (/readyz 503, a call gunicorn refuses a 503).
        for proc in nginx:
            proc.send_signal(signal.SIGHUP)
        _signal_and_wait(gunicorns, 0, grace_s + 5)
        _signal_and_wait(nginx, signal.SIGQUIT, NGINX_QUIT_S)
    finally:
        stack.stop()
        stack.drain_file.unlink(missing_ok=True)
