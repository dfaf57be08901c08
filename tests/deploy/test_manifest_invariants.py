"""The numbers and names in deploy/kubernetes/ that must agree with each other and with the
code, checked the way production would find out otherwise:

- grace period > preStop wait + graceful timeout, and graceful timeout - the drain's margin
  (app/streams/drain.py) >= the longest deadline (LLMGATE_DEADLINE_S and the other timeouts, read
  through Settings.from_env from the image's ENV, the ConfigMap and the pod's env);
- the probes ask paths the app serves (its Flask url_map) on ports the container names, and
  the preStop hook creates the drain file the app reads;
- the container runs the image's command (`make run`'s), every LLMGATE_* name is a real
  setting, the selectors find their pods, the upstreams file loads with the Secret's keys;
- the HPA's metric is the Prometheus Adapter rule's output, over a gauge app/observe/metrics.py has.
"""

from __future__ import annotations

import re
import socket

import pytest
import yaml

from app.core.config import Settings
from app.streams.drain import MARGIN_S
from app.tenancy import keyring
from app.upstream import catalog as upstreams
from runner.settings import RunnerSettings
from tests.conftest import ROOT
from tests.deploy.support import (
    KUBERNETES,
    PROMETHEUS,
    dockerfile,
    documented_names,
    env_pairs,
    kind,
    manifests,
)


