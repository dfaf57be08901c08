"""One setting sizes the stack (runner/sizing.py), and the kernel's limits are checked
against it at start (runner/limits.py). Only the values read from /proc and ``resource``,
which a test cannot set, are made up here."""

from __future__ import annotations

import re
import resource

import pytest

from app.core.config import WORKER_CONNECTIONS, Settings
from runner import limits
from runner.__main__ import check_limits
from runner.nginx import NginxParams, render_nginx
from runner.sizing import (
    FD_SPARE,
    LISTEN_BACKLOG,
    NGINX_KEEPALIVE,
    NGINX_SPREAD,
    size,
    size_for,
)
from runner.stack import ROOT, Stack, StackOptions

TEMPLATE = (ROOT / "nginx" / "llmgate.conf.template").read_text()


def _sized(connections: int, workers: int = 2, cpus: int = 2, hard: int | None = None):
    env = {"LLMGATE_WORKER_CONNECTIONS": str(connections)}
    return size_for(Settings.from_env(env), connections, workers, cpus, hard)


def _rendered(sizing) -> str:
    params = NginxParams.for_settings(
        Settings(), listen="127.0.0.1:1", app_servers=["127.0.0.1:2"], sizing=sizing
    )
    return render_nginx(params)


def _directive(conf: str, name: str) -> int:
    match = re.search(rf"^\s*{name} (\d+);", conf, re.M)
    assert match, f"{name} not rendered"
    return int(match.group(1))


def test_the_default_holds_ten_thousand_streams_with_nginx_sized_for_every_request() -> None:
    sizing = _sized(WORKER_CONNECTIONS)
    # 2 workers x 2/5 of 15,000: 12,000 streams, room for accepts 5,100 / 4,900.
    assert sizing.streams == 12_000 and sizing.stream_capacity == 12_000
    assert sizing.requests == 24_000 and sizing.conn_limit == 26_400
    # Every request nginx admits holds two of its connections, spread over its workers.
    assert sizing.nginx_workers == 2
    assert sizing.nginx_connections * 2 >= 2 * sizing.conn_limit * NGINX_SPREAD
    assert sizing.nginx_nofile == sizing.nginx_connections + FD_SPARE
    assert not sizing.capped


def test_one_setting_drives_gunicorn_the_app_and_nginx() -> None:
    small, large = _sized(1000), _sized(4000)
    assert (small.streams, large.streams) == (800, 3200)
    assert (small.conn_limit, large.conn_limit) == (1760, 7040)
    assert large.nginx_connections - NGINX_KEEPALIVE == pytest.approx(
        4 * (small.nginx_connections - NGINX_KEEPALIVE), abs=4
    )
    conf = _rendered(large)
    assert _directive(conf, "worker_processes") == 2
    assert _directive(conf, "worker_connections") == large.nginx_connections
    assert _directive(conf, "worker_rlimit_nofile") == large.nginx_nofile
    assert "limit_conn llmgate_admission 7040;" in conf
    # More cores, more nginx workers, each with its share.
    four = _sized(4000, cpus=4)
    assert four.nginx_workers == 4 and four.nginx_connections < large.nginx_connections


def test_a_stack_renders_nginx_from_the_setting(tmp_path) -> None:
    stack = Stack(
        StackOptions(run_dir=tmp_path, workers=3, env={"LLMGATE_WORKER_CONNECTIONS": "2000"})
    )
    sizing = stack.size()
    assert sizing.app_workers == 3 and sizing.streams == 3 * 800
    assert sizing.conn_limit == 3 * 1600 + 480


