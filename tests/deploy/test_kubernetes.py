"""The Kubernetes manifests in deploy/kubernetes: schema-valid, and consistent with each other
and with what they embed (the cloud-service config, Envoy, Prometheus, prometheus-adapter and
Mosquitto configs), checked with the real loaders and tools where they run here.

No cluster is needed: `kubernetes_validate` holds the API schemas offline. `kustomization.yaml`
is kustomize's own format, not an API object: it is checked by what it lists and by rendering.
"""

from __future__ import annotations

import copy
import functools
import os
import pwd
import re
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from cloud_service.config import CloudServiceConfig
from cloud_service.metrics import ServiceMetrics
from cloud_service.server import SERVICE_NAME
from configkit.yaml_loader import parse_config
from testbed.broker import mosquitto_executable
from testbed.envoy import CLOUD_CLUSTER, GRPC_LISTENER
from testbed.processes import ManagedProcess, free_tcp_port

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
RULES_DIR = REPO / "deploy" / "monitoring" / "prometheus" / "rules"
KUSTOMIZATION = K8S / "kustomization.yaml"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)
NAMESPACE = "video-analytics"
# The oldest Kubernetes the README supports (native `sleep` preStop hooks are on from 1.30) and
# the newest schemas the validator ships.
KUBERNETES_VERSIONS = ("1.30", "1.37")
# Files the kustomization lists instead of (not with) another one.
ALTERNATIVES = {"cloud-service-gpu.yaml": "cloud-service-cpu.yaml"}
VARIANTS = ("cloud-service-cpu.yaml", "cloud-service-gpu.yaml")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "APIService"}
# Namespaced objects that must live elsewhere: the adapter reads the API server's auth config.
OTHER_NAMESPACES = {
    ("RoleBinding", "video-analytics:prometheus-adapter:auth-reader"): "kube-system",
}
WORKLOADS = {"Deployment", "StatefulSet"}
START_TIMEOUT_S = 10.0

Doc = dict[str, Any]


@functools.cache
def _parsed(path: Path) -> tuple[Doc, ...]:
    return tuple(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)


def _docs(path: Path) -> list[Doc]:
    """The documents of `path` (a fresh copy: tests may change them)."""
    return copy.deepcopy(list(_parsed(path)))


def _all_docs() -> list[tuple[str, Doc]]:
    return [(path.name, doc) for path in MANIFESTS for doc in _docs(path)]


def _one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def _container_ports(workload: Doc) -> dict[str, int]:
    return {
        port["name"]: port["containerPort"]
        for container in _pod_spec(workload)["containers"]
        for port in container.get("ports", [])
    }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path.name} holds no documents"
    for doc in docs:
        # strict: unknown fields are errors; a kind without a schema raises (nothing skipped)
        validated = kubernetes_validate.validate(doc, version, strict=True)
        assert validated == version, (doc["kind"], doc["metadata"]["name"])


def test_kustomization_lists_every_manifest_once() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    resources: list[str] = kustomization["resources"]
    assert len(resources) == len(set(resources))
    expected = {p.name for p in MANIFESTS} - set(ALTERNATIVES)
    assert set(resources) == expected
    for alternative, listed in ALTERNATIVES.items():
        assert (K8S / alternative).is_file() and listed in resources
    # a `namespace:` would also move the adapter's RoleBinding out of kube-system
    assert "namespace" not in kustomization


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kustomize_renders_the_listed_manifests() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    resources = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))["resources"]
    expected = sorted(
        (doc["kind"], doc["metadata"]["name"]) for name in resources for doc in _docs(K8S / name)
    )
    got = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered) if d)
    assert got == expected


def test_objects_live_in_the_namespace() -> None:
    for file, doc in _all_docs():
        key = (doc["kind"], doc["metadata"]["name"])
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert namespace is None, (file, key)
        else:
            assert namespace == OTHER_NAMESPACES.get(key, NAMESPACE), (file, key)


