"""The status page (/status) in headless Chromium, and the Grafana dashboard's PromQL.

- The dashboard: no processes; every metric and label its queries name is one we export.
- The page's arithmetic: our blueprint plus a fake ``status.json`` serving scripted
  snapshots, loaded with ``--virtual-time-budget --dump-dom`` (virtual time is fine here:
  the snapshots carry their own clock).
- The page on the real stack: virtual time runs the 2 s polls back to back (four polls in
  ~70 ms of real time), so no traffic would fall between two samples. That test drives
  Chromium over the DevTools protocol instead (``--remote-debugging-pipe``), waits real
  seconds while traffic flows, then reads the DOM and saves a screenshot to tests/artifacts/.
"""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest
import urllib3
from flask import Flask, jsonify
from prometheus_client.metrics import MetricWrapperBase
from werkzeug.serving import make_server

from app.edge.routes import register_error_handlers
from app.edge.status_page import status_page
from app.observe.metrics import Metrics
from tests.conftest import ROOT, require_binary
from tests.support.bodies import chat
from tests.support.chromium import CHROMIUM_FLAGS, DevTools, parse_page

ARTIFACTS = ROOT / "tests" / "artifacts"
DASHBOARD = ROOT / "deploy" / "grafana" / "llmgate-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
AUTH = {"Authorization": "Bearer sk-status-page"}

# What the dashboard may query: app/observe/metrics.py's names (histograms by their base name) and
# each one's labels. A rename in the app or in the dashboard breaks a test below.
METRICS: dict[str, set[str]] = {
    "llmgate_requests_total": {"route", "status", "cache"},
    "llmgate_request_duration_seconds": {"route", "stream"},
    "llmgate_ttft_seconds": {"route"},
    "llmgate_stream_tokens_per_second": {"route"},
    "llmgate_upstream_errors_total": {"cause"},
    "llmgate_cache_requests_total": {"outcome"},
    "llmgate_active_streams": set(),
    "llmgate_upstream_pool_connections": {"state"},
    "llmgate_upstream_connections_opened_total": set(),
    "llmgate_heartbeats_total": set(),
    "llmgate_upstream_retries_total": set(),
}
HISTOGRAMS = {
    "llmgate_request_duration_seconds",
    "llmgate_ttft_seconds",
    "llmgate_stream_tokens_per_second",
}
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series


# -- the dashboard -----------------------------------------------------------------------

