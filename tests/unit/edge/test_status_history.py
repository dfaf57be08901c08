"""The status page's history (app/edge/status_history.py): one sample per period for the whole
instance,
whichever worker takes it, the last 15 minutes kept, read back oldest first; and what
/status.json carries of it. The clock is a number; several History objects on one folder
are several workers.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import greenlet
import pytest

from app.core.config import Settings
from app.edge.status_data import history_sample, status_document
from app.edge.status_history import KEEP_S, History, record
from app.factory import create_app

T0 = 1_800_000_000.0  # a slot start for periods of 1, 2, 5 and 10 s


def sample(at: float, total: float = 0.0) -> dict:
    return {"time": at, "requests": {"total": total}}


def stored(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_slot_keeps_the_first_sample_whichever_worker_stores_it(tmp_path) -> None:
    one, two = History(tmp_path, 10), History(tmp_path, 10)
    assert one.due(T0 + 0.2) and two.due(T0 + 0.3)  # both looked before either stored
    assert one.publish(sample(T0 + 0.2, 5), T0 + 0.2)
    assert not two.publish(sample(T0 + 0.3, 6), T0 + 0.3)  # too late: dropped
    assert not two.due(T0 + 9.9)
    assert stored(tmp_path) == [f"{int(T0)}.json"]  # no writer's file left behind
    assert two.since(0, T0 + 1) == [sample(T0 + 0.2, 5)]
    assert two.due(T0 + 10)  # the next slot


def test_since_returns_the_samples_after_a_time_within_15_minutes_oldest_first(tmp_path) -> None:
    history = History(tmp_path, 10)
    times = [T0 + 10 * k + 0.5 for k in range(120)]  # 20 minutes, one per slot
    for k, at in enumerate(reversed(times)):  # stored in any order
        History(tmp_path, 10).publish(sample(at, k), at)
    now = times[-1] + 1
    kept = history.since(0, now)
    assert [s["time"] for s in kept] == [t for t in times if t > now - KEEP_S]
    assert len(kept) == KEEP_S // 10
    assert [s["time"] for s in history.since(times[-3], now)] == times[-2:]
    assert history.since(times[-1], now) == []


def test_storing_a_sample_prunes_the_old_ones_and_dead_writers_files(tmp_path) -> None:
    history = History(tmp_path, 10)
    for k in range(3):
        history.publish(sample(T0 + 10 * k), T0 + 10 * k)
    (tmp_path / f".{int(T0)}.4242.tmp").write_text("{")  # its writer died mid-way
    (tmp_path / "notes.txt").write_text("not ours")
    later = T0 + KEEP_S + 25  # the slot of T0 is a whole period older than 15 minutes
    history.publish(sample(later), later)
    slots = [int(T0) + 10, int(T0) + 20, int(later) // 10 * 10]
    assert stored(tmp_path) == sorted(["notes.txt", *(f"{s}.json" for s in slots)])
    assert [s["time"] for s in history.since(0, later)] == [later]


def test_unreadable_and_foreign_files_are_skipped(tmp_path) -> None:
    history = History(tmp_path, 1)
    history.publish(sample(T0 + 1.5), T0 + 1.5)
    (tmp_path / f"{int(T0) + 2}.json").write_text('{"time": ')  # not JSON
    (tmp_path / f"{int(T0) + 3}.json").write_text("[1, 2]")  # not a sample
    (tmp_path / f"{int(T0) + 4}.json").write_text('{"requests": {}}')  # no time
    (tmp_path / "x5.json").write_text(json.dumps(sample(T0 + 5)))  # not a slot's name
    assert history.since(0, T0 + 6) == [sample(T0 + 1.5)]
    assert History(tmp_path / "missing", 1).since(0, T0) == []


class FakeHub:
    """Workers' loops as greenlets on a fake clock: ``sleep`` parks the caller, ``run``
    wakes them one at a time in the order of their wake times."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.main = greenlet.getcurrent()
        self._parked: list[tuple[float, int, greenlet.greenlet]] = []
        self._order = itertools.count()

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self._parked.append((self.now + seconds, next(self._order), greenlet.getcurrent()))
        self.main.switch()

    def start(self, run) -> None:
        greenlet.greenlet(run).switch()  # runs until its first sleep

    def run(self, until: float) -> None:
        while self._parked:
            self._parked.sort(key=lambda p: p[:2])
            if self._parked[0][0] > until:
                return
            self.now, _, worker = self._parked.pop(0)
            worker.switch()


