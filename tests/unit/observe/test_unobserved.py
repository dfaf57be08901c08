"""The observer of a stage built without the worker's metrics (app/observe/unobserved.py):
every metric the real one has, each update a no-op; and no stage asks whether anyone
listens (the guards it replaced are held gone)."""

from __future__ import annotations

import re

from app.core.admission import Load
from app.observe.metrics import Metrics
from app.observe.unobserved import UNOBSERVED
from tests.conftest import ROOT


def test_every_metric_of_the_real_one_takes_its_updates_and_does_nothing() -> None:
    real = Metrics(multiproc_dir="")
    names = [n for n, v in vars(real).items() if hasattr(v, "labels") or hasattr(v, "inc")]
    assert len(names) > 30  # the metrics of a worker, not a few
    for name in names:
        metric = getattr(UNOBSERVED, name)
        metric.labels("a", "b").inc()
        metric.labels(x="1").observe(0.5)
        metric.set(3)
        metric.dec()
    UNOBSERVED.observe_admission("requests", "admitted", Load(1, 0))
    UNOBSERVED.observe_log_memory("refused_start", 10)
    assert UNOBSERVED.snapshot() == {} and not UNOBSERVED.watched and real.watched


def test_no_stage_asks_whether_metrics_are_there() -> None:
    guarded = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "app").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"metrics is (not )?None|Metrics \| None", line)
    ]
    assert guarded == []
