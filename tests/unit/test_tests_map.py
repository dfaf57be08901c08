"""The unit tests follow the code's map: tests/unit/<package>/ for each package of app/ (the
packages of app/layers.toml, the orchestrator and the factory among them), and a folder named
for each other part of the repository they test. Only the tests of the whole tree stay at
tests/unit/'s top. So a new test has one place to go, and a reader looking for the tests of
app/cache/ finds them in tests/unit/cache/.
"""

from __future__ import annotations

import tomllib

from tests.conftest import ROOT

UNIT = ROOT / "tests" / "unit"
APP_PACKAGES = set(tomllib.loads((ROOT / "app" / "layers.toml").read_text("utf-8"))["packages"])
# The other folders, each with the part of the repository its tests are about.
OTHER_PARTS = {
    "wire": "llmgate_wire",
    "client": "llmgate_client",
    "bench": "bench",
    "runner": "runner",
    "scripts": "scripts",
    "simulator": "simulator",  # its pure renderers; the server's tests are integration ones
    "docs": "docs",  # the docs held to the code
}
# The tests of the whole tree: the layering of app/ and this map.
AT_THE_TOP = {"test_layers.py", "test_tests_map.py"}


def test_each_folder_is_a_package_of_app_or_another_part_of_the_repository() -> None:
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= APP_PACKAGES | OTHER_PARTS.keys(), "not on the map: " + ", ".join(
        sorted(folders - APP_PACKAGES - OTHER_PARTS.keys())
    )
    assert all((ROOT / part).exists() for part in OTHER_PARTS.values())
    # Each is a package: the tests import each other as tests.unit.<folder>.<module>.
    assert [f for f in sorted(folders) if not (UNIT / f / "__init__.py").is_file()] == []


def test_only_the_tests_of_the_whole_tree_are_at_the_top() -> None:
    top = {p.name for p in UNIT.glob("test_*.py")}
    assert top == AT_THE_TOP, "move into tests/unit/<package>/: " + ", ".join(
        sorted(top - AT_THE_TOP)
    )