def test_record_takes_one_sample_per_period_and_outlives_failing_ones(tmp_path, caplog) -> None:
    """Two workers' loops on one folder: every slot gets one sample, from whichever wakes
    first in it; slots whose snapshot fails are logged once per worker until one is kept."""
    hub = FakeHub(T0 + 3.7)
    taken: list[tuple[str, float]] = []
    failing = {T0 + 20, T0 + 30}

    def worker(name: str, jitter: float):
        def take(now: float) -> dict:
            if now // 10 * 10 in failing:
                raise OSError("disk full")
            taken.append((name, now))
            return sample(now, len(taken))

        def run() -> None:
            record(History(tmp_path, 10), take, sleep=hub.sleep, clock=lambda: hub.now,
                   jitter=lambda: jitter)  # fmt: skip

        return run

    with caplog.at_level(logging.INFO, "llmgate.history"):
        hub.start(worker("a", 0.5))
        hub.start(worker("b", 0.1))  # b wakes first in each slot
        hub.run(until=T0 + 65)
    slots = [T0 + 10 * k for k in range(1, 7)]
    kept = History(tmp_path, 10).since(0, hub.now)
    assert [s["time"] for s in kept] == [s + 0.1 for s in slots if s not in failing]
    assert {name for name, _ in taken} == {"b"}  # a found each slot taken
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # one per worker, not one per failed slot
    again = [r for r in caplog.records if "again" in r.getMessage()]
    assert len(again) == 2  # each worker's loop saw a slot kept after the failures


def test_status_document_sums_each_keys_usage_and_the_history_drops_it() -> None:
    samples = {
        "llmgate_key_requests_total": [
            ({"key": "team-a", "status": "200"}, 7.0),
            ({"key": "team-a", "status": "429"}, 2.0),
            ({"key": "team-b", "status": "200"}, 1.0),
        ],
        "llmgate_key_tokens_total": [
            ({"key": "team-a", "kind": "prompt"}, 70.0),
            ({"key": "team-a", "kind": "completion"}, 35.0),
        ],
        "llmgate_key_cost_usd_total": [({"key": "team-a"}, 0.25)],
        "llmgate_upstream_state": [({"upstream": "sim"}, 0.0)],
    }
    document = status_document(samples, now=T0, started=T0 - 5)
    assert document["keys"] == {
        "team-a": {"requests": 9.0, "not_2xx": 2.0, "prompt_tokens": 70.0,
                   "completion_tokens": 35.0, "cost_usd": 0.25},
        "team-b": {"requests": 1.0, "not_2xx": 0.0, "prompt_tokens": 0.0,
                   "completion_tokens": 0.0, "cost_usd": 0.0},
    }  # fmt: skip
    kept = history_sample(document)
    assert "keys" not in kept and "upstreams" not in kept
    assert kept["requests"] == document["requests"] and kept["histograms"]


def test_status_json_carries_the_history_after_since(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1"))
    client = app.test_client()
    assert app.extensions["llmgate.history"] is None  # no shared metrics folder: none kept
    assert "history" not in client.get("/status.json").get_json()
    assert client.get("/status.json?since=0").get_json()["history"] == []

    history = History(tmp_path, 1)
    now = __import__("time").time()
    for at in (now - 1000, now - 3.5, now - 2.5):
        history.publish(sample(at, at), at)
    app.extensions["llmgate.history"] = history
    got = client.get("/status.json?since=0").get_json()["history"]
    assert [s["time"] for s in got] == [now - 3.5, now - 2.5]  # 15 minutes, oldest first
    got = client.get(f"/status.json?since={now - 3}").get_json()["history"]
    assert [s["time"] for s in got] == [now - 2.5]
    for bad in ("x", "nan", "inf", ""):
        resp = client.get(f"/status.json?since={bad}")
        assert resp.status_code == 400, bad
        assert resp.get_json()["error"]["param"] == "since"


def test_the_sample_period_is_a_setting() -> None:
    assert Settings().status_sample_s == 10
    assert Settings.from_env({"LLMGATE_STATUS_SAMPLE_S": "0"}).status_sample_s == 0
    with pytest.raises(ValueError, match="LLMGATE_STATUS_SAMPLE_S"):
        Settings.from_env({"LLMGATE_STATUS_SAMPLE_S": "-1"})
    with pytest.raises(ValueError):
        History(Path("."), 0)
