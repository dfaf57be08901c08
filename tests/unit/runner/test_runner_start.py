"""The runner's start, without processes: its settings, its claims, and a failure's cause."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from app.core.config import SettingsError
from runner.claims import Claims, Listener
from runner.procs import StartError, cause, free_port
from runner.settings import DEFAULT_RUN_DIR, RunnerSettings, with_values


def test_runner_settings_defaults_and_values() -> None:
    assert RunnerSettings.from_env({}) == RunnerSettings(run_dir=DEFAULT_RUN_DIR)
    s = RunnerSettings.from_env(
        {
            "LLMGATE_PORT": " 9090 ",
            "LLMGATE_WORKERS": "4",
            "LLMGATE_LOG_LEVEL": "WARNING",
            "LLMGATE_LOG_TO_STDOUT": "yes",
            "LLMGATE_BIND": "0.0.0.0:8000, 127.0.0.1:8001",
            "LLMGATE_RUN_DIR": "/tmp/x",
            "LLMGATE_GRACEFUL_TIMEOUT_S": "30",
            "LLMGATE_DRAIN_DELAY_S": "0",
            "LLMGATE_TLS_PORT": "0",
            "LLMGATE_SIMULATOR_PORT": "9100",
            "LLMGATE_MEMCACHED_PORT": " 11311",
        }
    )
    assert (s.tls_port, s.simulator_port, s.memcached_port) == (0, 9100, 11311)
    assert (s.port, s.workers, s.log_level, s.logs_to_stdout) == (9090, 4, "warning", True)
    assert s.bind == (("0.0.0.0", 8000), ("127.0.0.1", 8001))
    assert s.bind_setting == "0.0.0.0:8000,127.0.0.1:8001"
    assert (s.run_dir, s.graceful_timeout_s, s.drain_delay_s) == (Path("/tmp/x"), 30, 0)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("LLMGATE_PORT", "abc", "a whole number between 1 and 65535"),
        ("LLMGATE_PORT", "0", "between 1 and 65535"),
        ("LLMGATE_PORT", "65536", "between 1 and 65535"),
        ("LLMGATE_TLS_PORT", "abc", "a whole number between 0 and 65535"),
        ("LLMGATE_TLS_PORT", "65536", "between 0 and 65535"),
        ("LLMGATE_SIMULATOR_PORT", "abc", "a whole number between 0 and 65535"),
        ("LLMGATE_SIMULATOR_PORT", "-1", "between 0 and 65535"),
        ("LLMGATE_MEMCACHED_PORT", "11211.5", "a whole number between 0 and 65535"),
        ("LLMGATE_MEMCACHED_PORT", "65536", "between 0 and 65535"),
        ("LLMGATE_WORKERS", "two", "a whole number >= 1"),
        ("LLMGATE_WORKERS", "-1", ">= 1"),
        ("LLMGATE_GRACEFUL_TIMEOUT_S", "1.5", "a whole number >= 1"),
        ("LLMGATE_GRACEFUL_TIMEOUT_S", "0", ">= 1"),
        ("LLMGATE_DRAIN_DELAY_S", "-1", "between 0 and 3600"),
        ("LLMGATE_DRAIN_DELAY_S", "2.5", "a whole number between 0 and 3600"),
        ("LLMGATE_LOG_LEVEL", "loud", "one of debug, info, warning, error, critical"),
        ("LLMGATE_LOG_TO_STDOUT", "maybe", "true or false"),
        ("LLMGATE_BIND", "127.0.0.1", "host:port entries"),
        ("LLMGATE_BIND", "127.0.0.1:0", "host:port entries"),
        ("LLMGATE_HOST", "::", "an IPv4 address or a host name"),
    ],
)
def test_a_bad_runner_setting_names_itself_the_rule_and_the_value(
    name: str, value: str, allowed: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        RunnerSettings.from_env({name: value})
    message = str(caught.value)
    assert message.startswith(f"{name} must be ") and allowed in message, message
    assert message.endswith(f"got {value!r}") or message.endswith(f"got {int(value)}"), message


def test_with_values_adds_what_was_given_to_a_message_without_it() -> None:
    env = {"LLMGATE_BREAKER_COOLDOWN_S": "0", "LLMGATE_BREAKER_FAILURES": ""}
    message = "LLMGATE_BREAKER_FAILURES must be >= 1 and 0 < LLMGATE_BREAKER_COOLDOWN_S"
    assert with_values(message, env) == f"{message}; given LLMGATE_BREAKER_COOLDOWN_S='0'"
    # Messages that show the value already, or name nothing that was set, stay as they are.
    for kept in ("LLMGATE_X must be > 0, got -1", "LLMGATE_X='a' is not a valid int"):
        assert with_values(kept, {"LLMGATE_X": "-1"}) == kept
    assert with_values("LLMGATE_Y must be > 0", env) == "LLMGATE_Y must be > 0"


# gunicorn's output when a worker cannot boot: the traceback, then the master's lines.
GUNICORN_BOOT_FAILURE = """\
[2026-12-01 14:22:26 +0000] [20713] [INFO] Starting gunicorn 27.0.1
[2026-12-01 14:22:27 +0000] [20721] [ERROR] Exception in worker process
Traceback (most recent call last):
  File "/x/gunicorn/arbiter.py", line 752, in spawn_worker
    worker.init_process()
            ^^^^^^^^^^^^^
  File "/x/app/cache/tiered.py", line 20, in __init__
    raise ValueError("l1_ttl must be at least 1 second")