def test_services_and_budgets_select_pods_with_the_ports_they_name() -> None:
    docs = [doc for _, doc in _all_docs()]
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    for doc in docs:
        if doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
        elif doc["kind"] == "PodDisruptionBudget":
            selector = doc["spec"]["selector"]["matchLabels"]
        else:
            continue
        labels = [(w, w["spec"]["template"]["metadata"]["labels"]) for w in workloads]
        selected = [workload for workload, pod in labels if _labels_match(selector, pod)]
        assert selected, f"{doc['kind']} {doc['metadata']['name']} selects no workload"
        for workload in selected:
            if doc["kind"] == "PodDisruptionBudget":
                assert workload["spec"]["selector"]["matchLabels"] == selector
            for port in doc["spec"].get("ports", []):
                assert port["targetPort"] in _container_ports(workload), (doc["metadata"], port)
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        assert _labels_match(selector, workload["spec"]["template"]["metadata"]["labels"])
        if workload["kind"] == "StatefulSet":
            governing = _one(docs, "Service", workload["spec"]["serviceName"])
            assert governing["spec"]["clusterIP"] == "None"


def _pod_templates() -> Iterator[tuple[str, Doc]]:
    for file, doc in _all_docs():
        if doc["kind"] in WORKLOADS:
            yield f"{file}:{doc['metadata']['name']}", _pod_spec(doc)


def test_every_pod_runs_restricted() -> None:
    """The namespace enforces the `restricted` Pod Security Standard; check it before a cluster
    refuses the pods."""
    for name, pod in _pod_templates():
        pod_context = pod.get("securityContext", {})
        assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for container in pod["containers"]:
            context = {**pod_context, **container.get("securityContext", {})}
            assert context.get("runAsNonRoot") is True, name
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("capabilities", {}).get("drop") == ["ALL"], name
            assert context.get("readOnlyRootFilesystem") is True, name
            assert "memory" in container["resources"]["limits"], name


@dataclass(frozen=True)
class CloudVariant:
    """One cloud-service variant file: its ConfigMap's parsed config and its Deployment."""

    file: str
    config: CloudServiceConfig
    config_map: Doc
    deployment: Doc

    @property
    def container(self) -> Doc:
        """The cloud-service container."""
        containers: list[Doc] = _pod_spec(self.deployment)["containers"]
        (container,) = [c for c in containers if c["name"] == "cloud-service"]
        return container


def _variant(file: str) -> CloudVariant:
    docs = _docs(K8S / file)
    config_map = _one(docs, "ConfigMap", "cloud-service-config")
    (key,) = config_map["data"]
    config = parse_config(config_map["data"][key], CloudServiceConfig, file=f"{file}:{key}")
    return CloudVariant(file, config, config_map, _one(docs, "Deployment", "cloud-service"))


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> CloudVariant:
    """The CPU and the GPU variant in turn."""
    return _variant(str(request.param))


def _port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_variant_config_loads_and_drains_within_the_termination_grace(
    variant: CloudVariant,
) -> None:
    pod = _pod_spec(variant.deployment)
    container = variant.container
    pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace_s = variant.config.server.grace_period_s
    # preStop runs first, then SIGTERM drains; SIGKILL must come after both
    assert pre_stop_s + grace_s < pod["terminationGracePeriodSeconds"]
    liveness = container["livenessProbe"]
    # a draining pod reports NOT_SERVING: liveness must not restart it before it is done
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > pre_stop_s + grace_s


def test_variant_probes_and_ports_match_the_config(variant: CloudVariant) -> None:
    ports = _container_ports(variant.deployment)
    config = variant.config
    every_interface = "0.0.0.0"  # noqa: S104 - a pod must listen on its pod IP
    assert config.server.listen_address == f"{every_interface}:{ports['grpc']}"
    assert config.metrics.enabled and config.metrics.listen_host == every_interface
    assert ports["metrics"] == config.metrics.listen_port
    annotations = variant.deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.metrics.listen_port)
    container = variant.container
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], probe
    # readiness follows the inference service: NOT_SERVING from SIGTERM on
    assert container["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    assert container["startupProbe"]["grpc"]["service"] == SERVICE_NAME
    assert config.server.max_receive_message_bytes == 64 * 1024 * 1024


def test_variant_mounts_what_its_config_reads(variant: CloudVariant) -> None:
    container = variant.container
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod_spec(variant.deployment)["volumes"]}
    config_volume = next(n for n, v in volumes.items() if "configMap" in v)
    assert volumes[config_volume]["configMap"]["name"] == variant.config_map["metadata"]["name"]
    (key,) = variant.config_map["data"]
    config_arg = container["args"][container["args"].index("--config") + 1]
    assert config_arg == f"{mounts[config_volume]}/{key}"
    model = getattr(variant.config.engine.runtime, "model_path", None)
    assert model is not None and str(model).startswith(mounts["models"] + "/")
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "cloud-service-models"
    token_env = {e["name"]: e for e in container["env"]}[variant.config.server.auth_tokens_env]
    assert token_env["valueFrom"]["secretKeyRef"]["name"] == "cloud-service-tokens"


