"""Every manifest under deploy/kubernetes/ validates offline.

Kubernetes' own kinds go through `kubernetes-validate` (the API's published JSON schemas,
strict: an unknown or misspelt field fails, not just a wrong type) for the oldest and the
newest Kubernetes version we claim. It knows no custom resources, so those get their own
checks: the ServiceMonitor against a JSON schema written here for the fields we use (the
operator's CRD is not vendored; the schema below follows its field names and types, and
refuses any other field), the Prometheus Adapter's rules (text inside a ConfigMap, no schema
anywhere) by tests/deploy/test_manifest_invariants.py, and kustomization.yaml (a kustomize
file, not an API object) by listing exactly the files that exist.
"""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.support import KUBERNETES, manifests

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


def test_the_kustomization_lists_exactly_the_files_it_should() -> None:
    doc = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert doc["kind"] == "Kustomization"
    listed = set(doc["resources"])
    present = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    # The adapter's rule goes to the adapter's own namespace (see kustomization.yaml).
    assert listed == present - {"prometheus-adapter-config.yaml"}, present ^ listed
    names = [d["metadata"]["name"] for _, d in manifests() if d["kind"] == "Namespace"]
    assert names == [doc["namespace"]]