ValueError: l1_ttl must be at least 1 second
l1_ttl must be at least 1 second
[2026-12-01 14:22:28 +0000] [20713] [ERROR] Worker (pid:20721) exited with code 3.
[2026-12-01 14:22:28 +0000] [20713] [ERROR] Shutting down: Master
[2026-12-01 14:22:28 +0000] [20713] [ERROR] Reason: Worker failed to boot.
"""


def test_the_cause_is_the_last_tracebacks_exception_else_the_last_line() -> None:
    lines = GUNICORN_BOOT_FAILURE.splitlines()
    assert cause(lines) == "ValueError: l1_ttl must be at least 1 second"
    exit_line = "llmgate: LLMGATE_CONFIG: [Errno 2] No such file or directory: '/x'"
    assert cause(["[INFO] Starting gunicorn", exit_line, "", "  "]) == exit_line.removeprefix(
        "llmgate: "
    )
    assert cause([]) == ""
    # A traceback cut short by the tail: its last line stands.
    assert cause(["Traceback (most recent call last):", '  File "x.py"']) == '  File "x.py"'


def test_a_listening_port_is_refused_naming_the_setting() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        claims = Claims()
        with pytest.raises(StartError) as caught:
            claims.port(Listener("127.0.0.1", port, "LLMGATE_TLS_PORT"))
        claims.release()
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is in use; set LLMGATE_TLS_PORT to a free port"
    )


def test_a_port_another_runner_claimed_is_refused_until_it_lets_go() -> None:
    port = free_port()
    first, second = Claims(), Claims()
    first.port(Listener("127.0.0.1", port, "LLMGATE_PORT"))
    # Claimed, not yet listening (the first is still starting): refused all the same.
    with pytest.raises(StartError, match=f"port {port} .* in use by another llmgate"):
        second.port(Listener("0.0.0.0", port, "LLMGATE_PORT"))
    first.release()
    second.port(Listener("127.0.0.1", port, "LLMGATE_PORT"))
    second.release()


def test_a_free_port_stays_reserved_for_the_child_it_is_meant_for() -> None:
    """free_port() keeps its port bound: a bind without SO_REUSEADDR is refused (so is the
    kernel's pick for a bind to port 0), and a listener with SO_REUSEADDR, as nginx,
    gunicorn, Memcached and the simulator are, takes it and is reached."""
    port = free_port()
    with socket.socket() as stranger, pytest.raises(OSError) as refused:
        stranger.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    with socket.socket() as child:
        child.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        child.bind(("127.0.0.1", port))
        child.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = child.accept()
            accepted.close()


def test_a_run_directory_in_use_is_refused_with_its_holder(tmp_path: Path) -> None:
    first, second = Claims(), Claims()
    first.run_dir(tmp_path / "run")
    with pytest.raises(StartError) as caught:
        second.run_dir(tmp_path / "run")
    assert str(caught.value).startswith(f"run directory {tmp_path / 'run'} is in use by another")
    assert "(pid " in str(caught.value) and "set LLMGATE_RUN_DIR" in str(caught.value)
    first.release()
    second.run_dir(tmp_path / "run")
    second.release()


def test_the_runners_own_simulator_and_memcached_ports_are_claimed(tmp_path: Path) -> None:
    from runner.stack import Stack, StackOptions

    options = StackOptions(run_dir=tmp_path, port=9080, memcached_nodes=2, memcached_port=9211,
                           simulator_port=9100)  # fmt: skip
    found = {(x.port, x.setting) for x in Stack(options).listeners()}
    memcached = "LLMGATE_MEMCACHED_PORT"
    assert found == {(9080, "LLMGATE_PORT"), (9211, memcached), (9212, memcached),
                     (9100, "LLMGATE_SIMULATOR_PORT")}  # fmt: skip
    # Neither is started, so neither port is claimed: an upstream given, Memcached off.
    other = StackOptions(run_dir=tmp_path, port=9080, memcached=False, memcached_port=9211,
                         simulator_port=9100, upstream_url="http://127.0.0.1:9/v1")  # fmt: skip
    assert [x.setting for x in Stack(other).listeners()] == ["LLMGATE_PORT"]
    last = StackOptions(run_dir=tmp_path, memcached_nodes=2, memcached_port=65535)
    with pytest.raises(StartError, match="LLMGATE_MEMCACHED_PORT 65535 leaves no port for 2"):
        Stack(last).listeners()


def test_two_settings_on_one_port_are_refused_naming_both(tmp_path: Path) -> None:
    from runner.stack import Stack, StackOptions

    port = free_port()
    stack = Stack(StackOptions(run_dir=tmp_path, port=port, simulator_port=port))
    with pytest.raises(StartError) as caught:
        stack.claim()
    assert str(caught.value) == (
        f"LLMGATE_PORT and LLMGATE_SIMULATOR_PORT are both {port}; set one of them to another port"
    )


def test_the_gateway_is_given_the_ledger_set_else_its_own(tmp_path: Path, monkeypatch) -> None:
    """`make run` keeps spend in a SQLite file of its run directory unless LLMGATE_LEDGER_URL
    says otherwise (off included); `make run-cluster` in its own PostgreSQL where installed."""
    from runner import __main__ as run_main
    from runner import postgres
    from runner.stack import Stack, StackOptions

    def given(**env: str) -> str:
        stack = Stack(StackOptions(run_dir=tmp_path, env=env))
        return stack.gateway_env(8000)["LLMGATE_LEDGER_URL"]

    assert given() == str(tmp_path.absolute() / "spend.sqlite3")
    assert given(LLMGATE_LEDGER_URL="postgresql://db/x") == "postgresql://db/x"
    assert given(LLMGATE_LEDGER_URL="off") == "off"
    own = Stack(StackOptions(run_dir=tmp_path))
    own.postgres_url = postgres.url(5433)
    assert own.gateway_env(8000)["LLMGATE_LEDGER_URL"] == postgres.url(5433)

    monkeypatch.setattr(postgres, "installed", lambda: True)
    for var in [k for k in __import__("os").environ if k.startswith("LLMGATE_")]:
        monkeypatch.delenv(var)
    cluster = run_main.options_from_env(run_main.parse_args(["--instances", "3"]))
    alone = run_main.options_from_env(run_main.parse_args([]))
    assert (cluster.postgres, alone.postgres) == (True, False)
    monkeypatch.setenv("LLMGATE_LEDGER_URL", "/var/lib/spend.sqlite3")
    assert run_main.options_from_env(run_main.parse_args(["--instances", "3"])).postgres is False
    monkeypatch.delenv("LLMGATE_LEDGER_URL")
    monkeypatch.setattr(postgres, "installed", lambda: False)
    assert run_main.options_from_env(run_main.parse_args(["--instances", "3"])).postgres is False
