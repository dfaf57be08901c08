"""Fixtures that start the real stack on loopback: nginx → gunicorn (gevent) → simulator.

Stacks are session-scoped and keyed by their options, so tests that need the same shape
share one set of processes; each test resets the simulator's counters first.

A module of provider tests asks for ``upstream_sim`` (a simulator of its own, started with
``sim_options``, which a module overrides to start it otherwise), ``kinds_gw`` (a stack with
one upstream of each kind on it, tests/support/kinds.py) and an SDK client on that stack
(``openai_client``, ``anthropic_client``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import require_binary
from tests.support.kinds import kinds_toml
from tests.support.sdks import anthropic_sdk, openai_sdk
from tests.support.sim import SimProcess, start_simulator
from tests.support.stack import StackHandle, StackPool, config_stack


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
def make_stack(runs_dir: Path) -> Iterator[StackPool]:
    """make_stack(env={...}, **StackOptions fields) -> a running StackHandle (shared by key),
    every one killed at the session's end (tests/support/stack.py)."""
    pool = StackPool(runs_dir, require_binary)
    yield pool
    pool.kill_all()


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


@pytest.fixture
def fresh_sim(sim: SimProcess) -> None:
    """``sim`` with its counters and request log reset before the test: a module of tests of
    the simulator names it in its pytestmark."""
    sim.reset()


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    """The options ``upstream_sim`` is started with: it answers at once. A module that wants
    another simulator defines a fixture of this name of its own."""
    return ("--ttft-ms", "0")


@pytest.fixture(scope="module")
def upstream_sim(tmp_path_factory, sim_options: tuple[str, ...]) -> Iterator[str]:
    """The URL of a simulator of the test module's own, to name in its upstreams files;
    started as the stack's processes are (its log kept with theirs when a test fails)."""
    proc, url = start_simulator(tmp_path_factory.mktemp("upstream-sim"), *sim_options)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def kinds_gw(make_stack, tmp_path_factory, upstream_sim: str) -> StackHandle:
    """A stack of one worker with one upstream of each kind, all on ``upstream_sim``: the
    model ``m-openai`` goes to an OpenAI-compatible upstream, ``m-anthropic`` to an Anthropic
    one, ``m-gemini`` to a Gemini one (tests/support/kinds.py)."""
    return config_stack(make_stack, tmp_path_factory, kinds_toml(upstream_sim))


@pytest.fixture
def openai_client(kinds_gw: StackHandle) -> Iterator[openai.OpenAI]:
    """The OpenAI SDK, as users run it, on ``kinds_gw`` (no retries)."""
    with openai_sdk(kinds_gw.url) as sdk:
        yield sdk


@pytest.fixture
def anthropic_client(kinds_gw: StackHandle) -> Iterator[anthropic.Anthropic]:
    """The Anthropic SDK, as users run it, on ``kinds_gw`` (no retries)."""
    with anthropic_sdk(kinds_gw.url) as sdk:
        yield sdk
