"""The route table (app/request/routes.py): one row per route, each stage asking the row.

The table is held to its own sense (a generating route has an output field, a resumable one
an end, a translated one more than one kind...), and app/ is held to the rule that makes it
the one place a route is described: no module outside the table compares a route's name,
or keeps a set of route names. The checker reads source text, so it is shown catching each
form on examples too.
"""

from __future__ import annotations

import ast

import pytest

from app.core.doors import KINDS
from app.request import routes
from tests.conftest import ROOT

NAMES = {route.name for route in routes.ROUTES}
TABLE = ROOT / "app" / "request" / "routes.py"


def test_each_route_is_one_row_with_a_name_and_a_path_of_its_own() -> None:
    assert len(NAMES) == len(routes.ROUTES)
    assert all(routes.of_name(route.name) is route for route in routes.ROUTES)
    paths = [route.path for route in routes.ROUTES if route.path is not None]
    assert len(paths) == len(set(paths)) and all(p.startswith("/v1/") for p in paths)
    assert all(routes.BY_PATH[route.path] is route for route in routes.API if route.path)


def test_each_row_makes_sense() -> None:
    for route in routes.ROUTES:
        assert route.door in KINDS and route.kinds <= set(KINDS), route
        assert route.generates == (route.output_field is not None), route
        assert not route.resumable or route.end is not None, route
        assert not route.translated or len(route.kinds) > 1, route
        assert not route.required or route.validated, route
        assert not route.injects_usage or route.events == routes.CHUNKS, route
        assert not (route.forwarded and (route.validated or route.cacheable)), route
        assert "POST" in route.methods, route


def test_the_door_of_a_path_is_its_routes_and_anthropics_under_v1_messages() -> None:
    assert routes.door_of("/v1/chat/completions") == "openai"
    assert routes.door_of("/v1/messages") == "anthropic"
    assert routes.door_of("/v1/messages/count_tokens") == "anthropic"
    assert routes.door_of("/v1/messages/batches") == "anthropic"  # not a route: forwarded
    assert routes.door_of("/v1/files") == "openai"


# -- the rule ------------------------------------------------------------------------------


def _names_in(node: ast.AST) -> set[str]:
    """Route names spelled as string constants in ``node`` (a literal, or a collection)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Dict):
        members = [k for k in node.keys if k is not None] + list(node.values)
        return set().union(*(_names_in(m) for m in members))
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("frozenset", "set"):
        return set().union(*(_names_in(a) for a in node.args)) if node.args else set()
    return set()


def _mentions_route(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and "route" in sub.id.lower():
            return True
        if isinstance(sub, ast.Attribute) and "route" in sub.attr.lower():
            return True
    return False


def route_name_uses(source: str) -> list[str]:
    """Where ``source`` compares a route's name with a literal, or keeps a collection of two
    or more route names: what the table is there to replace."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = [o for o in operands if _names_in(o)]
            if named and any(_mentions_route(o) for o in operands if o not in named):
                found.append(f"line {node.lineno}: compares a route name")
        elif (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and node.value is not None
            and len(_names_in(node.value)) >= 2
        ):
            found.append(f"line {node.lineno}: keeps route names")
    return found


def test_no_module_outside_the_table_compares_a_route_name_or_keeps_route_names() -> None:
    offenders = {}
    for path in sorted((ROOT / "app").rglob("*.py")):
        if path == TABLE:
            continue
        uses = route_name_uses(path.read_text("utf-8"))
        if uses:
            offenders[str(path.relative_to(ROOT))] = uses
    assert offenders == {}


@pytest.mark.parametrize(
    "source",
    [
        'if call.route == "chat": pass',
        'if route != "passthrough": pass',
        'x = route in ("responses", "messages")',
        'x = call.route not in {"chat", "completions"}',
        'STREAM_ROUTES = frozenset({"chat", "completions", "responses"})',
        'OUTPUT = {"chat": "max_completion_tokens", "completions": "max_tokens"}',
        'BY_PATH = {"/v1/chat/completions": "chat", "/v1/embeddings": "embeddings"}',
        'LABELS: tuple[str, ...] = ("embeddings", "count_tokens")',
    ],
)
def test_the_checker_finds_each_form(source: str) -> None:
    assert route_name_uses(source)


@pytest.mark.parametrize(
    "source",
    [
        'if key == "messages": pass',  # a JSON member, not a route
        'if route.door == "anthropic": pass',  # a door, not a route's name
        'x = {"messages": [], "model": "m"}',  # one name: a body, not a set of routes
        "if route is RESUME: pass",
    ],
)
def test_the_checker_lets_other_strings_be(source: str) -> None:
    assert route_name_uses(source) == []