def test_gpu_variant_takes_one_gpu_and_decodes_on_it() -> None:
    cpu, gpu = _variant("cloud-service-cpu.yaml"), _variant("cloud-service-gpu.yaml")
    assert gpu.config.decoder.type == "nvjpeg" and cpu.config.decoder.type == "cpu"
    assert gpu.container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in cpu.container["resources"]["limits"]
    tolerations = _pod_spec(gpu.deployment)["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)
    # the image tags of deploy/cloud-service.{cpu,gpu}.Dockerfile
    assert (cpu.container["image"], gpu.container["image"]) == (
        "cloud-service:cpu",
        "cloud-service:gpu",
    )
    # one Deployment either way: the Service, budget and autoscaler work with both
    assert gpu.deployment["metadata"]["name"] == cpu.deployment["metadata"]["name"]
    assert gpu.deployment["spec"]["selector"] == cpu.deployment["spec"]["selector"]


def test_budget_autoscaler_and_headless_service_target_the_deployment() -> None:
    deployment = _variant("cloud-service-cpu.yaml").deployment
    pdb = _one(_docs(K8S / "cloud-service-pdb.yaml"), "PodDisruptionBudget", "cloud-service")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    hpa = _one(_docs(K8S / "cloud-service-hpa.yaml"), "HorizontalPodAutoscaler", "cloud-service")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": deployment["kind"],
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= 2  # one pod draining never leaves none
    windows = {k: v["stabilizationWindowSeconds"] for k, v in hpa["spec"]["behavior"].items()}
    assert windows["scaleDown"] > windows["scaleUp"]  # in fast, out slowly
    service = _one(_docs(K8S / "cloud-service-service.yaml"), "Service", "cloud-service-headless")
    assert service["spec"]["clusterIP"] == "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)


def _envoy_config() -> Doc:
    config_map = _one(_docs(K8S / "envoy.yaml"), "ConfigMap", "envoy-config")
    config: Doc = yaml.safe_load(config_map["data"]["envoy.yaml"])
    return config


def _hcm(config: Doc) -> Doc:
    listener = next(
        item for item in config["static_resources"]["listeners"] if item["name"] == GRPC_LISTENER
    )
    typed: Doc = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return typed


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", duration)
    assert match, duration
    return float(match.group(1))


def test_envoy_balances_over_the_headless_service_and_lets_streams_rotate() -> None:
    config = _envoy_config()
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == CLOUD_CLUSTER)
    ((endpoint,),) = [
        [e["endpoint"]["address"]["socket_address"] for e in group["lb_endpoints"]]
        for group in cluster["load_assignment"]["endpoints"]
    ]
    service = _one(_docs(K8S / "cloud-service-service.yaml"), "Service")
    name = service["metadata"]["name"]
    assert endpoint["address"] == f"{name}.{service['metadata']['namespace']}.svc.cluster.local"
    assert endpoint["port_value"] in [p["port"] for p in service["spec"]["ports"]]
    envoy_docs = _docs(K8S / "envoy.yaml")
    envoy_port = _container_ports(_one(envoy_docs, "Deployment", "envoy"))["grpc"]
    listener = next(
        item for item in config["static_resources"]["listeners"] if item["name"] == GRPC_LISTENER
    )
    assert listener["address"]["socket_address"]["port_value"] == envoy_port
    assert _one(envoy_docs, "Service", "envoy")["spec"]["ports"][0]["targetPort"] == "grpc"

    cloud = _variant("cloud-service-cpu.yaml")
    hcm = _hcm(config)
    downstream_age_s = _seconds(hcm["common_http_protocol_options"]["max_connection_duration"])
    drain_s = _seconds(hcm["drain_timeout"])
    # streams rotate on Envoy's downstream GOAWAY before the replica's own age cuts them
    assert cloud.config.server.max_connection_age_grace_s > downstream_age_s + drain_s
    # a terminating pod leaves Envoy's host set (DNS refresh + jitter) before SIGTERM
    dns = cluster["cluster_type"]["typed_config"]
    pre_stop_s = cloud.container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert _seconds(dns["dns_refresh_rate"]) + _seconds(dns["dns_jitter"]) < pre_stop_s
    health = cluster["health_checks"][0]["grpc_health_check"]
    assert health["service_name"] == SERVICE_NAME


