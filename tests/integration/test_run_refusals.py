"""`make run` refuses what it cannot run with, in one line, and never joins another server.

A second runner on a taken port (TLS, simulator or Memcached port too, or run directory) is
refused before it starts anything, while the first keeps serving every request (counted by
the first's simulator: with nginx's ``reuseport`` a second nginx used to take every other
connection). A bad
setting, the runner's or the gateway's, is one line without a traceback; a start that fails
in a child ends with that child's cause, not with an older run's log lines.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from runner.procs import free_port
from tests.conftest import require_binary
from tests.support.memcached import memcached_stats
from tests.support.runner_cli import Runner, run_refused, runner_env

REQUESTS = 20


@pytest.fixture(scope="module")
def first(runs_dir: Path) -> Iterator[Runner]:
    require_binary("nginx")
    require_binary("memcached")
    sim, memcached = free_port(), free_port()
    ports = {"LLMGATE_SIMULATOR_PORT": str(sim), "LLMGATE_MEMCACHED_PORT": str(memcached)}
    with Runner(runs_dir / "refusals-first", **ports) as run:
        assert f"llmgate is running on {run.url}" in run.banner, run.banner
        # Its own simulator and Memcached where the settings say.
        assert f"simulator at http://127.0.0.1:{sim}\n" in run.banner, run.banner
        assert f"memcached: 127.0.0.1:{memcached}\n" in run.banner, run.banner
        assert memcached_stats(memcached)["curr_connections"] >= 1
        yield run


def _sim_requests(run: Runner) -> int:
    sim = re.search(r"simulator at (http://\S+)", run.banner)
    assert sim, run.banner
    return urllib3.request("GET", sim.group(1) + "/sim/stats").json()["requests"]


def _every_request_answered_by(run: Runner) -> list[int]:
    """REQUESTS calls to ``run``'s port, each on a new connection (reuseport spreads
    connections, not requests); their statuses."""
    statuses = []
    for n in range(REQUESTS):
        body = {"model": "sim-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": f"refusals {n}"}]}  # fmt: skip
        resp = urllib3.request("POST", run.url + "/v1/chat/completions", body=json.dumps(body),
                               headers={"Content-Type": "application/json",
                                        "Connection": "close"}, retries=False)  # fmt: skip
        statuses.append(resp.status)
    return statuses


# What the second runner shares with the first, and the setting its one line must name.
TAKEN = {
    "port": ("LLMGATE_PORT", r"port {port} on 127\.0\.0\.1 is in use"),
    "tls port": ("LLMGATE_TLS_PORT", r"port {tls_port} on 127\.0\.0\.1 is in use"),
    "run dir": ("LLMGATE_RUN_DIR", r"run directory {run_dir} is in use"),
    "simulator port": ("LLMGATE_SIMULATOR_PORT", r"port {sim_port} on 127\.0\.0\.1 is in use"),
    "memcached port": ("LLMGATE_MEMCACHED_PORT", r"port {mc_port} on 127\.0\.0\.1 is in use"),
}


@pytest.mark.parametrize("shared", list(TAKEN))
def test_a_second_run_is_refused_at_once_and_the_first_serves_every_request(
    first: Runner, runs_dir: Path, shared: str
) -> None:
    port, tls_port = free_port(), free_port()
    run_dir = runs_dir / f"refusals-{shared.replace(' ', '-')}"
    settings = {}
    if shared == "port":
        port = first.port
    elif shared == "tls port":
        tls_port = first.tls_port
    elif shared == "run dir":
        run_dir = first.run_dir
    else:
        setting = TAKEN[shared][0]
        settings[setting] = first.env[setting]
    before = _sim_requests(first)
    with run_refused(runner_env(run_dir, port, tls_port, **settings), wait_s=10) as second:
        # Sent while a second runner that started after all would still be serving.
        statuses = _every_request_answered_by(first)
    assert statuses == [200] * REQUESTS
    assert _sim_requests(first) - before == REQUESTS, "requests went to another stack"
    setting, taken = TAKEN[shared]
    lines = second.output.splitlines()
    assert second.returncode == 1 and second.seconds < 5, second.output
    assert len(lines) == 1, second.output
    run_dir_text = re.escape(str(first.run_dir))
    pattern = taken.format(
        port=first.port,
        tls_port=first.tls_port,
        run_dir=run_dir_text,
        sim_port=first.env["LLMGATE_SIMULATOR_PORT"],
        mc_port=first.env["LLMGATE_MEMCACHED_PORT"],
    )
    assert re.search(pattern, lines[0]) and f"set {setting}" in lines[0], lines[0]


def test_a_port_held_by_another_server_is_refused(runs_dir: Path) -> None:
    require_binary("nginx")  # without it the runner first says so, then refuses alike
    require_binary("memcached")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = runner_env(runs_dir / "refusals-other", port, free_port())
        with run_refused(env, wait_s=10) as second:
            pass
    assert second.returncode == 1, second.output
    assert second.output.splitlines() == [
        f"llmgate: could not start: port {port} on 127.0.0.1 is in use; set LLMGATE_PORT to "
        "a free port"
    ]


# (setting, value): a value of each class for the runner's own settings and the gateway's.
BAD = {
    "runner, not a number": ("LLMGATE_PORT", "abc"),
    "runner, not a number (workers)": ("LLMGATE_WORKERS", "two"),
    "runner, zero": ("LLMGATE_WORKERS", "0"),
    "runner, negative": ("LLMGATE_GRACEFUL_TIMEOUT_S", "-5"),
    "runner, out of range": ("LLMGATE_PORT", "70000"),
    "runner, not a number (TLS port)": ("LLMGATE_TLS_PORT", "abc"),
    "runner, out of range (simulator port)": ("LLMGATE_SIMULATOR_PORT", "70000"),
    "runner, not a number (Memcached port)": ("LLMGATE_MEMCACHED_PORT", "eleven"),
    "runner, unknown choice": ("LLMGATE_LOG_LEVEL", "loud"),
    "runner, unknown choice (flag)": ("LLMGATE_LOG_TO_STDOUT", "maybe"),
    "runner, malformed": ("LLMGATE_BIND", "localhost"),
    "app, not a number": ("LLMGATE_DEADLINE_S", "soon"),
    "app, not a finite number": ("LLMGATE_IDLE_TIMEOUT_S", "nan"),
    "app, negative": ("LLMGATE_HEARTBEAT_S", "-5"),
    "app, zero": ("LLMGATE_CACHE_L1_TTL_S", "0"),
    "app, negative (connections)": ("LLMGATE_WORKER_CONNECTIONS", "-3"),
    "app, unknown choice": ("LLMGATE_CACHE_MODE", "sometimes"),
    "app, unknown choice (limits)": ("LLMGATE_LIMITS_FAIL", "maybe"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_setting_is_one_line_naming_it(runs_dir: Path, case: str) -> None:
    setting, value = BAD[case]
    env = runner_env(runs_dir / "refusals-settings", free_port(), free_port(), **{setting: value})
    with run_refused(env) as run:
        pass
    assert run.returncode == 1, run.output
    assert "Traceback" not in run.output
    (line,) = run.output.splitlines()
    assert line.startswith(f"llmgate: could not start: {setting}"), line
    assert value in line, line


@pytest.mark.parametrize("value", ["abc", "70000"])
def test_the_port_settings_are_refused_in_the_same_words(runs_dir: Path, value: str) -> None:
    lines = {}
    for setting in ("LLMGATE_PORT", "LLMGATE_TLS_PORT", "LLMGATE_SIMULATOR_PORT"):
        env = runner_env(runs_dir / "refusals-ports", free_port(), free_port(), **{setting: value})
        with run_refused(env) as run:
            pass
        assert run.returncode == 1, run.output
        (lines[setting],) = run.output.splitlines()
    # The public port cannot be 0; the others can (no HTTPS listener, a free port).
    alike = lines["LLMGATE_PORT"].replace("between 1", "between 0")
    assert lines["LLMGATE_TLS_PORT"] == alike.replace("LLMGATE_PORT", "LLMGATE_TLS_PORT")
    assert lines["LLMGATE_SIMULATOR_PORT"] == alike.replace(
        "LLMGATE_PORT", "LLMGATE_SIMULATOR_PORT"
    )


def test_a_failed_start_ends_with_its_cause_not_older_log_lines(
    runs_dir: Path, tmp_path: Path
) -> None:
    run_dir = runs_dir / "refusals-cause"
    log = run_dir / "logs" / "gunicorn.log"
    log.parent.mkdir(parents=True)
    # An older run: its JSON log lines, then the crash that ended it.
    old = [json.dumps({"level": "info", "msg": "request", "n": n}) for n in range(50)]
    old += ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
            "MemoryError: an older run's end"]  # fmt: skip
    log.write_text("\n".join(old) + "\n")
    keys = tmp_path / "keys.toml"
    keys.write_text('x = "\n')
    env = runner_env(run_dir, free_port(), free_port(), LLMGATE_KEYS_FILE=str(keys))
    with run_refused(env) as run:
        pass
    assert run.returncode == 1, run.output
    lines = run.output.splitlines()
    assert lines[-1].startswith(
        f"llmgate: could not start: gunicorn exited (1): LLMGATE_KEYS_FILE: {keys}: not valid TOML"
    ), run.output
    assert lines[-2] == f"llmgate: the whole output is in {log}", run.output
    assert not [line for line in lines if '"msg": "request"' in line or "older" in line]
    kept = log.read_text()
    assert kept.startswith("\n".join(old)) and "not valid TOML" in kept
