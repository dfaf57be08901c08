"""The status page opened after traffic: it charts the last minutes at once, from the
history the gateway kept (app/edge/status_history.py), and shows each gateway key's use and what is
left of its limits. Real nginx, two gunicorn gevent workers, Memcached, a simulator;
headless Chromium driven over the DevTools protocol.

Traffic is sent from several threads until both workers have served calls (each worker
that times a call has its own histogram file in the metrics folder), so that a history
or a table made of one worker's figures would show less than what was sent. It goes to
gunicorn directly, one connection per call: through nginx, calls ride the few keep-alive
connections nginx opened first, and those may all belong to one worker.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import urllib3

from tests.conftest import ROOT, require_binary
from tests.support.bodies import chat
from tests.support.chromium import CHROMIUM_FLAGS, DevTools, parse_page
from tests.support.keys_file import keys_toml, priced_config
from tests.support.stack import file_stack

http = urllib3.PoolManager(retries=False, maxsize=16, timeout=urllib3.Timeout(connect=5, read=60))
RATE_CHARTS = ("ttft", "latency", "rps", "errors", "cache")
ARTIFACTS = ROOT / "tests" / "artifacts"


def workers_that_served(gw) -> int:
    """How many workers timed at least one call (their histogram files)."""
    return len(list((gw.stack.options.run_dir / "metrics").glob("histogram_*.db")))


def call(gw, body: dict, headers: dict[str, str]):
    """One call straight to gunicorn on a connection of its own (see above)."""
    headers = {**headers, "Connection": "close"}
    return gw.post("/v1/chat/completions", body, base=gw.app_url, headers=headers)


def send_until_both_workers_served(gw, one_call: Callable[[int], None], *, least_s: float) -> int:
    """``one_call(i)`` from three threads for at least ``least_s`` and until both workers
    served calls (at most 30 s); the number of calls made."""
    made = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []
    began = time.monotonic()

    def run() -> None:
        try:
            while time.monotonic() - began < least_s or workers_that_served(gw) < 2:
                if time.monotonic() - began > 30:
                    return
                with lock:
                    i = made[0]
                    made[0] += 1
                one_call(i)
        except BaseException as exc:  # reported below, not as a thread warning
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0]
    assert workers_that_served(gw) == 2, "every call went to one worker"
    return made[0]


def open_page(
    gw, tmp_path: Path, until: str, *, login: tuple[str, str] | None = None, save: str = ""
):
    """The page once ``until`` (a JS expression) holds, and the auth challenges answered;
    ``save``: the name its screenshot (scrolled to the keys table when shown) and HTML are
    saved under in tests/artifacts/."""
    argv = [require_binary("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'p'}"]
    with DevTools(argv, log=tmp_path / "chromium.log") as cdp:
        session = cdp.open(gw.url + "/status", width=1280, height=1100, login=login)
        cdp.wait_for(session, until)
        html = cdp.evaluate(session, "document.documentElement.outerHTML")
        if save:
            cdp.evaluate(session, "document.querySelector('#keys:not([hidden])')?.scrollIntoView()")
            png = cdp.call("Page.captureScreenshot", session, format="png")["data"]
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / f"{save}.png").write_bytes(base64.b64decode(png))
            (ARTIFACTS / f"{save}.html").write_text(html)
    return parse_page(html), cdp.challenges


FIRST_POLL = "document.getElementById('state')?.dataset.state === 'live'"


# -- the history ---------------------------------------------------------------------------


def one_round(gw, i: int) -> None:
    """Calls of every kind the charts draw: a miss and its hit, a stream, an upstream 500."""
    auth = {"Authorization": "Bearer sk-status-history"}
    cached = chat(temperature=0, messages=[{"role": "user", "content": f"h{i} {uuid.uuid4()}"}])
    assert call(gw, cached, auth).status == 200
    assert call(gw, cached, auth).status == 200
    streamed = chat(True, messages=[{"role": "user", "content": f"stream {i}"}])
    assert call(gw, streamed, auth).status == 200
    assert call(gw, chat(), {**auth, "x-sim-fault": "500"}).status == 500


def status(gw, since: float) -> dict:
    answer = gw.http.request("GET", f"{gw.url}/status.json?since={since}")
    assert answer.status == 200, answer.data[:300]
    return json.loads(answer.data)


def wait_for_sample(gw, *, after: float) -> dict:
    """The newest sample the gateway kept, once there is one taken after ``after``."""
    deadline = time.monotonic() + 10
    while not (kept := status(gw, after)["history"]):
        assert time.monotonic() < deadline, f"no sample kept after {after}"
        time.sleep(0.2)
    return kept[-1]


@pytest.mark.slow
def test_page_opened_after_traffic_charts_the_gateways_history_at_once(make_stack, tmp_path):
    gw = make_stack(env={"LLMGATE_STATUS_SAMPLE_S": "1"})  # a stack of its own: its counts
    # A sample of the gateway before any call: no histogram has a bucket yet.
    wait_for_sample(gw, after=0)
    before = status(gw, 0)["requests"]["total"]
    began = time.time()
    rounds = send_until_both_workers_served(gw, lambda i: one_round(gw, i), least_s=4)
    ended = time.time()

    # A sample taken after the traffic holds every call, whichever worker took the sample
    # and whichever served the calls: the sum over the instance.
    later = wait_for_sample(gw, after=ended + 0.5)
    assert later["requests"]["total"] - before == 4 * rounds
    kept = status(gw, began)["history"]
    assert len(kept) >= 4
    assert all(b["time"] - a["time"] > 0.5 for a, b in itertools.pairwise(kept))
    assert "keys" not in kept[0] and "upstreams" not in kept[0]

    time.sleep(1)  # the page opens on a quiet gateway
    opened = time.time()
    page, _ = open_page(gw, tmp_path, FIRST_POLL, save="status-page-history")
    assert page.state == "live", page
    # After its first poll, every chart has points, and the traffic shows in them...
    for name in RATE_CHARTS:
        chart = page.charts[name]
        assert int(chart["data-points"]) >= 3, (name, chart)
        assert float(chart["data-max"]) > 0, (name, chart)
    assert float(page.charts["cache"]["data-max"]) <= 1
    # ...because that poll brought the history: samples from before the page opened.
    assert page.history >= 4, page
    assert page.oldest is not None and page.oldest < ended - 2 < opened - 3, page


# -- the gateway keys table ------------------------------------------------------------------

PRICE_IN, PRICE_OUT = 3.0, 15.0  # USD per million tokens
LIMITS = {"requests_per_minute": 1000, "tokens_per_day": 100_000, "usd_per_day": 5.0,
          "max_streams": 4}  # fmt: skip
OPERATOR_TOKEN = "operator-secret-for-the-page"


def secret(name: str) -> str:
    return f"llmg-{name}-status-page-secret"


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    """This module's simulator answers at its own pace (its defaults)."""
    return ()