def _container() -> dict:
    (container,) = kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def pod_env() -> dict[str, str]:
    """What the gateway's process sees: the image's ENV, then envFrom, then env."""
    env: dict[str, str] = {}
    for word, args in dockerfile():
        if word == "ENV":
            env.update(env_pairs(args))
    container = _container()
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(kind("ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            env.update(kind("Secret", source["secretRef"]["name"])["stringData"])
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    return env


def prestop_wait_s(container: dict) -> float:
    command = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    match = re.search(r"\bsleep (\d+(?:\.\d+)?)\b", command)
    assert match, f"preStop waits for nothing: {command}"
    return float(match.group(1))


def check_grace(pod_spec: dict, env: dict[str, str]) -> None:
    """grace period > unready time + graceful timeout; graceful timeout - margin >= deadline.
    Unready time: the preStop wait, or the runner's drain delay when that is longer (the
    delay counts from the hook's drain file, runner/drain.py)."""
    settings = Settings.from_env(env)
    runner = RunnerSettings.from_env(env)
    graceful = float(runner.graceful_timeout_s)
    grace = pod_spec["terminationGracePeriodSeconds"]
    (container,) = pod_spec["containers"]
    longest = max(settings.deadline_s, settings.first_byte_timeout_s, settings.idle_timeout_s)
    unready = max(prestop_wait_s(container), runner.drain_delay_s)
    assert grace > unready + graceful, (
        f"terminationGracePeriodSeconds {grace} <= preStop {prestop_wait_s(container)} (or "
        f"LLMGATE_DRAIN_DELAY_S {runner.drain_delay_s}) + LLMGATE_GRACEFUL_TIMEOUT_S "
        f"{graceful}: the kubelet would SIGKILL draining streams"
    )
    assert graceful - MARGIN_S >= longest, (
        f"LLMGATE_GRACEFUL_TIMEOUT_S {graceful} - {MARGIN_S} < the longest deadline "
        f"{longest}: a drain would end calls that are still within their deadline"
    )


def test_grace_period_covers_the_drain_which_covers_the_deadline() -> None:
    check_grace(kind("Deployment")["spec"]["template"]["spec"], pod_env())


@pytest.mark.parametrize(
    ("grace", "graceful", "deadline", "delay"),
    [
        (600, "610", "600", "5"),
        (630, "610", "609", "5"),
        (620, "610", "600", "5"),
        (630, "610", "600", "30"),
    ],
    ids=[
        "grace-below-graceful-timeout",
        "deadline-in-the-margin",
        "no-room-for-prestop",
        "drain-delay-beyond-prestop",
    ],
)
def test_the_grace_check_fails_when_the_numbers_disagree(
    grace: int, graceful: str, deadline: str, delay: str
) -> None:
    pod_spec = yaml.safe_load(yaml.safe_dump(kind("Deployment")["spec"]["template"]["spec"]))
    pod_spec["terminationGracePeriodSeconds"] = grace
    env = {
        **pod_env(),
        "LLMGATE_GRACEFUL_TIMEOUT_S": graceful,
        "LLMGATE_DEADLINE_S": deadline,
        "LLMGATE_DRAIN_DELAY_S": delay,
    }
    with pytest.raises(AssertionError):
        check_grace(pod_spec, env)


def _app_paths() -> set[str]:
    from app.factory import create_app

    with socket.create_server(("127.0.0.1", 0)) as upstream:
        port = upstream.getsockname()[1]
        app = create_app(Settings(upstream_url=f"http://127.0.0.1:{port}/v1"))
    return {rule.rule for rule in app.url_map.iter_rules()}


def test_probes_ask_real_endpoints_on_the_containers_ports() -> None:
    container = _container()
    env = pod_env()
    paths = _app_paths()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(env["LLMGATE_PORT"])
    assert ports["app"] == int(env["LLMGATE_BIND"].rsplit(":", 1)[1])
    probes = {k: container[k]["httpGet"] for k in container if k.endswith("Probe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for name, probe in probes.items():
        assert probe["path"] in paths, f"{name}: the app has no {probe['path']}"
        assert probe["port"] in ports, f"{name}: no container port named {probe['port']}"
    # The readiness probe goes through nginx, what the Service sends traffic to.
    assert probes["readinessProbe"]["port"] == "http"
    monitor = kind("ServiceMonitor")["spec"]["endpoints"][0]
    assert monitor["path"] in paths


def test_prestop_creates_the_drain_file_the_app_reads() -> None:
    container = _container()
    env = pod_env()
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert Settings.from_env(env).drain_file.startswith(env["LLMGATE_RUN_DIR"])
    assert 'touch "$LLMGATE_DRAIN_FILE"' in command[-1]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts and env["LLMGATE_RUN_DIR"].startswith("/tmp/")  # writable


def test_the_container_runs_the_images_command() -> None:
    # The image's CMD is `make run`'s (tests/deploy/test_dockerfile.py); the pod keeps it.
    container = _container()
    assert "command" not in container and "args" not in container
    images = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["images"]
    assert [i["name"] for i in images] == [container["image"]]


def test_every_llmgate_name_is_a_real_setting() -> None:
    names = set()
    for path in [*KUBERNETES.glob("*.yaml"), *PROMETHEUS.glob("*.yaml")]:
        names |= set(re.findall(r"\bLLMGATE_[A-Z0-9_]+", path.read_text()))
    assert names and names <= documented_names(), names - documented_names()
    Settings.from_env(pod_env())  # and their values parse


def test_the_upstreams_file_loads_with_the_secrets_keys() -> None:
    toml = kind("ConfigMap", "llmgate-upstreams")["data"]["llmgate.toml"]
    assert toml == (ROOT / "deploy" / "llmgate.example.toml").read_text()
    secret = kind("Secret", "llmgate-keys")["stringData"]
    specs = upstreams.load(toml, secret, path="llmgate.toml")
    assert specs
    assert pod_env()["LLMGATE_CONFIG"] == "/etc/llmgate/llmgate.toml"
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    assert mounts["upstreams"] == "/etc/llmgate"


def test_gateway_keys_and_the_operator_token_reach_the_pod_and_the_scraper() -> None:
    env = pod_env()
    # The keys file is the mounted Secret's, and it loads (empty as shipped: nobody gets in).
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    volumes = {v["name"]: v for v in kind("Deployment")["spec"]["template"]["spec"]["volumes"]}
    secret_name = volumes["gateway-keys"]["secret"]["secretName"]
    assert env["LLMGATE_KEYS_FILE"] == mounts["gateway-keys"] + "/keys.toml"
    ring = keyring.load(kind("Secret", secret_name)["stringData"]["keys.toml"])
    assert ring.keys == ()
    # The ServiceMonitor sends the token the pods read, and nginx lets the scraper in.
    (endpoint,) = kind("ServiceMonitor")["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    secret = kind("Secret", credentials["name"])["stringData"]
    assert secret[credentials["key"]] == env["LLMGATE_OPERATOR_TOKEN"]
    allowed = Settings.from_env(env).ops_allow_list
    assert "10.0.0.0/8" in allowed and "127.0.0.1" in allowed


def test_selectors_find_their_pods() -> None:
    deployment = kind("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selects = lambda sel: all(pod_labels.get(k) == v for k, v in sel.items())  # noqa: E731
    assert selects(deployment["spec"]["selector"]["matchLabels"])
    service = kind("Service", "llmgate")
    assert selects(service["spec"]["selector"])
    assert selects(kind("PodDisruptionBudget", "llmgate")["spec"]["selector"]["matchLabels"])
    monitor = kind("ServiceMonitor")
    service_labels = service["metadata"]["labels"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert all(service_labels.get(k) == v for k, v in wanted.items())
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports
    hpa = kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]


def test_memcached_is_found_through_its_headless_service() -> None:
    service = kind("Service", "memcached")
    assert service["spec"]["clusterIP"] == "None"  # DNS answers every pod's address
    statefulset = kind("StatefulSet", "memcached")
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    settings = Settings.from_env(pod_env())
    port = service["spec"]["ports"][0]["port"]
    assert settings.memcached_dns == [(service["metadata"]["name"], port)]
    assert settings.memcached_nodes == []


def test_the_hpa_metric_comes_from_the_adapter_rule_over_a_real_gauge() -> None:
    config = yaml.safe_load(kind("ConfigMap", "adapter-config")["data"]["config.yaml"])
    (rule,) = config["rules"]
    assert set(rule) == {"seriesQuery", "resources", "name", "metricsQuery"}
    series = re.fullmatch(r"(\w+)\{(.*)\}", rule["seriesQuery"])
    assert series, rule["seriesQuery"]
    metric, matchers = series.groups()
    assert 'namespace!=""' in matchers and 'pod!=""' in matchers
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert re.fullmatch(rule["name"]["matches"], metric)
    for field in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert field in rule["metricsQuery"]
    # The gauge exists in app/observe/metrics.py (docs/metrics.md lists it) and is per pod.
    from app.observe.metrics import Metrics

    families = {m.name: m for m in Metrics(multiproc_dir="").registry.collect()}
    assert families[metric].type == "gauge", metric
    assert f"`{metric}`" in (ROOT / "docs" / "metrics.md").read_text()
    label = re.search(r'kind="(\w+)"', matchers)
    assert label and label.group(1) in {s.labels["kind"] for s in families[metric].samples}
    (hpa_metric,) = kind("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert hpa_metric["type"] == "Pods"
    assert hpa_metric["pods"]["metric"]["name"] == rule["name"]["as"]
    # Below what one pod admits at all: beyond it the pod refuses (429) instead of scaling.
    settings = Settings.from_env(pod_env())
    admitted = settings.max_requests_per_worker * int(pod_env()["LLMGATE_WORKERS"])
    assert float(hpa_metric["pods"]["target"]["averageValue"]) < admitted


def test_manifests_parse_as_yaml_documents() -> None:
    assert len(manifests()) >= 13
