"""What the deploy tests read: the Dockerfile's instructions, the Makefile's recipes, the
settings a name may refer to. Standard library and PyYAML only; no processes."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from app.core.config import documented_settings
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"  # the base: Kubernetes' own kinds only
PROMETHEUS = DEPLOY / "kubernetes-prometheus"  # the overlay: + ServiceMonitor, HPA


def dockerfile(path: Path = DEPLOY / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def exec_form(arguments: str) -> list[str]:
    """An instruction's JSON (exec) form, e.g. CMD ["python", "-m", "runner"]."""
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arguments
    return value


def env_pairs(arguments: str) -> dict[str, str]:
    """ENV a=1 b="2 3" (the key=value form)."""
    return dict(part.split("=", 1) for part in shlex.split(arguments))


def make_recipe(target: str) -> list[list[str]]:
    """The commands of a Makefile target, $(PY) expanded, each split like a shell would."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+)\s*:?=\s*(.*)$", text, re.M))
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)+)", text, re.M)
    assert match, f"no target {target} in the Makefile"
    commands = []
    for line in match.group(1).splitlines():
        line = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), line.strip())
        commands.append(shlex.split(line.lstrip("@")))
    return commands


def documented_names() -> set[str]:
    """Every LLMGATE_* variable the project defines: the gateway's settings (app/core/config.py)
    and the process settings documented in docs/configuration.md (gunicorn, the runner)."""
    names = {name for name, _, _ in documented_settings()}
    text = (ROOT / "docs" / "configuration.md").read_text()
    names |= set(re.findall(r"^\| `(LLMGATE_\w+)` \|", text, re.M))
    return names


def manifests(*folders: Path) -> list[tuple[Path, dict]]:
    """Every YAML document in ``folders`` (the base and the overlay), with its file."""
    import yaml

    out = []
    for folder in folders or (KUBERNETES, PROMETHEUS):
        for path in sorted(folder.rglob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc is not None:
                    out.append((path, doc))
    return out


class KustomizeError(Exception):
    pass


def build(root: Path, _visited: tuple[Path, ...] = ()) -> list[dict]:
    """The objects ``kubectl apply -k root`` would send, for what our kustomizations use
    (``resources`` of files and folders, ``namespace``), with kustomize's two refusals that
    a layout can run into: a folder that contains a kustomization already being built (an
    overlay inside its base: "cycle detected") and a file outside the kustomization's folder
    ("is not in or below"). ``kubectl kustomize`` agrees (tests/deploy/test_manifests_validate.py
    compares them where kubectl is installed)."""
    import yaml

    root = root.resolve()
    for seen in _visited:
        if seen.is_relative_to(root):
            raise KustomizeError(f"cycle detected: candidate root {root} contains {seen}")
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            objects += build(path, (*_visited, root))
        elif not path.is_relative_to(root):
            raise KustomizeError(f"file {path} is not in or below {root}")
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    namespace = kustomization.get("namespace")
    if namespace:
        for doc in objects:
            if doc["kind"] != "Namespace":
                doc.setdefault("metadata", {})["namespace"] = namespace
    return objects


def kind(name: str, metadata_name: str | None = None) -> dict:
    """The one manifest of ``kind`` (and name), e.g. kind("Deployment")."""
    found = [
        doc
        for _, doc in manifests()
        if doc.get("kind") == name
        and (metadata_name is None or doc["metadata"]["name"] == metadata_name)
    ]
    assert len(found) == 1, f"{name} {metadata_name or ''}: {len(found)} manifests"
    return found[0]