@pytest.fixture(scope="module")
def keyed(make_stack, tmp_path_factory, upstream_sim):
    limits = "\n".join(f"{k} = {v}" for k, v in LIMITS.items())
    keys = [("team-a", limits), ("team-b", ""), ("idle", "tokens_per_day = 500")]
    config = priced_config(
        upstream_sim, version="page-prices-1", price_in=PRICE_IN, price_out=PRICE_OUT
    )
    env = {"LLMGATE_OPERATOR_TOKEN": OPERATOR_TOKEN, "LLMGATE_STATUS_SAMPLE_S": "1"}
    return file_stack(
        make_stack, tmp_path_factory.mktemp("status-keys"), config,
        keys=keys_toml(keys, secret), env=env, workers=2,
    )  # fmt: skip


@pytest.mark.slow
def test_page_shows_each_keys_use_and_what_is_left_of_its_limits(keyed, tmp_path) -> None:
    if time.time() % 60 > 35:  # the calls and the page in one minute's window
        time.sleep(61 - time.time() % 60)
    usages: dict[str, list[dict]] = {"team-a": [], "team-b": []}

    def one_call(i: int) -> None:
        name = "team-a" if i % 3 else "team-b"
        body = chat(max_tokens=8, messages=[{"role": "user", "content": f"key call {i}"}])
        answer = call(keyed, body, {"Authorization": f"Bearer {secret(name)}"})
        assert answer.status == 200, answer.data[:300]
        usages[name].append(json.loads(answer.data)["usage"])

    send_until_both_workers_served(keyed, one_call, least_s=1)
    minute = time.time() // 60
    page, challenges = open_page(
        keyed,
        tmp_path,
        "document.getElementById('keys')?.dataset.state === 'on'",
        login=("operator", OPERATOR_TOKEN),
        save="status-page-keys",
    )
    # The person typed the token once, for /status; the page's own requests reused it.
    assert [url.rsplit("/", 1)[-1] for url in challenges] == ["status"], challenges
    assert page.state == "live" and page.keys["data-keys"] == "3", page

    # What the callers were billed, counted from their answers.
    for name, usages_of in usages.items():
        row = page.key_rows[name]
        prompt = sum(u["prompt_tokens"] for u in usages_of)
        completion = sum(u["completion_tokens"] for u in usages_of)
        cost = (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6
        assert float(row["data-requests"]) == len(usages_of) > 0, row
        assert float(row["data-not-2xx"]) == 0, row
        assert float(row["data-prompt-tokens"]) == prompt, row
        assert float(row["data-completion-tokens"]) == completion, row
        assert float(row["data-usd"]) == pytest.approx(cost), row
    a = page.key_rows["team-a"]
    spent = usages["team-a"]
    tokens = sum(u["total_tokens"] for u in spent)
    cost = sum(u["prompt_tokens"] * PRICE_IN + u["completion_tokens"] * PRICE_OUT for u in spent)
    if time.time() // 60 == minute:
        assert float(a["data-left-requests_per_minute"]) == 1000 - len(spent), a
    assert float(a["data-left-tokens_per_day"]) == 100_000 - tokens, a
    assert float(a["data-left-usd_per_day"]) == pytest.approx(5.0 - cost / 1e6), a
    assert float(a["data-left-max_streams"]) == 4, a
    assert "of 100,000 tokens today" in page.key_text["team-a"], page.key_text
    # No limits: nothing left to show. Never used: a row of zeros, its whole budget left.
    assert not [k for k in page.key_rows["team-b"] if k.startswith("data-left-")]
    assert "no limits" in page.key_text["team-b"]
    idle = page.key_rows["idle"]
    assert (idle["data-requests"], idle["data-left-tokens_per_day"]) == ("0", "500"), idle


def test_without_keys_the_table_stays_hidden(gw, tmp_path) -> None:
    page, _ = open_page(gw, tmp_path, "document.getElementById('keys')?.dataset.state === 'off'")
    assert page.keys.get("hidden") == "" and page.key_rows == {}, page
