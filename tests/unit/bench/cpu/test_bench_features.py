"""bench/cpu/features.py's arithmetic (bench/cpu/features_table.py) and its calls'
settings (bench/cpu/features_call.py): each feature's row is its best round over the best
round of the call without that feature, in the same run; the target is the features on
over none, for each kind; the floor ratio is a figure only.

Fabricated rounds, no process: each variant's CPU is chosen so that a ratio taken over any
other row than its own ``over``, or from another round than the best, gives another number.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from unittest import mock

import pytest

from bench.cpu import features_table as table
from bench.cpu.features import section
from bench.cpu.features_call import (
    KEY_SECRET,
    KEYS_FILES,
    UPSTREAMS_FILES,
    build,
    environment,
    headers,
    upstreams_toml,
)
from bench.kit.report import Part, problems

# Best CPU µs per call of each variant: non-stream, stream.
BEST = {
    "floor": (500.0, 2000.0),
    "none": (600.0, 2400.0),
    "metrics": (630.0, 2500.0),
    "log line": (612.0, 2410.0),
    "key, no limits": (650.0, 2460.0),
    "key's limits": (812.5, 2700.0),  # over the key: 1.25, 1.0976; over none: 1.354, 1.125
    "resumable": (math.nan, 2880.0),
    "traces": (690.0, 3120.0),
    "upstreams file": (606.0, 2424.0),
    "continuation, unused": (612.06, 2496.72),  # over the file: 1.01, 1.03; over none: more
    "features on": (870.0, 2616.0),  # over none: 1.45, 1.09
    "every feature": (960.0, 3600.0),
}


def rounds(name: str, worse: float = 1.0) -> table.Rounds:
    """Three rounds per kind, the best one in the middle, every round ``worse`` times."""
    out = {}
    for kind, us in zip(table.KINDS, BEST[name], strict=True):
        if not math.isnan(us):
            out[kind] = [us * 1.3 * worse, us * worse, us * 1.1 * worse]
    return out


def runs() -> dict[str, list[table.Rounds]]:
    # Two turns: the second's rounds 5 % slower, except the floor's and none's.
    slower = {name: 1.0 if name in ("floor", "none") else 1.05 for name in BEST}
    return {name: [rounds(name), rounds(name, slower[name])] for name in BEST}


def test_a_variants_figure_is_its_least_round_over_all_turns() -> None:
    measured = runs()
    assert table.best(measured["metrics"], "stream") == 2500.0
    assert math.isnan(table.best(measured["resumable"], "non-stream"))  # never resumable


def test_each_row_is_over_the_call_without_its_own_feature() -> None:
    by_name = {row[0]: row for row in table.rows(runs())}
    assert list(by_name) == [v.name for v in table.VARIANTS]
    limits = by_name["key's limits"]
    assert limits[1] == "key, no limits"
    assert limits[3] == pytest.approx(1.25) and limits[5] == pytest.approx(2700 / 2460)
    assert by_name["metrics"][3] == pytest.approx(1.05) and by_name["metrics"][5] == 2500 / 2400
    # Over the floor: a figure for every row but the floor's own.
    assert limits[6] == pytest.approx(812.5 / 500) and limits[7] == pytest.approx(2700 / 2000)
    assert by_name["none"][3] == pytest.approx(1.2) and by_name["none"][1] == "floor"
    assert by_name["floor"][1:] == [None, 500.0, None, 2000.0, None, None, None]
    resumable = by_name["resumable"]
    assert resumable[2:4] == [None, None] and resumable[5] == pytest.approx(1.2)
    unused = by_name["continuation, unused"]
    assert unused[1] == "upstreams file"
    assert unused[3] == pytest.approx(1.01) and unused[5] == pytest.approx(1.03)


def test_the_target_is_the_features_on_over_none_for_each_kind() -> None:
    non_stream, stream = table.checks(runs())
    assert (non_stream.measured, non_stream.target, non_stream.op) == (
        pytest.approx(1.45),
        1.10,
        "<=",
    )
    assert not non_stream.met
    assert stream.measured == pytest.approx(1.09) and stream.met
    assert "non-stream" in non_stream.what and "stream" in stream.what
    assert {"key", "limits", "log", "metrics"} == table.ON


def test_each_turns_ratio_is_taken_within_the_turn() -> None:
    assert table.turn_ratios(runs(), "features on", "none", "stream") == [
        pytest.approx(1.09),
        pytest.approx(1.09 * 1.05),
    ]


def test_the_rows_over_the_target_are_named_and_the_floor_ratio_is_not_judged() -> None:
    missed = table.missed(runs())
    assert missed == [
        "key's limits (non-stream) 1.25x key, no limits's",
        "resumable (stream) 1.20x none's",
        "traces (non-stream) 1.15x none's",
        "traces (stream) 1.30x none's",
        "features on (non-stream) 1.45x none's",
        "every feature (non-stream) 1.60x none's",
        "every feature (stream) 1.50x none's",
    ]  # "none" is 1.20x the floor's: a figure, not in the list


def test_the_section_is_a_valid_part_of_the_report() -> None:
    found = section(runs(), {"rounds": 3, "turns": 2, "kinds": {}}, spans=12)
    assert problems([Part("features", [found])]) == []
    assert [c.measured for c in found.checks] == [pytest.approx(1.45), pytest.approx(1.09)]
    assert any("stream 1.09, 1.14" in note for note in found.notes)


def test_each_feature_switches_on_its_own_settings_only() -> None:
    where = {"upstream": "http://sim/v1", "memcached": "mc:1", "otlp": "http://otlp/v1/traces",
             "keys_dir": "/keys"}  # fmt: skip
    none = environment(frozenset(), **where)
    assert none["LLMGATE_LOG_REQUESTS"] == "false"
    assert not {"LLMGATE_KEYS_FILE", "LLMGATE_MEMCACHED", "LLMGATE_RESUME_WINDOW_S",
                "LLMGATE_OTEL_ENDPOINT"} & none.keys()  # fmt: skip

    def added(*features: str) -> dict[str, str]:
        env = environment(frozenset(features), **where)
        return {k: v for k, v in env.items() if none.get(k) != v}

    assert added("metrics") == {}  # the metrics are the factory's, not a setting
    assert added("log") == {"LLMGATE_LOG_REQUESTS": "true"}
    assert added("key") == {"LLMGATE_KEYS_FILE": "/keys/" + KEYS_FILES[False],
                            "LLMGATE_MEMCACHED": "mc:1"}  # fmt: skip
    assert added("key", "limits")["LLMGATE_KEYS_FILE"] == "/keys/" + KEYS_FILES[True]
    assert added("resumable") == {"LLMGATE_RESUME_WINDOW_S": "30", "LLMGATE_MEMCACHED": "mc:1"}
    assert added("traces") == {"LLMGATE_OTEL_ENDPOINT": "http://otlp/v1/traces"}
    assert added("file") == {"LLMGATE_CONFIG": "/keys/" + UPSTREAMS_FILES[False]}
    assert added("file", "continuation") == {"LLMGATE_CONFIG": "/keys/" + UPSTREAMS_FILES[True]}
    # The two files differ by the continuation alone.
    plain, continuing = (upstreams_toml("http://sim/v1", c) for c in (False, True))
    assert continuing.replace('continuation = "prefix"\n', "") == plain != continuing
    # The caller: the key in Authorization; the resumable offer on streams only.
    assert headers(frozenset({"key"}), "stream", 300)["HTTP_AUTHORIZATION"] == (
        f"Bearer {KEY_SECRET}"
    )
    assert "HTTP_X_LLMGATE_RESUMABLE" in headers(frozenset({"resumable"}), "stream", 300)
    assert "HTTP_X_LLMGATE_RESUMABLE" not in headers(frozenset({"resumable"}), "non-stream", 1)
    assert headers(frozenset(), "stream", 300)["HTTP_X_SIM_TPS"] == "300"


@pytest.mark.parametrize("on", [False, True])
def test_without_the_metrics_feature_the_app_has_nobody_watching(tmp_path: Path, on: bool) -> None:
    env = environment(frozenset(), "http://127.0.0.1:9/v1", "", "", "")
    with mock.patch.dict(os.environ):  # build() sets the app's settings in the environment
        app = build(frozenset({"metrics"} if on else set()), env, tmp_path)
    assert app.extensions["llmgate"].metrics.watched is on  # type: ignore[attr-defined]
