"""app/core/names.py: numeric addresses never looked up, a name once per ttl, shared by
the callers asking at once; and a gevent worker's hub resolving through it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import gevent
import pytest

from app.core.names import MAX_NAMES, Names, install

ROOT = Path(__file__).resolve().parents[3]


class Lookups:
    """A resolver that counts the lookups it is asked for (and can be slow, or fail)."""

    def __init__(self, wait: float = 0.0, fail: bool = False) -> None:
        self.asked: list[str] = []
        self.wait, self.fail = wait, fail

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        self.asked.append(host)
        if self.wait:
            gevent.sleep(self.wait)
        if self.fail:
            raise socket.gaierror(socket.EAI_NONAME, "no such name")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"10.0.0.{len(self.asked)}", port))]

    def gethostbyname(self, host):
        return "10.9.9.9"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "10.96.0.12"])
def test_an_address_written_as_numbers_is_never_looked_up(host: str) -> None:
    inner = Lookups()
    names = Names(inner, ttl=30)
    found = names.getaddrinfo(host, 8080, 0, socket.SOCK_STREAM)
    assert inner.asked == []
    assert found == socket.getaddrinfo(host, 8080, 0, socket.SOCK_STREAM)


def test_a_name_is_looked_up_once_a_ttl() -> None:
    inner, clock = Lookups(), Clock()
    names = Names(inner, ttl=30, clock=clock)
    first = [names.getaddrinfo("upstream.example", 443) for _ in range(5)]
    assert inner.asked == ["upstream.example"]
    assert all(found == first[0] for found in first)
    clock.now += 29.9
    names.getaddrinfo("upstream.example", 443)
    assert len(inner.asked) == 1
    clock.now += 0.2  # past the ttl: asked again, the new answer kept
    again = names.getaddrinfo("upstream.example", 443)
    assert len(inner.asked) == 2 and again != first[0]
    # Another port (or type, family) is another question.
    names.getaddrinfo("upstream.example", 80)
    assert len(inner.asked) == 3


def test_callers_asking_at_once_share_one_lookup() -> None:
    inner = Lookups(wait=0.05)
    names = Names(inner, ttl=30)
    jobs = [gevent.spawn(names.getaddrinfo, "upstream.example", 443) for _ in range(20)]
    gevent.joinall(jobs, raise_error=True)
    assert inner.asked == ["upstream.example"]
    assert len({str(job.value) for job in jobs}) == 1


def test_a_failed_lookup_is_not_kept_and_fails_each_waiter() -> None:
    inner = Lookups(wait=0.02, fail=True)
    names = Names(inner, ttl=30)
    jobs = [gevent.spawn(names.getaddrinfo, "nowhere.example", 443) for _ in range(3)]
    gevent.joinall(jobs)
    assert all(isinstance(job.exception, socket.gaierror) for job in jobs)
    assert inner.asked == ["nowhere.example"]
    inner.fail = False
    names.getaddrinfo("nowhere.example", 443)
    assert inner.asked == ["nowhere.example"] * 2


def test_a_killed_lookup_leaves_its_waiters_to_ask_again() -> None:
    inner = Lookups(wait=0.05)
    names = Names(inner, ttl=30)
    first = gevent.spawn(names.getaddrinfo, "upstream.example", 443)
    gevent.sleep(0)
    waiter = gevent.spawn(names.getaddrinfo, "upstream.example", 443)
    gevent.sleep(0.01)
    first.kill()
    waiter.join()
    assert waiter.successful() and waiter.value
    assert inner.asked == ["upstream.example"] * 2


def test_ttl_0_looks_every_name_up() -> None:
    inner = Lookups()
    names = Names(inner, ttl=0)
    for _ in range(3):
        names.getaddrinfo("upstream.example", 443)
    assert len(inner.asked) == 3


def test_the_answers_kept_are_bounded() -> None:
    inner = Lookups()
    names = Names(inner, ttl=30)
    for i in range(MAX_NAMES + 1):
        names.getaddrinfo(f"n{i}.example", 443)
    names.getaddrinfo(f"n{MAX_NAMES}.example", 443)  # the newest is kept
    assert len(inner.asked) == MAX_NAMES + 1
    names.getaddrinfo("n0.example", 443)  # the oldest was dropped
    assert len(inner.asked) == MAX_NAMES + 2


def test_other_questions_go_to_the_inner_resolver() -> None:
    assert Names(Lookups(), ttl=30).gethostbyname("upstream.example") == "10.9.9.9"


def test_not_installed_where_gevent_did_not_patch_sockets() -> None:
    assert install(30) is None


def test_a_gevent_worker_s_app_resolves_through_it() -> None:
    # As in a gunicorn gevent worker: sockets patched first, then the app built.
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import gevent, socket\n"
        "from app.factory import create_app\n"
        "create_app()\n"
        "hub = gevent.get_hub()\n"
        "print(type(hub.resolver).__name__)\n"
        "class Refuse:\n"
        "    def getaddrinfo(self, *a):\n"
        "        raise AssertionError('looked up')\n"
        "hub.resolver._inner = Refuse()\n"
        "print(len(socket.getaddrinfo('127.0.0.1', 80)) > 0)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "LLMGATE_UPSTREAM_URL": "http://127.0.0.1:9/v1"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Names", "True"]


def test_a_lookup_made_to_see_a_change_never_takes_a_kept_answer() -> None:
    # Memcached's nodes found by DNS (app/store/discovery.py) ask looked_up_now.
    inner = Lookups()
    names = Names(inner, ttl=30)
    names.getaddrinfo("memcached.example", 11211, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    names.looked_up_now("memcached.example", 11211, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    names.looked_up_now("memcached.example", 11211, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    assert len(inner.asked) == 3


def test_discovery_looks_its_names_up_afresh_in_a_gevent_worker() -> None:
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import gevent\n"
        "from app.core.names import install\n"
        "from app.store.discovery import resolve\n"
        "names = install(30)\n"
        "asked = []\n"
        "class Count:\n"
        "    def getaddrinfo(self, host, port, *rest):\n"
        "        asked.append(host)\n"
        "        return [(2, 1, 6, '', ('127.0.0.%d' % len(asked), port))]\n"
        "names._inner = Count()\n"
        "print(resolve('memcached.example', 11211), resolve('memcached.example', 11211))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[('127.0.0.1', 11211)] [('127.0.0.2', 11211)]"
