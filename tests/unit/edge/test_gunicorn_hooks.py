"""gunicorn.conf.py's worker hook: once the app is loaded, the worker's objects are frozen
out of the garbage collector's full passes (each pass stops the worker while it walks every
object it tracks). Run in a fresh interpreter: the config sets environment variables."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

_HOOK = """
import gc, runpy, sys
hooks = runpy.run_path("gunicorn.conf.py")
tracked = len(gc.get_objects())
hooks["post_worker_init"](None)
print(gc.get_freeze_count(), tracked, len(gc.get_objects()), gc.get_threshold()[0])
"""


def test_the_worker_hook_freezes_what_the_worker_has_built(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _HOOK], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    frozen, tracked, left, young = map(int, out.stdout.split())
    assert frozen >= tracked // 2 > 1000  # what existed (less garbage) is frozen...
    assert left < 100  # ...and no longer walked by a full collection
    assert young == 7000  # and the young generation is collected less often than by default


_EXIT_HOOK = """
import runpy, types
hooks = runpy.run_path("gunicorn.conf.py")
closed = []
class Ledger:
    def close(self, timeout_s):
        closed.append(timeout_s)
worker = types.SimpleNamespace(_application=types.SimpleNamespace(
    extensions={"llmgate.ledger": Ledger()}))
hooks["worker_exit"](None, worker)
hooks["worker_exit"](None, types.SimpleNamespace(_application=None))  # the app never loaded
print(closed == [hooks["LEDGER_CLOSE_S"]])
"""


def test_the_exit_hook_closes_the_workers_spend_ledger(tmp_path) -> None:
    """A worker's exit (SIGTERM, a reload) writes the rows its ledger still holds
    (tests/integration/test_spend_faults.py holds it on a real stack)."""
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _EXIT_HOOK], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