def _prometheus_config() -> Doc:
    config_map = _one(_docs(K8S / "prometheus.yaml"), "ConfigMap", "prometheus-config")
    config: Doc = yaml.safe_load(config_map["data"]["prometheus.yml"])
    return config


def test_prometheus_discovers_the_cloud_and_envoy_pods_on_their_metrics_ports() -> None:
    jobs = {job["job_name"]: job for job in _prometheus_config()["scrape_configs"]}
    workloads = {
        "cloud-service": _variant("cloud-service-cpu.yaml").deployment,
        "envoy": _one(_docs(K8S / "envoy.yaml"), "Deployment", "envoy"),
    }
    for job_name, workload in workloads.items():
        (sd,) = jobs[job_name]["kubernetes_sd_configs"]
        assert sd["role"] == "pod" and sd["namespaces"]["names"] == [NAMESPACE]
        key, _, value = sd["selectors"][0]["label"].partition("=")
        assert workload["spec"]["template"]["metadata"]["labels"][key] == value
        keep = next(r for r in jobs[job_name]["relabel_configs"] if r.get("action") == "keep")
        port = next(p for p in _container_ports(workload) if re.fullmatch(keep["regex"], p))
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(_container_ports(workload)[port])
        assert annotations["prometheus.io/path"] == jobs[job_name].get("metrics_path", "/metrics")
        targets = {r.get("target_label") for r in jobs[job_name]["relabel_configs"]}
        assert {"namespace", "pod"} <= targets  # what prometheus-adapter maps to objects


