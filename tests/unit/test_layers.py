"""The layer rule of app/__init__.py, held by a test: pure modules import only the standard
library and other pure modules; only the adapters import the network libraries."""

from __future__ import annotations

import ast
import sys

from tests.conftest import ROOT

PURE = {
    "app.config",
    "app.errors",
    "app.sse",
    "app.schema",
    "app.headers",
    "app.policy",
    "app.keys",
    "app.calls",
    "app.status",
    "app.cache.policy",
    "app.cache.entry",
    "app.cache.shapes",
    "app.cache.chunks",
}
OWNERS = {
    "urllib3": {"app.upstream"},
    "pymemcache": {"app.cache.memcached"},
    "prometheus_client": {"app.metrics"},
    "flask": {"app.routes", "app.factory", "app.statuspage"},
}


def _imports(module: str) -> set[str]:
    path = ROOT / (module.replace(".", "/") + ".py")
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules() -> list[str]:
    return [
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "app").rglob("*.py")
        if p.name != "__init__.py"
    ]


def test_pure_modules_import_only_stdlib_and_pure_modules() -> None:
    for module in PURE:
        for name in _imports(module):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name in PURE or name == "app", (
                f"{module} (pure) imports {name}"
            )


def test_only_the_owner_imports_each_client_library() -> None:
    for module in _modules():
        for name in _imports(module):
            owners = OWNERS.get(name.split(".")[0])
            assert owners is None or module in owners, f"{module} imports {name}"


def test_every_module_imports_first_without_a_cycle() -> None:
    """Each module imported first, in a clean interpreter state: an import cycle that only
    bites in one order (gunicorn imports app.factory first, tools import others) shows up."""
    import subprocess

    script = (
        "import importlib, sys\n"
        f"for module in {sorted(_modules())!r}:\n"
        "    for name in [n for n in sys.modules if n == 'app' or n.startswith('app.')]:\n"
        "        del sys.modules[name]\n"
        "    importlib.import_module(module)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
