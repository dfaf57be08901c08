"""Patch: each gunicorn worker takes up to LLMGATE_ACCEPTS_PER_TURN new connections a turn of
its loop, not one.

gunicorn's gevent worker (``GeventWorker.run`` in gunicorn/workers/ggevent.py) builds a
gevent ``StreamServer`` for each listener and, when there is more than one worker, sets its
``max_accept`` to 1: gevent's accept callback (``BaseServer._do_read``, run once a turn of
the loop while the listener is readable) then takes one connection and returns. gunicorn
chose 1 so that workers sharing one listening socket share its connections. But nginx opens
its connections to gunicorn in bursts (a fresh stack's first load, a load beyond nginx's idle
keep-alive connections), and one a turn left them in the kernel's accept queue while the loop
ran hundreds of greenlets: at 800 callers a fresh stack's first round had its tail in the
Server-Timing ``queue`` stage (docs/performance.md, "The public method"). Off by default
(1): measured in turns, more a turn cut that wait but split nginx's connections between the
workers unevenly, gunicorn's reason for 1 (bench/HISTORY.md, "Accepts a turn").

The swap is of the name gunicorn's ``run`` reads (``gunicorn.workers.ggevent.StreamServer``),
in the forked worker only (``install``, called by app/edge/worker.py before gunicorn's run):
the server it then builds is ``AcceptingServer``, gevent's own with one change, that it sets
``max_accept`` to the setting when it starts accepting (after gunicorn's assignment of 1).
It fits (``fits``) when gunicorn's ``run`` builds its server from that module name and sets
``max_accept`` on it, that name is gevent's ``StreamServer``, and gevent's accept callback
reads ``max_accept`` at each turn, started by ``start_accepting``. Where it does not, the
worker accepts as gunicorn has it (one a turn), said once. A setting of 1, or one worker
(gevent's own 100 a turn then), leaves gunicorn's server untouched. No I/O here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from gevent import baseserver
from gevent.server import StreamServer
from gunicorn.workers import ggevent

from app.patches import refuse

SETTING = "LLMGATE_ACCEPTS_PER_TURN"
# New connections a worker takes a turn of its loop: gunicorn's own 1 unless set. More cut a
# fresh stack's first burst's wait in the accept queue, but split nginx's connections between
# the workers unevenly (up to 200 / 0 at 200 callers with 64), and the warm rounds were not
# shown to be no worse (bench/HISTORY.md, "Accepts a turn").
DEFAULT = 1
MOST = 1000  # gevent's own default is 100; beyond this a turn is no turn at all

log = logging.getLogger("llmgate.patches")


def per_turn(environ: Mapping[str, str]) -> int:
    """LLMGATE_ACCEPTS_PER_TURN: 1 to MOST (runner/settings.py refuses others for `make run`;
    here, in a worker, a bad value is the default, said once)."""
    raw = (environ.get(SETTING) or "").strip()
    if not raw:
        return DEFAULT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MOST:
        log.warning("%s=%r is not a whole number from 1 to %d: %d", SETTING, raw, MOST, DEFAULT)
        return DEFAULT
    return value


def _names(function: Any) -> set[str]:
    code = getattr(function, "__code__", None)
    return set(code.co_names) if code is not None else set()


def fits() -> str | None:
    """None when gunicorn's and gevent's internals are those the swap relies on."""
    if not {"StreamServer", "max_accept", "start"} <= _names(ggevent.GeventWorker.run):
        return "gunicorn's gevent worker builds its server otherwise"
    if not issubclass(ggevent.StreamServer, StreamServer):
        return "gunicorn's gevent worker names another server class"
    if "max_accept" not in _names(baseserver.BaseServer._do_read):
        return "gevent's accept callback does not read max_accept"
    if "_do_read" not in _names(baseserver.BaseServer.start_accepting):
        return "gevent starts accepting otherwise"
    return None


class AcceptingServer(StreamServer):
    """gevent's StreamServer taking ``accepts`` connections a turn of the loop, whatever
    ``max_accept`` gunicorn set before starting it."""

    accepts = DEFAULT
    max_accept: int  # gevent's (BaseServer's class attribute, 100), set per server here

    def start_accepting(self) -> None:
        # Called by start() after gunicorn's `server.max_accept = 1`, and again whenever
        # accepting resumes (a full pool freed a slot, an accept error's pause ended).
        if self.max_accept != self.accepts:
            self.max_accept = self.accepts
            log.info(
                "worker %d accepts up to %d new connections a turn (%s)",
                os.getpid(),
                self.max_accept,  # what the loop reads from now on
                SETTING,
            )
        super().start_accepting()


def install(workers: int, environ: Mapping[str, str]) -> int:
    """In a worker before gunicorn's ``run``: the server it builds takes the setting's
    connections a turn. Returns what each turn takes from now on (1: gunicorn's own)."""
    accepts = per_turn(environ)
    if workers <= 1 or accepts == 1:
        return 1 if workers > 1 else baseserver.BaseServer.max_accept
    reason = fits()
    if reason is not None:
        refuse("accepts", reason)
        return 1
    ggevent.StreamServer = type("AcceptingServer", (AcceptingServer,), {"accepts": accepts})
    return accepts