@pytest.mark.process
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery, so the discovery blocks (checked
    above) become static targets here; the rest (relabeling, rule globs) is checked as is."""
    config = _prometheus_config()
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["pod.example:9109"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_configmap_files_match_the_rule_globs() -> None:
    """README: `kubectl create configmap prometheus-rules --from-file=<rules dir>` puts each rule
    file under its own name into the mounted folder; Prometheus must pick every one up."""
    rule_files = _prometheus_config()["rule_files"]
    deployment = _one(_docs(K8S / "prometheus.yaml"), "Deployment", "prometheus")
    rules_volume = next(v for v in _pod_spec(deployment)["volumes"] if v["name"] == "rules")
    assert rules_volume["configMap"]["name"] == "prometheus-rules"
    mount = next(
        m["mountPath"]
        for m in _pod_spec(deployment)["containers"][0]["volumeMounts"]
        if m["name"] == "rules"
    )
    assert all(glob.startswith(mount + "/") for glob in rule_files)
    if not RULES_DIR.is_dir():
        pytest.skip(f"{RULES_DIR.relative_to(REPO)} does not exist yet")
    for rule_file in sorted(RULES_DIR.iterdir()):
        assert any(fnmatch(f"{mount}/{rule_file.name}", glob) for glob in rule_files), rule_file


def _adapter_rule() -> Doc:
    config_map = _one(_docs(K8S / "prometheus-adapter.yaml"), "ConfigMap")
    (rule,) = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    assert isinstance(rule, dict)
    return rule


def test_autoscaler_metric_is_the_adapters_queue_time_rule() -> None:
    rule = _adapter_rule()
    hpa = _one(_docs(K8S / "cloud-service-hpa.yaml"), "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    series = re.match(r"^(\w+)\{", rule["seriesQuery"])
    assert series is not None and re.fullmatch(rule["name"]["matches"], series.group(1))
    exported = {m.name for m in ServiceMetrics().registry.collect()}
    assert series.group(1).removesuffix("_bucket") in exported
    adapter = _one(_docs(K8S / "prometheus-adapter.yaml"), "Deployment")
    prometheus = _one(_docs(K8S / "prometheus.yaml"), "Service", "prometheus")
    host = f"{prometheus['metadata']['name']}.{NAMESPACE}.svc"
    url = f"http://{host}:{prometheus['spec']['ports'][0]['port']}/"
    assert f"--prometheus-url={url}" in _pod_spec(adapter)["containers"][0]["args"]


def _rule_test() -> Doc:
    """A promtool rule test: a busy pod (10 frames/s, 90 % within 50 ms, 10 % between 250 and
    500 ms: p95 375 ms) and an idle one whose counters stand still."""

    def series(pod: str, le: str, values: str) -> Doc:
        labels = f'namespace="{NAMESPACE}",pod="{pod}",le="{le}"'
        return {"series": f"cloud_service_queue_time_seconds_bucket{{{labels}}}", "values": values}

    busy = [("0.05", "0+135x8"), ("0.25", "0+135x8"), ("0.5", "0+150x8"), ("+Inf", "0+150x8")]
    idle = [("0.05", "7x8"), ("+Inf", "7x8")]
    expected = [
        {"labels": 'adapter_metric{pod="busy"}', "value": 0.375},
        {"labels": 'adapter_metric{pod="idle"}', "value": 0},
    ]
    return {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [series("busy", le, v) for le, v in busy]
                + [series("idle", le, v) for le, v in idle],
                "promql_expr_test": [
                    {"expr": "adapter_metric", "eval_time": "2m", "exp_samples": expected}
                ],
            }
        ],
    }


@pytest.mark.process
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_adapter_query_gives_p95_per_pod_and_zero_when_idle(tmp_path: Path) -> None:
    """The adapter's metricsQuery, its template filled in as the adapter does for a Pods metric,
    evaluated by promtool on made-up series."""
    query = (
        _adapter_rule()["metricsQuery"]
        .replace("<<.Series>>", "cloud_service_queue_time_seconds_bucket")
        .replace("<<.LabelMatchers>>", 'namespace="video-analytics",pod=~"busy|idle"')
        .replace("<<.GroupBy>>", "pod")
    )
    rule = {"record": "adapter_metric", "expr": query}
    rules = {"groups": [{"name": "adapter", "rules": [rule]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    (tmp_path / "test.yml").write_text(yaml.safe_dump(_rule_test()), encoding="utf-8")
    result = subprocess.run(
        ["promtool", "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _mosquitto_conf(tmp_path: Path, port: int) -> Path:
    """The ConfigMap's mosquitto.conf with its listener, files and user made local."""
    config_map = _one(_docs(K8S / "mosquitto.yaml"), "ConfigMap", "mosquitto-config")
    text: str = config_map["data"]["mosquitto.conf"]
    local = {
        "listener": f"listener {port} 127.0.0.1",
        "password_file": f"password_file {tmp_path / 'passwd'}",
        "persistence_location": f"persistence_location {tmp_path}/",
    }
    lines = [local.get(line.split(" ", 1)[0], line) for line in text.splitlines()]
    assert sum(line in local.values() for line in lines) == len(local)
    if os.geteuid() == 0:  # as root it would drop to `mosquitto`, locked out of tmp_path
        lines.append(f"user {pwd.getpwuid(os.geteuid()).pw_name}")
    path = tmp_path / "mosquitto.conf"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _mqtt_login_accepted(port: int, username: str, password: str) -> bool:
    """Whether an MQTT 3.1.1 CONNECT with this login gets a CONNACK that accepts it."""

    def field(text: str) -> bytes:
        data = text.encode()
        return struct.pack("!H", len(data)) + data

    body = field("MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 10)
    body += field("k8s-test") + field(username) + field(password)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as conn:
            conn.sendall(bytes([0x10, len(body)]) + body)
            return conn.recv(4) == bytes([0x20, 2, 0, 0])
    except OSError:
        return False


@pytest.mark.process
@pytest.mark.skipif(
    mosquitto_executable() is None or shutil.which("mosquitto_passwd") is None,
    reason="mosquitto (with mosquitto_passwd) not installed",
)
def test_mosquitto_conf_starts_a_real_broker(tmp_path: Path) -> None:
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(tmp_path / "passwd"), "bridge", "secret"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    port = free_tcp_port()
    broker = ManagedProcess(
        "mosquitto",
        [str(mosquitto_executable()), "-c", str(_mosquitto_conf(tmp_path, port))],
        # a login is answered from the main loop, after the signal handlers are in: a SIGTERM
        # sent while only the port accepts is not the clean shutdown that writes the database
        ready_check=lambda: _mqtt_login_accepted(port, "bridge", "secret"),
    )
    broker.start(ready_timeout_s=START_TIMEOUT_S)
    try:
        assert broker.running, broker.output_tail()
    finally:
        # the database is written (and synced) on the way out: a busy disk may take seconds
        status = broker.stop(term_timeout_s=60.0)
    files = sorted(path.name for path in tmp_path.iterdir())
    assert status == 0, f"exit status {status}\n{broker.output_tail()}"
    # persistence is on and writes where told
    assert (tmp_path / "mosquitto.db").is_file(), f"{files}\n{broker.output_tail()}"