_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_SELECTOR = re.compile(r"\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names a PromQL expression uses."""
    expr = _STRING.sub('""', expr)
    labels: set[str] = set()
    for selector in _SELECTOR.findall(expr):
        labels |= set(_MATCHER.findall(selector))
    expr = _SELECTOR.sub(" ", expr)
    for group in _GROUPING.findall(expr):
        labels |= {name.strip() for name in group.split(",") if name.strip()}
    expr = _RANGE.sub(" ", _GROUPING.sub(" ", expr))
    metrics = {
        word for word, call in _WORD.findall(expr) if not call and word.lower() not in _KEYWORDS
    }
    return metrics, labels


def known_series(name: str) -> str | None:
    """The metric a series name belongs to: itself, or a histogram's _bucket/_sum/_count."""
    if name in METRICS and name not in HISTOGRAMS:
        return name
    base, _, suffix = name.rpartition("_")
    return base if base in HISTOGRAMS and suffix in ("bucket", "sum", "count") else None


def dashboard_queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, including panels inside collapsed rows."""
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target.get('refId')}", target["expr"]


def test_dashboard_queries_only_metrics_and_labels_we_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(dashboard_queries(dashboard))
    assert len(queries) >= 10
    used: set[str] = set()
    for where, expr in queries:
        metrics, labels = promql_names(expr)
        assert metrics, f"{where}: no metric in {expr!r}"
        for name in metrics:
            owner = known_series(name)
            assert owner, f"{where}: {name!r} is not an llmgate metric (in {expr!r})"
            used.add(owner)
        # Labels are checked per expression: a ratio may name two metrics.
        allowed = set(TARGET_LABELS).union(*(METRICS[known_series(m) or ""] for m in metrics))
        if any(m.endswith("_bucket") for m in metrics):
            allowed.add("le")
        assert labels <= allowed, f"{where}: unknown labels {sorted(labels - allowed)} in {expr!r}"
    assert used == set(METRICS), f"metrics without a panel: {sorted(set(METRICS) - used)}"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            metric = re.fullmatch(r"label_values\((\w+)\s*,\s*(\w+)\)", text)
            assert metric and known_series(metric[1]), f"variable {variable['name']}: {text!r}"


def test_dashboard_is_importable_with_a_prometheus_datasource_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"] == [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": "",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36


def test_the_metrics_listed_here_are_the_ones_the_app_exports() -> None:
    exported = {}
    for metric in vars(Metrics(multiproc_dir="")).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            exported[metric._name + suffix] = (metric._type, set(metric._labelnames))
    for name, labels in METRICS.items():
        assert name in exported, f"{name} is no longer exported (renamed?)"
        kind, exported_labels = exported[name]
        assert exported_labels == labels, f"{name}: labels {exported_labels} vs {labels}"
        assert (kind == "histogram") == (name in HISTOGRAMS), name


def test_prometheus_example_scrapes_metrics_on_several_instances() -> None:
    text = PROMETHEUS.read_text()
    assert "metrics_path: /metrics" in text
    targets = re.findall(r"^\s+- ['\"]?([\w.-]+:\d+)['\"]?\s*(?:#.*)?$", text, re.M)
    assert len(targets) >= 2, targets
    assert "\t" not in text  # YAML forbids tabs for indentation


def test_promql_names_parser() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(llmgate_ttft_seconds_bucket{instance=~"$i",'
        ' route!="x{y}"}[$__rate_interval]))) / on(instance) group_left sum(up{job="a"}) offset 5m'
    )
    assert promql_names(expr) == (
        {"llmgate_ttft_seconds_bucket", "up"},
        {"le", "instance", "route", "job"},
    )


# -- the page's arithmetic, against scripted snapshots -------------------------------------

T0 = 1_800_000_000.0
LE: list[float | str] = [0.1, 0.2, 0.5, 1.0, "+Inf"]
# Cumulative bucket counts added every 2 s step. Any window then holds m times these:
DURATION_STEP = [0, 5, 9, 10, 10]  # P50 0.2; P95 0.5+0.5*0.5 = 0.75; P99 0.95
TTFT_STEP = [4, 8, 8, 9, 10]  # P50 0.1+0.1*(1/4) = 0.125; P95, P99 in +Inf: 1.0


def scripted_snapshot(k: int) -> dict:
    def histogram(step: list[int]) -> dict:
        return {"le": LE, "counts": [c * k for c in step], "sum": 3.0 * k, "count": step[-1] * k}

    return {
        "time": T0 + 2.0 * k,
        "started": T0 - 100.0,
        "requests": {"total": 10 * k, "by_class": {"2xx": 8 * k, "4xx": k, "5xx": k}},
        "errors": {"connect": 0, "timeout_first_byte": k, "server": k, "reset": 0},
        "cache": {
            "hit_l1": 3 * k,
            "hit_l2": k,
            "miss": 3 * k,
            "bypass": 5 * k,
            "refresh": k,
            "coalesced": 2 * k,
        },
        "streams_active": 3 + k,
        "heartbeats": 4 * k,
        "retries": k,
        "pool": {"in_use": 2, "idle": 5 + k, "opened": 7 + k},
        "histograms": {
            "request_duration_seconds": histogram(DURATION_STEP),
            "ttft_seconds": histogram(TTFT_STEP),
        },
    }


@pytest.fixture
def scripted_gateway() -> Iterator[str]:
    """Our blueprint and a status.json that answers snapshot 0, 1, 2, … on each call."""
    app = Flask("status-page-test")
    app.register_blueprint(status_page)
    register_error_handlers(app)
    calls = iter(range(10_000))

    @app.get("/status.json")
    def status_json():
        return jsonify(scripted_snapshot(next(calls)))

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(5)


def test_page_computes_rates_quantiles_and_ratios_from_snapshots(scripted_gateway, tmp_path):
    binary = require_binary("chromium")
    argv = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    argv += ["--virtual-time-budget=7000", "--dump-dom", scripted_gateway + "/status"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    page = parse_page(done.stdout)

    n = page.samples  # polls at 0, 2, 4, 6 s of virtual time
    assert n >= 3, page
    assert page.state == "live"
    c = page.charts
    for name in ("ttft", "latency", "rps", "errors", "cache", "activity"):
        assert c[name]["data-points"] == str(n - 1), (name, c[name])  # one per interval
    for name in ("streams", "pool"):
        assert c[name]["data-points"] == str(n), (name, c[name])  # one per sample
    expect = {
        ("ttft", "p50"): 0.125,
        ("ttft", "p95"): 1.0,
        ("ttft", "p99"): 1.0,
        ("latency", "p50"): 0.2,
        ("latency", "p95"): 0.75,
        ("latency", "p99"): 0.95,
        ("rps", "total"): 5.0,
        ("rps", "2xx"): 4.0,
        ("rps", "5xx"): 0.5,
        ("errors", "total"): 1.0,
        ("errors", "server"): 0.5,
        ("errors", "timeout_first_byte"): 0.5,
        ("cache", "ratio"): 0.6,  # (3+1+2) / (3+1+2 + 3+1); bypass is not a lookup
        ("activity", "retries"): 0.5,
        ("activity", "heartbeats"): 2.0,
        ("streams", "active"): 3 + (n - 1),
        ("pool", "in_use"): 2,
        ("pool", "idle"): 5 + (n - 1),
    }
    for (chart, series), value in expect.items():
        got = float(c[chart][f"data-last-{series}"])
        assert math.isclose(got, value, rel_tol=1e-9), (chart, series, got, value)
    assert "data-last-connect" not in c["errors"]  # causes that never happened get no line
    assert float(c["latency"]["data-last"]) == pytest.approx(0.2)  # the first series


def test_page_and_assets_are_served_with_types_and_revalidation(scripted_gateway) -> None:
    http = urllib3.PoolManager(retries=False)
    page = http.request("GET", scripted_gateway + "/status")
    assert page.status == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.headers["Cache-Control"] == "no-cache"
    assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
    for src in re.findall(rb'(?:src|href)="(status/assets/[^"]+)"', page.data):
        asset = http.request("GET", f"{scripted_gateway}/{src.decode()}")
        assert asset.status == 200, src
        assert asset.headers["Cache-Control"] == "no-cache"
        assert asset.headers["Content-Type"].startswith(("text/javascript", "text/css"))
        again = http.request(
            "GET",
            f"{scripted_gateway}/{src.decode()}",
            headers={"If-None-Match": asset.headers["ETag"]},
        )
        assert again.status == 304
    for name in ("status.html", "nope.js", "..%2Fstatus_page.py", "%2E%2E"):
        missing = http.request("GET", f"{scripted_gateway}/status/assets/{name}")
        assert missing.status == 404, name
        assert json.loads(missing.data)["error"]["code"]


# -- the page on the real stack --------------------------------------------------------------


@pytest.mark.slow
def test_status_page_on_the_stack_charts_live_traffic(gw, tmp_path) -> None:
    binary = require_binary("chromium")
    for path in ("/status.json", "/status"):  # /status: status_page registered in the factory
        answer = gw.http.request("GET", gw.url + path)
        assert answer.status == 200, (path, answer.data[:300])
    traffic_round(gw)  # some history before the page's first sample

    traffic = Traffic(gw)
    argv = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    with DevTools(argv, log=tmp_path / "chromium.log") as cdp:
        session = cdp.open(gw.url + "/status", width=1280, height=800)
        traffic.start()
        try:
            # Four samples of its own polling (6 s of real time), so each rate chart has three
            # live intervals: on a stack that ran for a while the gateway's kept history
            # gives the page samples at once, before any traffic of this test.
            charts = "document.getElementById('charts')?.dataset"
            cdp.wait_for(session, f"+{charts}.samples - +{charts}.history >= 4")
            # Read while the traffic still flows: a poll after it stops charts a last rate of 0.
            html = cdp.evaluate(session, "document.documentElement.outerHTML")
            shot = cdp.call("Page.captureScreenshot", session, format="png")["data"]
        finally:
            traffic.stop()
        png = base64.b64decode(shot)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "status-page.png").write_bytes(png)
    (ARTIFACTS / "status-page.html").write_text(html)
    assert traffic.rounds >= 3 and traffic.error is None, traffic.error

    page = parse_page(html)
    assert page.state == "live", page
    c = page.charts
    for name in ("ttft", "latency", "rps", "errors", "cache"):
        assert int(c[name]["data-points"]) >= 2, (name, c[name])
        assert float(c[name]["data-last"]) > 0, (name, c[name])
    assert float(c["cache"]["data-last"]) <= 1
    assert int(c["activity"]["data-points"]) >= 3
    for name in ("streams", "pool"):
        assert int(c[name]["data-points"]) >= 4, (name, c[name])
    assert float(c["pool"]["data-last-in_use"]) + float(c["pool"]["data-last-idle"]) > 0
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def traffic_round(gw) -> None:
    """A cache miss and its hit, a stream, and an upstream error."""
    cached = chat(temperature=0, messages=[{"role": "user", "content": f"page {uuid.uuid4()}"}])
    replies = [gw.post("/v1/chat/completions", cached, headers=AUTH) for _ in range(2)]
    # Read your own write: the entry is stored before the first answer completes.
    assert [r.headers.get("X-LLMGate-Cache", "")[:3] for r in replies] == ["MIS", "HIT"]
    streamed = chat(True, messages=[{"role": "user", "content": f"stream {uuid.uuid4()}"}])
    assert gw.post("/v1/chat/completions", streamed, headers=AUTH).status == 200
    failed = gw.post("/v1/chat/completions", chat(), headers={**AUTH, "x-sim-fault": "500"})
    assert failed.status == 500


class Traffic:
    """traffic_round in a loop on a thread until stop(); an error ends it and is kept."""

    def __init__(self, gw) -> None:
        self.gw = gw
        self.rounds = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                traffic_round(self.gw)
                self.rounds += 1
                self._stop.wait(0.05)
        except BaseException as exc:  # reported by the test, not as a thread warning
            self.error = exc
