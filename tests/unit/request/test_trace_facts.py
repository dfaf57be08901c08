"""A call's Trace learns each fact through one of its methods (app/request/call.py), which
also puts it on the request's span: no stage assigns a field of it. Held over app/ by
reading the source, and the checker shown catching the forms it looks for."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

CALL = ROOT / "app" / "request" / "call.py"


def trace_assignments(source: str) -> list[str]:
    """Where ``source`` assigns a field of something named ``trace`` (``trace.x = ...``,
    ``call.trace.x = ...``, ``+=`` too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if not isinstance(sub, ast.Attribute):
                    continue
                owner = sub.value
                named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if named == "trace":
                    found.append(f"line {sub.lineno}: trace.{sub.attr} assigned")
    return found


def test_no_stage_assigns_a_trace_field() -> None:
    offenders = {
        str(path.relative_to(ROOT)): uses
        for path in sorted((ROOT / "app").rglob("*.py"))
        if path != CALL and (uses := trace_assignments(path.read_text("utf-8")))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        "call.trace.stream = True",
        "trace.grant = wrap(trace.grant)",
        "self.trace.attempts += 1",
        "call.trace.stages.queue_s = 0.1",  # a stage is a fact too (app/request/stages.py)
    ],
)
def test_the_checker_finds_each_form(source: str) -> None:
    assert trace_assignments(source)


def test_the_checker_lets_the_traces_methods_and_other_objects_be() -> None:
    assert trace_assignments("call.trace.resuming(None)\nplan.stream = True\nx = trace.key") == []
