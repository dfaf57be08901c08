"""The layering of app/layers.toml, held by a test: each package of app imports only the
packages the table lists for it (lowest first, so no circle and no upward arrow); pure modules
import only the standard library, other pure modules and llmgate_wire; only a library's
owners import it. And the rule of the llmgate-client distribution (pyproject.toml): the
packages it ships import nothing of the gateway, only the standard library, each other and
its declared dependencies.

Every import form counts, each resolved to the full name of the module it loads:
``import app.upstream.exchange``, ``from app.upstream import exchange`` (app.upstream.exchange,
because app/upstream/exchange.py exists; ``from app.core.errors import BadRequest`` is
app.core.errors), relative imports resolved
against the importing module's package, ``importlib.import_module("...")`` with a literal
name, and imports anywhere in the file: inside functions, ``try`` blocks and
``if TYPE_CHECKING:`` blocks.

TYPE_CHECKING-only imports are violations too, by choice. They do not run, but the rule is
about what a module depends on, not only what it executes: a pure module that names an
adapter's type can no longer be read, type-checked or reused without that adapter, and the
import is one edit away from running. A pure module that needs such a type declares a
Protocol of its own instead.

The checker works on source text (``violations(module, source)``), so the tests below can
show it catching each form without editing the real modules.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from tests.conftest import ROOT

LAYERS = tomllib.loads((ROOT / "app" / "layers.toml").read_text("utf-8"))
PACKAGES: dict[str, dict[str, Any]] = LAYERS["packages"]
PURE = {f"app.{unit}.{name}" for unit, spec in PACKAGES.items() for name in spec.get("pure", ())}
OWNERS = {library: set(modules) for library, modules in LAYERS["owners"].items()}


def _distribution() -> tuple[set[str], set[str]]:
    """(packages in the client's wheel, import names of its declared dependencies)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    packages = set(config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
    requires = config["project"]["dependencies"]
    return packages, {re.split(r"[^\w.-]", dep, maxsplit=1)[0].lower() for dep in requires}


SHIPPED, DEPENDENCIES = _distribution()
# What each shipped package may import besides the standard library. The wire package is
# the floor both sides stand on; the client adds its declared dependencies (urllib3).
SHIPPED_MAY_IMPORT = {
    "llmgate_wire": {"llmgate_wire"},
    "llmgate_client": {"llmgate_client", "llmgate_wire"} | DEPENDENCIES,
}
REPO_PACKAGES = ("app", *sorted(SHIPPED))


# -- the checker ---------------------------------------------------------------------------


def _is_repo_module(name: str) -> bool:
    """True when ``name`` is a module or package of this repository (app/x.py or app/x/,
    the same under a shipped package)."""
    if name.split(".")[0] not in REPO_PACKAGES:
        return False
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module named by ``from <base> import ...``, relative levels resolved."""
    if node.level == 0:
        assert node.module is not None
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    up = node.level - 1
    if up >= len(package):
        raise ValueError(f"{module}: relative import beyond the top-level package")
    parts = package[: len(package) - up]
    if node.module:
        parts += node.module.split(".")
    return ".".join(parts)


def _literal_dynamic_import(node: ast.Call) -> str | None:
    """The name in ``importlib.import_module("x")``, ``import_module("x")`` or ``__import__``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Full names of the modules ``source`` (the text of ``module``) imports, anywhere."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, is_package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                names.add(candidate if alias.name != "*" and _is_repo_module(candidate) else base)
        elif isinstance(node, ast.Call) and (name := _literal_dynamic_import(node)):
            names.add(name)
    return names


def _pure_may_import(name: str) -> bool:
    root = name.split(".")[0]
    return root in (*sys.stdlib_module_names, "llmgate_wire") or name in PURE or name == "app"


def unit_of(module: str) -> str:
    """The entry of app/layers.toml a module of app belongs to: its package under app, or
    the top-level module itself (``app.gateway``, ``app.factory``); ``app`` for the root."""
    parts = module.split(".")
    return parts[1] if parts[0] == "app" and len(parts) > 1 else parts[0]


def _package_may_import(module: str, name: str) -> bool:
    """Within app, an import of another package is allowed when the table lists it."""
    if not (module.startswith("app.") and name.startswith("app.")):
        return True
    unit, other = unit_of(module), unit_of(name)
    return unit == other or other in PACKAGES.get(unit, {}).get("imports", ())


def _shipped_may_import(module: str, name: str) -> bool:
    root = name.split(".")[0]
    return root in sys.stdlib_module_names or root in SHIPPED_MAY_IMPORT[module.split(".")[0]]


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """Every break of the layer rule in ``source``, the text of ``module``."""
    found = []
    names = sorted(imported_modules(source, module, is_package=is_package))
    if module.split(".")[0] in SHIPPED:
        return [
            f"{module} (shipped in llmgate-client) imports {name}"
            for name in names
            if not _shipped_may_import(module, name)
        ]
    for name in names:
        if not _package_may_import(module, name):
            found.append(f"{module} ({unit_of(module)}) imports {name} ({unit_of(name)})")
        if module in PURE and not _pure_may_import(name):
            found.append(f"{module} (pure) imports {name}")
        owners = OWNERS.get(name.split(".")[0])
        if owners is not None and module not in owners:
            found.append(f"{module} imports {name}, which only {sorted(owners)} may")
    return found


# -- the real modules ----------------------------------------------------------------------


def _path(module: str) -> tuple[str, bool]:
    """(source, is_package) of a module of this repository."""
    path = ROOT.joinpath(*module.split("."))
    if path.is_dir():
        return (path / "__init__.py").read_text(), True
    return path.with_suffix(".py").read_text(), False


def _modules(package: str = "app") -> list[str]:
    """Every module of ``package``, packages (their __init__.py) included."""
    modules = []
    for p in (ROOT / package).rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        modules.append(".".join(parts[:-1] if p.name == "__init__.py" else parts))
    return sorted(modules)


def _check(module: str) -> list[str]:
    source, is_package = _path(module)
    return violations(module, source, is_package=is_package)


def test_the_rule_names_only_modules_that_exist() -> None:
    """A renamed module must not silently drop out of the rule."""
    named = PURE | set().union(*OWNERS.values())
    assert named <= set(_modules()), named - set(_modules())


def test_the_table_holds_every_package_and_module_of_app() -> None:
    """Each package under app/ and each top-level module but the root is one entry of
    app/layers.toml, and the table names nothing else."""
    units = {unit_of(m) for m in _modules() if m != "app"}
    assert units == set(PACKAGES)
    flat = sorted(p.stem for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py")
    assert flat == ["factory", "gateway"]  # no flat module but the orchestrator and the factory


def test_the_table_lists_each_package_above_what_it_imports() -> None:
    """Lowest first: a package imports only packages listed before it, so the table has no
    circle and no upward arrow."""
    seen: list[str] = []
    for unit, spec in PACKAGES.items():
        assert set(spec.get("imports", ())) <= set(seen), (unit, spec["imports"], seen)
        seen.append(unit)


def test_every_import_the_table_allows_is_used() -> None:
    """The table says what the code does, not more: an allowed import no module makes is a
    stale line (a package that stopped needing another must say so)."""
    used: dict[str, set[str]] = {unit: set() for unit in PACKAGES}
    for module in _modules():
        if module == "app":
            continue
        source, is_package = _path(module)
        for name in imported_modules(source, module, is_package=is_package):
            if name.startswith("app.") and unit_of(name) != unit_of(module):
                used[unit_of(module)].add(unit_of(name))
    assert {unit: set(spec.get("imports", ())) for unit, spec in PACKAGES.items()} == used


def test_pure_modules_import_only_stdlib_and_pure_modules() -> None:
    for module in sorted(PURE):
        assert _check(module) == []


def test_every_module_imports_only_what_the_table_and_the_owners_allow() -> None:
    for module in _modules():
        assert _check(module) == []


def test_the_shipped_packages_import_nothing_of_the_gateway() -> None:
    """The client's wheel holds only SHIPPED: an import of app, runner, simulator, tests or
    an undeclared library would be a ModuleNotFoundError for whoever installs it."""
    assert set(SHIPPED_MAY_IMPORT) == SHIPPED
    for package in sorted(SHIPPED):
        for module in _modules(package):
            assert _check(module) == []


# -- the checker catches every import form -------------------------------------------------

BREAKER = (ROOT / "app" / "upstream" / "breaker.py").read_text()


@pytest.mark.parametrize(
    "line",
    [
        "from app.upstream import exchange",
        "from . import exchange",
        "import app.upstream.exchange",
        "import app.upstream.exchange as up",
        "from app.upstream.exchange import Upstream",
        "from .exchange import Upstream",
        "from app.upstream import hedge, exchange",
        "from app.store import memcached",
        "from ..store.memcached import MemcachedBackend",
        "from app.cache import build_answer_cache",  # the package that builds the adapters
        "from app.observe import metrics",
        "import urllib3",
        "from urllib3.exceptions import ReadTimeoutError",
        "def later():\n    from app.upstream import exchange",
        "import typing\nif typing.TYPE_CHECKING:\n    from app.upstream.exchange import Upstream",
        "try:\n    import gevent\nexcept ImportError:\n    gevent = None",
        "import importlib\nUP = importlib.import_module('app.upstream.exchange')",
        "from app import gateway",  # orchestration
        "from app.streams import flight",  # a package above upstream
    ],
)
def test_a_pure_module_importing_a_lower_layer_in_any_form_is_caught(line: str) -> None:
    assert violations("app.upstream.breaker", BREAKER + "\n" + line + "\n"), line


@pytest.mark.parametrize(
    "line",
    [
        "from app.core import errors",
        "from ..core import errors",
        "from ..core.errors import BadRequest",
        "import app.core.errors",
        "from . import hedge",
        "from .retry import Deadline",
        "from app.request import headers",
        "import app",
        "import json, re",
        "from collections import abc",
        "from llmgate_wire import sse",
        "from llmgate_wire.retry_after import parse_retry_after",
    ],
)
def test_a_pure_module_importing_stdlib_or_pure_modules_passes(line: str) -> None:
    assert violations("app.upstream.breaker", BREAKER + "\n" + line + "\n") == []


def test_relative_imports_resolve_against_the_importing_package() -> None:
    source = (
        "from . import entry, build_answer_cache\n"
        "from ..core import errors\n"
        "from ..observe.metrics import Metrics\n"
        "from .tiered import TieredCache\n"
    )
    assert imported_modules(source, "app.cache.policy") == {
        "app.cache.entry",
        "app.cache",
        "app.core.errors",
        "app.observe.metrics",
        "app.cache.tiered",
    }
    # In a package's __init__.py, "." is the package itself.
    assert imported_modules("from . import tiered\n", "app.cache", is_package=True) == {
        "app.cache.tiered"
    }
    assert violations("app.cache.policy", "from ..observe.metrics import Metrics\n") == [
        "app.cache.policy (pure) imports app.observe.metrics"
    ]


def test_an_import_the_table_does_not_allow_is_caught() -> None:
    """Upward (upstream importing streams), sideways (tenancy importing observe, which the
    table does not list) and from a top-level module (gateway importing the edge)."""
    assert violations("app.upstream.exchange", "from app.streams.flight import Flight\n") == [
        "app.upstream.exchange (upstream) imports app.streams.flight (streams)"
    ]
    assert violations("app.tenancy.access", "from app.observe import metrics\n") == [
        "app.tenancy.access (tenancy) imports app.observe.metrics (observe)"
    ]
    assert violations("app.gateway", "from app.edge import routes\n") == [
        "app.gateway (gateway) imports app.edge.routes (edge)"
    ]
    assert violations("app.streams.relay", "from app.upstream import exchange\n") == []


def test_a_client_library_outside_its_owner_is_caught() -> None:
    assert violations("app.gateway", "def f():\n    import pymemcache.client\n") == [
        "app.gateway imports pymemcache.client, which only "
        "['app.store.guarded_client', 'app.store.memcached'] may"
    ]
    assert violations("app.store.memcached", "from pymemcache.client.hash import X\n") == []


CLIENT_POLICY = (ROOT / "llmgate_client" / "policy.py").read_text()


@pytest.mark.parametrize(
    "line",
    [
        "from app.upstream.retry import parse_retry_after",
        "from app import sse",
        "import app",
        "def later():\n    import app.core.errors",
        "from simulator import text",
        "from runner.procs import find_binary",
        "import flask",
        "import gevent",
        "import requests",  # installed beside the gateway, not a dependency of the client
    ],
)
def test_a_shipped_module_importing_the_gateway_or_an_undeclared_library_is_caught(
    line: str,
) -> None:
    assert violations("llmgate_client.policy", CLIENT_POLICY + "\n" + line + "\n"), line


@pytest.mark.parametrize(
    "line",
    [
        "import urllib3",
        "from urllib3.exceptions import ReadTimeoutError",
        "from llmgate_wire import sse",
        "from . import errors",
        "import json, socket",
    ],
)
def test_a_client_module_importing_its_own_dependencies_passes(line: str) -> None:
    assert violations("llmgate_client.policy", CLIENT_POLICY + "\n" + line + "\n") == []


def test_the_wire_package_may_import_only_the_standard_library() -> None:
    assert violations("llmgate_wire.sse", "import urllib3\n") == [
        "llmgate_wire.sse (shipped in llmgate-client) imports urllib3"
    ]
    assert violations("llmgate_wire.sse", "from llmgate_client import Client\n") == [
        "llmgate_wire.sse (shipped in llmgate-client) imports llmgate_client"
    ]
    assert violations("llmgate_wire.sse", "from . import retry_after\nimport json\n") == []


# -- import order --------------------------------------------------------------------------


def test_every_module_imports_first_without_a_cycle() -> None:
    """Each module imported first, in a clean interpreter state: an import cycle that only
    bites in one order (gunicorn imports app.factory first, tools import others) shows up."""
    modules = [m for package in REPO_PACKAGES for m in _modules(package)]
    script = (
        "import importlib, sys\n"
        f"for module in {modules!r}:\n"
        f"    for name in [n for n in sys.modules if n.split('.')[0] in {REPO_PACKAGES!r}]:\n"
        "        del sys.modules[name]\n"
        "    importlib.import_module(module)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


# -- the map in the docs -------------------------------------------------------------------


def package_map() -> str:
    """docs/architecture.md's package map, as app/layers.toml says it."""
    rows = ["| Package | What it is | May import |", "|---|---|---|"]
    for unit, spec in PACKAGES.items():
        where = f"`app/{unit}.py`" if unit in ("gateway", "factory") else f"`app/{unit}/`"
        rows.append(f"| {where} | {spec['what']} | {', '.join(spec['imports']) or '—'} |")
    return "\n".join(rows)


def test_the_architecture_page_draws_the_map_of_the_table() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    expected = package_map()
    assert expected in page, f"docs/architecture.md's package map should read:\n{expected}"


SIZES = LAYERS["sizes"]


def test_modules_stay_small_enough_to_read() -> None:
    """The bounds docs/architecture.md promises (app/layers.toml [sizes]): no module of app/,
    the client or the wire codec over 400 lines, and the orchestrator within 300, but those
    listed as exceptions, each within its own bound and with its reason."""
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for folder in ("app", "llmgate_client", "llmgate_wire")
        for path in (ROOT / folder).rglob("*.py")
    }
    bounds = dict.fromkeys(sizes, SIZES["module"]) | {"app/gateway.py": SIZES["orchestrator"]}
    exceptions = SIZES["exceptions"]
    assert set(exceptions) <= set(sizes), "an exception names no module"
    assert all(e["why"].strip() and e["lines"] > bounds[n] for n, e in exceptions.items())
    bounds |= {name: entry["lines"] for name, entry in exceptions.items()}
    assert {name: n for name, n in sizes.items() if n > bounds[name]} == {}


def test_no_line_is_kept_from_the_formatter_to_fit_a_bound() -> None:
    """ruff formats every line of app/ (the size bounds are signals, not shapes): no line is
    kept as written with ``# fmt: skip``. A table of allowed moves laid out in columns
    (``# fmt: off`` ... ``# fmt: on``) is kept so for its reader, not for a count."""
    marked = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "app").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "fmt: skip" in line
    ]
    assert marked == []
