"""Fixtures that start the real stack on loopback: nginx → gunicorn (gevent) → simulator.

Stacks are session-scoped and keyed by their options, so tests that need the same shape
share one set of processes; each test resets the simulator's counters first.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from runner.stack import Stack, StackOptions
from tests.conftest import require_binary
from tests.support.sim import SimProcess
from tests.support.stack import StackHandle


@pytest.fixture(scope="session")
def runs_dir(request) -> Iterator[Path]:
    """One folder for every stack's run directory; kept (logs!) when a test failed."""
    path = Path(tempfile.mkdtemp(prefix="llmgate-tests-"))
    path.chmod(0o755)  # nginx workers run as nobody when the tests run as root
    yield path
    if request.session.testsfailed == 0:
        shutil.rmtree(path, ignore_errors=True)
    else:
        print(f"\nstack logs kept in {path}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report names the folder of its stacks' logs: with `pytest -n` the
    session's own line (runs_dir, above) is printed by a worker, where nobody sees it."""
    report = yield
    path = getattr(item, "funcargs", {}).get("runs_dir")
    if report.failed and path is not None:
        report.sections.append(("stack logs", f"kept in {path}"))
    return report


@pytest.fixture(scope="session")
def stacks() -> Iterator[dict]:
    started: dict[str, StackHandle] = {}
    yield started
    # Killed, not drained: no test watches these stop (the tests of stopping start stacks
    # of their own), and a graceful stop costs a gunicorn about 1.2 s and a Memcached up to
    # one; a run starts dozens of stacks.
    for handle in started.values():
        handle.stack.stop(graceful=False)


@pytest.fixture(scope="session")
def make_stack(stacks: dict, runs_dir: Path):
    """make_stack(env={...}, **StackOptions fields) -> a running StackHandle (shared by key)."""

    def make(env: dict[str, str] | None = None, **options) -> StackHandle:
        env = dict(env or {})
        key = repr((sorted(env.items()), sorted(options.items())))
        if key not in stacks:
            if options.get("nginx", True):
                require_binary("nginx")
            if options.get("memcached", True):
                require_binary("memcached")
            run_dir = Path(tempfile.mkdtemp(prefix="stack-", dir=runs_dir))
            stack = Stack(StackOptions(run_dir=run_dir, env=env, **options)).start()
            stacks[key] = StackHandle(stack)
        return stacks[key]

    return make


@pytest.fixture
def gw(make_stack) -> StackHandle:
    """The default stack: 2 gevent workers behind nginx, memcached, the simulator."""
    handle = make_stack()
    handle.sim_reset()
    return handle


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    """A simulator of the test module's own, on loopback, with no stack in front: it answers
    at once (no wait for the first token, 2,000 tokens a second)."""
    with SimProcess(ttft_ms=0, tps=2000) as process:
        yield process