def test_a_low_hard_limit_shrinks_nginx_and_its_guard_not_past_it() -> None:
    sizing = _sized(WORKER_CONNECTIONS, hard=20_000)
    assert sizing.capped and sizing.nginx_nofile == 20_000
    assert sizing.nginx_connections == 20_000 - FD_SPARE
    # What nginx admits fits its connections: 2 per request, with the spread's room.
    per_worker = 2 * sizing.conn_limit * NGINX_SPREAD / sizing.nginx_workers
    assert per_worker + NGINX_KEEPALIVE <= sizing.nginx_connections
    assert 12_000 < sizing.conn_limit < 24_000  # below the app's request limit
    assert sizing.stream_capacity == 12_000  # the streams still fit: 10,000 held here
    tiny = _sized(WORKER_CONNECTIONS, hard=8_000)
    assert tiny.stream_capacity == tiny.conn_limit < 8_000
    assert sizing.wanted_nginx_nofile == _sized(WORKER_CONNECTIONS).nginx_nofile
    # No app limit at all: the descriptors still bound nginx with a guard of its own.
    unlimited = size(
        app_workers=2,
        worker_connections=15_000,
        requests_per_worker=0,
        streams_per_worker=0,
        cpus=2,
        nofile_hard=20_000,
    )
    assert unlimited.conn_limit == sizing.conn_limit


def test_the_listen_backlogs_are_the_one_the_check_knows() -> None:
    assert re.search(rf"reuseport backlog={LISTEN_BACKLOG};", TEMPLATE)
    gunicorn = (ROOT / "gunicorn.conf.py").read_text()
    assert re.search(rf"^backlog = {LISTEN_BACKLOG}$", gunicorn, re.M)


# -- the kernel's limits -----------------------------------------------------------------

GOOD = limits.Kernel(
    nofile_soft=1_048_576,
    nofile_hard=1_048_576,
    somaxconn=4096,
    port_range=(32768, 60999),
    tw_reuse=2,
    file_max=9_000_000,
)


def test_a_roomy_kernel_gives_no_warning() -> None:
    assert limits.warnings(GOOD, _sized(WORKER_CONNECTIONS)) == []


@pytest.mark.parametrize(
    ("kernel", "names"),
    [
        (
            limits.Kernel(nofile_soft=20_000, nofile_hard=20_000),
            ["RLIMIT_NOFILE hard limit 20000 < 27256 a gunicorn worker", "< 30320 nginx wants"],
        ),
        (
            limits.Kernel(nofile_soft=1024, nofile_hard=1_048_576),
            ["RLIMIT_NOFILE soft limit 1024", "ulimit -n 1048576"],
        ),
        (
            limits.Kernel(nofile_soft=10**6, nofile_hard=10**6, somaxconn=128),
            ["net.core.somaxconn 128 <", "set it to 4096"],
        ),
        (
            limits.Kernel(nofile_soft=10**6, nofile_hard=10**6, port_range=(50000, 60000)),
            ["net.ipv4.ip_local_port_range 50000 60000 has 10001 ports", "1024 65535"],
        ),
        (
            limits.Kernel(nofile_soft=10**6, nofile_hard=10**6, tw_reuse=0),
            ["net.ipv4.tcp_tw_reuse is 0", "set it to 2"],
        ),
        (
            limits.Kernel(nofile_soft=10**6, nofile_hard=10**6, file_max=50_000),
            ["fs.file-max 50000 <"],
        ),
    ],
)
def test_each_low_limit_is_named_with_its_value_and_what_to_set(kernel, names) -> None:
    sizing = _sized(WORKER_CONNECTIONS, hard=kernel.nofile_hard)
    found = " | ".join(limits.warnings(kernel, sizing))
    for name in names:
        assert name in found, found


EVERY_LIMIT_LOW = limits.Kernel(
    nofile_soft=1024,
    nofile_hard=20_000,
    somaxconn=128,
    port_range=(50000, 60000),
    tw_reuse=0,
    file_max=50_000,
)


