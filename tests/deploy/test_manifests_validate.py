"""Every manifest under deploy/kubernetes/ (the base) and deploy/kubernetes-prometheus/ (the
overlay) validates offline, and the base applies on a cluster without the Prometheus stack.

Kubernetes' own kinds go through `kubernetes-validate` (the API's published JSON schemas,
strict: an unknown or misspelt field fails, not just a wrong type) for the oldest and the
newest Kubernetes version we claim. It knows no custom resources, so those get their own
checks: the ServiceMonitor against a JSON schema written here for the fields we use (the
operator's CRD is not vendored; the schema below follows its field names and types, and
refuses any other field), the Prometheus Adapter's rules (text inside a ConfigMap, no schema
anywhere) by tests/deploy/test_manifest_invariants.py, and the kustomizations (kustomize
files, not API objects) by listing exactly the files that exist and by building both the
way kustomize does (tests/deploy/support.py ``build``; ``kubectl kustomize`` where installed).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.support import KUBERNETES, PROMETHEUS, KustomizeError, build, manifests

VERSIONS = ("1.29", "1.33")  # the oldest supported release we claim, and a recent one
CORE_KINDS = {
    "Namespace",
    "ConfigMap",
    "Secret",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "StatefulSet",
}

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _SELECTOR,
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "authorization": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["credentials"],
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["name", "key"],
                                        "properties": {
                                            "name": {"type": "string"},
                                            "key": {"type": "string"},
                                            "optional": {"type": "boolean"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _core() -> list[tuple[str, dict]]:
    return [(p.name, d) for p, d in manifests() if d["kind"] in CORE_KINDS]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", _core(), ids=lambda d: d[0] if isinstance(d, tuple) else d)
def test_core_manifests_validate_strictly(doc: tuple[str, dict], version: str) -> None:
    _, data = doc
    kubernetes_validate.validate(data, version, strict=True)


def test_every_manifest_is_a_known_kind() -> None:
    kinds = {d["kind"] for _, d in manifests()}
    assert kinds <= CORE_KINDS | {"ServiceMonitor", "Kustomization"}, kinds


def test_a_wrong_field_fails_validation() -> None:
    """The validator is strict: the checks above can fail."""
    data = next(d for _, d in manifests() if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(data))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 630  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(data))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_service_monitor_matches_its_schema() -> None:
    (monitor,) = [d for _, d in manifests() if d["kind"] == "ServiceMonitor"]
    jsonschema.validate(monitor, SERVICE_MONITOR)
    broken = yaml.safe_load(yaml.safe_dump(monitor))
    broken["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SERVICE_MONITOR)


def test_each_kustomization_lists_exactly_the_files_it_should() -> None:
    base = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    overlay = yaml.safe_load((PROMETHEUS / "kustomization.yaml").read_text())
    assert base["kind"] == overlay["kind"] == "Kustomization"
    assert base["namespace"] == overlay["namespace"]
    present = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(base["resources"]) == present, present ^ set(base["resources"])
    # The overlay: the base, plus its own files but the adapter's rule (merged into the
    # adapter's config by hand: see its kustomization.yaml).
    present = {p.name for p in PROMETHEUS.glob("*.yaml")} - {"kustomization.yaml"}
    wanted = {"../kubernetes"} | present - {"prometheus-adapter-config.yaml"}
    assert set(overlay["resources"]) == wanted, wanted ^ set(overlay["resources"])
    names = [d["metadata"]["name"] for _, d in manifests() if d["kind"] == "Namespace"]
    assert names == [base["namespace"]]


# What a cluster without the Prometheus Operator and Adapter lacks: custom resources, and
# the custom metrics API an HPA on anything but CPU or memory reads.
def _needs_more_than_kubernetes(doc: dict) -> bool:
    if doc["kind"] not in CORE_KINDS:
        return True
    if doc["kind"] == "HorizontalPodAutoscaler":
        return any(m["type"] != "Resource" for m in doc["spec"].get("metrics", []))
    return False


def test_the_base_applies_on_a_plain_cluster_and_the_overlay_adds_the_rest() -> None:
    """`kubectl apply -k deploy/kubernetes` failed on a cluster without the Prometheus
    Operator: its ServiceMonitor has no kind there."""
    base, overlay = build(KUBERNETES), build(PROMETHEUS)
    assert not [d["kind"] for d in base if _needs_more_than_kubernetes(d)]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    added = sorted(map(key, overlay))
    for doc in base:
        added.remove(key(doc))
    assert added == [("HorizontalPodAutoscaler", "llmgate"), ("ServiceMonitor", "llmgate")]
    assert all(
        d["metadata"].get("namespace") == "llmgate" for d in overlay if d["kind"] != "Namespace"
    )


def test_the_layout_check_refuses_what_kustomize_refuses(tmp_path: Path) -> None:
    """An overlay inside its base, and a file outside the kustomization's folder."""
    base = tmp_path / "base"
    (base / "overlay").mkdir(parents=True)
    (base / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    (base / "kustomization.yaml").write_text("resources: [ns.yaml]\n")
    (base / "overlay" / "kustomization.yaml").write_text("resources: [..]\n")
    with pytest.raises(KustomizeError, match="cycle detected"):
        build(base / "overlay")
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "kustomization.yaml").write_text("resources: [../base/ns.yaml]\n")
    with pytest.raises(KustomizeError, match="not in or below"):
        build(beside)
    (beside / "kustomization.yaml").write_text("resources: [../base]\n")
    assert [d["kind"] for d in build(beside)] == ["Namespace"]


@pytest.mark.parametrize("folder", [KUBERNETES, PROMETHEUS], ids=["base", "overlay"])
def test_kubectl_kustomize_builds_the_same_objects(folder: Path) -> None:
    """A cross-check of ``build`` where kubectl happens to be installed (it is not one of
    the project's dependencies, so its absence is a skip, in CI too)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    key = lambda d: (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))  # noqa: E731
    assert sorted(map(key, yaml.safe_load_all(out.stdout))) == sorted(map(key, build(folder)))