def test_each_warning_is_one_short_line_naming_the_docs_that_explain_it() -> None:
    """Every start printed two warnings of ~400 characters each; the values stay on the
    line, the explanation and the commands moved to the section the line names."""
    sizing = _sized(WORKER_CONNECTIONS, hard=EVERY_LIMIT_LOW.nofile_hard)
    found = limits.warnings(EVERY_LIMIT_LOW, sizing)
    assert len(found) == 7, found
    docs, _, anchor = limits.DOCS.partition("#")
    headings = re.findall(r"^#+ (.+)$", (ROOT / docs).read_text(), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    assert anchor in slugs, (anchor, sorted(slugs))
    for line in found:
        assert "\n" not in line and len("llmgate: warning: " + line) <= 210, (len(line), line)
        assert line.endswith(f"({limits.DOCS})"), line
    # What the section says about each limit the warnings name.
    section = (ROOT / docs).read_text().split("### Kernel limits", 1)[1].split("\n## ", 1)[0]
    for name in ("RLIMIT_NOFILE", "net.core.somaxconn", "ip_local_port_range", "tcp_tw_reuse",
                 "fs.file-max", "LimitNOFILE", "ulimit -Hn", "--ulimit nofile"):  # fmt: skip
        assert name in section, name


def test_the_limits_are_read_from_proc(tmp_path, monkeypatch) -> None:
    for name, value in {
        "net/core/somaxconn": "128\n",
        "net/ipv4/ip_local_port_range": "40000\t45000\n",
        "net/ipv4/tcp_tw_reuse": "0\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value)
    monkeypatch.setattr(limits, "SYSCTL", tmp_path)
    kernel = limits.read_kernel()
    assert (kernel.somaxconn, kernel.port_range, kernel.tw_reuse) == (128, (40000, 45000), 0)
    assert kernel.ports == 5001 and kernel.file_max is None  # no such file here


def test_our_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        limits.raise_nofile()
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised == hard if hard != resource.RLIM_INFINITY else raised > 256


def test_make_run_prints_the_warnings_at_start(tmp_path, monkeypatch, capsys) -> None:
    low = limits.Kernel(nofile_soft=10**6, nofile_hard=10**6, somaxconn=128)
    monkeypatch.setattr(limits, "read_kernel", lambda: low)
    check_limits(Stack(StackOptions(run_dir=tmp_path)))
    assert "llmgate: warning: net.core.somaxconn 128 <" in capsys.readouterr().err


def _requests_said(lines: list[str]) -> list[int]:
    return [int(n) for line in lines for n in re.findall(r"(\d+) API requests at once", line)]


@pytest.mark.parametrize(("hard", "cpus"), [(20_000, 2), (20_000, 4), (8_000, 2), (None, 2)])
def test_the_banner_and_the_warnings_say_one_capacity(hard: int | None, cpus: int) -> None:
    """The banner's figures are the smallest of the bounds the warnings name, each counted
    the same way (API requests at once, streams among them): no warning says a number the
    stack admits that the banner does not (the banner said 12000 streams under a warning
    of 17832 requests, and the README 10,000)."""
    from types import SimpleNamespace

    from runner.__main__ import capacity

    sizing = _sized(WORKER_CONNECTIONS, hard=hard, cpus=cpus)
    kernel = limits.Kernel(nofile_soft=hard or 10**6, nofile_hard=hard)
    said = _requests_said(limits.warnings(kernel, sizing))
    banner = capacity(SimpleNamespace(sizing=sizing))  # type: ignore[arg-type]
    assert banner.startswith(
        f"{sizing.stream_capacity} streams, {sizing.request_capacity} API requests at once ("
    ), banner
    assert sizing.request_capacity == min([sizing.requests, *said])
    assert sizing.stream_capacity == min(sizing.streams, sizing.request_capacity)
    if hard is None:
        assert said == [] and (sizing.stream_capacity, sizing.request_capacity) == (12_000, 24_000)
    if hard == 20_000 and cpus == 4:  # nginx fits, gunicorn's workers do not
        assert not sizing.capped and said == [sizing.request_capacity] == [2 * (20_000 - 256) // 2]
