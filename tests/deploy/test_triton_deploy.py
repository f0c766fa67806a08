"""The Triton variant: the kustomize overlay deploy/kubernetes-triton (Triton Inference Server on
a GPU, the cloud service's `triton` engine on CPU) and the model repository deploy/triton.

Checked like tests/deploy/test_kubernetes.py, offline: schema-valid objects, and files that agree
with each other (the cloud config with the `triton` Service, Triton's args with its probes and
ports, Prometheus with the Triton pods) and with the model's `config.pbtxt`, parsed as Triton's
ModelConfig.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from google.protobuf import json_format, text_format

from cloud_service.config import CloudServiceConfig
from configkit.yaml_loader import parse_config
from detection.model_metadata import metadata_class_names
from detection.runtimes.config import TritonConfig
from protos.inference.v2 import inference_pb2
from tests.deploy.test_kubernetes import (
    K8S,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    _container_ports,
    _docs,
    _labels_match,
    _one,
    _pod_spec,
    _prometheus_config,
)

# kubectl kustomize renders the overlay (cached for the module); Triton's venv parses its config
pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy" / "kubernetes-triton"
TRITON_MANIFEST = OVERLAY / "triton-server.yaml"
CONFIG_PATCH = OVERLAY / "cloud-service-config.yaml"
DEPLOYMENT_PATCH = OVERLAY / "cloud-service-deployment.yaml"
TRITON_DIR = REPO / "deploy" / "triton"
MODEL_REPOSITORY = TRITON_DIR / "model_repository"
MODEL_NAME = "cloud-detector"
MODEL_CONFIG = MODEL_REPOSITORY / MODEL_NAME / "config.pbtxt"
# A separate environment with the Triton client, for its full ModelConfig schema.
TRITON_VENV_PYTHON = REPO / ".venv-triton" / "bin" / "python"
CLASS_NAMES = ("person", "car", "truck", "forklift")
# tritonserver's defaults where its args name no port
TRITON_DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
TRITON_OBJECTS = {
    ("Deployment", "triton"),
    ("Service", "triton"),
    ("PodDisruptionBudget", "triton"),
}

Doc = dict[str, Any]


def _kustomize(path: Path) -> list[Doc]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@functools.cache
def _rendered_once() -> tuple[Doc, ...]:
    return tuple(_kustomize(OVERLAY))


needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed"
)


def _rendered() -> list[Doc]:
    """The overlay as `kubectl apply -k` would send it (a fresh copy: tests may change it)."""
    return json.loads(json.dumps(_rendered_once()))  # type: ignore[no-any-return]


def _triton() -> Doc:
    return _one(_docs(TRITON_MANIFEST), "Deployment", "triton")


def _triton_container() -> Doc:
    (container,) = _pod_spec(_triton())["containers"]
    assert isinstance(container, dict)
    return container


def _triton_flags() -> dict[str, str]:
    """Triton's `--name=value` args (after the `tritonserver` command)."""
    command, *args = _triton_container()["args"]
    assert command == "tritonserver"
    flags: dict[str, str] = {}
    for arg in args:
        match = re.fullmatch(r"--([a-z-]+)=(.*)", arg)
        assert match, f"expected --name=value, got {arg!r}"
        assert match.group(1) not in flags, arg
        flags[match.group(1)] = match.group(2)
    return flags


def _triton_ports_from_args() -> dict[str, int]:
    flags = _triton_flags()
    return {
        name: int(flags.get(f"{name}-port", default))
        for name, default in TRITON_DEFAULT_PORTS.items()
    }


def _config_text(config_map: Doc) -> tuple[str, str]:
    (key,) = config_map["data"]
    text: str = config_map["data"][key]
    return key, text


def _cloud_config() -> CloudServiceConfig:
    """The cloud-service config the overlay puts in place of the base's."""
    key, text = _config_text(_one(_docs(CONFIG_PATCH), "ConfigMap", "cloud-service-config"))
    return parse_config(text, CloudServiceConfig, file=f"{CONFIG_PATCH.name}:{key}")


def _runtime(config: CloudServiceConfig) -> TritonConfig:
    runtime = config.engine.runtime
    assert isinstance(runtime, TritonConfig), runtime
    return runtime


def _model_config_subset() -> inference_pb2.ModelConfig:
    """config.pbtxt parsed with the service's own subset of ModelConfig (other fields skipped)."""
    return text_format.Parse(
        MODEL_CONFIG.read_text(encoding="utf-8"),
        inference_pb2.ModelConfig(),
        allow_unknown_field=True,
    )


# --- the overlay ------------------------------------------------------------------------------


@needs_kubectl
def test_overlay_renders_the_base_plus_triton() -> None:
    def ids(docs: list[Doc]) -> list[tuple[str, str]]:
        return sorted((d["kind"], d["metadata"]["name"]) for d in docs)

    assert ids(_rendered()) == sorted(ids(_kustomize(K8S)) + list(TRITON_OBJECTS))
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text(encoding="utf-8"))
    # like the base: a `namespace:` would move the adapter's RoleBinding out of kube-system
    assert "namespace" not in kustomization
    listed = set(kustomization["resources"]) | {p["path"] for p in kustomization["patches"]}
    assert {p.name for p in OVERLAY.glob("*.yaml")} - listed == {"kustomization.yaml"}


@needs_kubectl
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_validates_strictly(version: str) -> None:
    for doc in _rendered():
        # strict: unknown fields are errors; a kind without a schema raises (nothing skipped)
        validated = kubernetes_validate.validate(doc, version, strict=True)
        assert validated == version, (doc["kind"], doc["metadata"]["name"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_triton_manifest_validates_strictly(version: str) -> None:
    docs = _docs(TRITON_MANIFEST)
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == TRITON_OBJECTS
    for doc in docs:
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert kubernetes_validate.validate(doc, version, strict=True) == version


@needs_kubectl
def test_patches_reach_the_rendered_objects() -> None:
    rendered = _rendered()
    for patch, kind, name in ((CONFIG_PATCH, "ConfigMap", "cloud-service-config"),):
        wanted = _one(_docs(patch), kind, name)["data"]
        assert _one(rendered, kind, name)["data"] == wanted, patch.name
    deployment = _one(rendered, "Deployment", "cloud-service")
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    # the cloud pods only decode and batch: no GPU, no model files
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    assert "models" not in {v["name"] for v in pod["volumes"]}
    assert "/models" not in {m["mountPath"] for m in container["volumeMounts"]}
    mounted = {m["name"] for m in container["volumeMounts"]}
    assert mounted <= {v["name"] for v in pod["volumes"]}
    assert deployment["spec"]["template"]["metadata"]["labels"]["video-analytics/variant"] == (
        "triton"
    )
    # the service waits for Triton up to startup_timeout_s, then exits with its own error:
    # the startup probe must not kill it first
    probe = container["startupProbe"]
    window_s = probe["periodSeconds"] * probe["failureThreshold"]
    assert window_s > _runtime(_cloud_config()).startup_timeout_s


# --- the cloud-service config -------------------------------------------------------------------


def test_cloud_config_loads_and_points_at_the_triton_service() -> None:
    config = _cloud_config()
    runtime = _runtime(config)
    service = _one(_docs(TRITON_MANIFEST), "Service", "triton")
    host, _, port = runtime.url.rpartition(":")
    metadata = service["metadata"]
    assert host == f"{metadata['name']}.{metadata['namespace']}.svc.cluster.local"
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert int(port) == grpc_port["port"]
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"
    # ... which reaches the port Triton serves gRPC on
    container_port = _container_ports(_triton())[grpc_port["targetPort"]]
    assert container_port == _triton_ports_from_args()["grpc"]
    # the model in the repository, at the version Triton's policy picks (hot swap)
    assert runtime.model_name == MODEL_NAME
    assert runtime.model_version == ""
    assert runtime.startup_timeout_s > 0 and runtime.request_timeout_s > 0


def test_cloud_config_fits_the_models_config() -> None:
    config = _cloud_config()
    model = _model_config_subset()
    (tensor,) = model.input
    assert config.engine.input_size is not None
    assert list(tensor.dims) == [3, *config.engine.input_size]
    assert config.engine.letterbox == "fixed"  # one input shape for every batch
    assert 1 <= config.batching.max_batch_size <= model.max_batch_size
    assert all(size <= model.max_batch_size for size in config.batching.preferred_batch_sizes)
    # class names and box units come from the model's parameters
    assert not config.engine.class_names and config.engine.box_units == "auto"
    assert config.decoder.type == "cpu"  # no GPU in the cloud pods
    assert config.candidate is None


def test_commented_candidate_block_is_a_valid_ab_test() -> None:
    """The ConfigMap's commented `candidate:` example, uncommented, loads: a second version of the
    same model in the same Triton."""
    key, text = _config_text(_one(_docs(CONFIG_PATCH), "ConfigMap", "cloud-service-config"))
    lines = text.splitlines()
    start = lines.index("# candidate:")
    end = start
    while end < len(lines) and lines[end].startswith("#"):
        end += 1
    uncommented = [line.removeprefix("# ") for line in lines[start:end]]
    config = parse_config(
        "\n".join([*lines[:start], *uncommented, *lines[end:]]),
        CloudServiceConfig,
        file=f"{CONFIG_PATCH.name}:{key} (candidate uncommented)",
    )
    assert config.candidate is not None
    candidate = config.candidate.engine.runtime
    assert isinstance(candidate, TritonConfig)
    main = _runtime(config)
    assert (candidate.url, candidate.model_name) == (main.url, main.model_name)
    assert candidate.model_version not in ("", main.model_version)
    assert config.candidate.engine.input_size == config.engine.input_size
    assert 0 < config.candidate.share < 1


# --- the Triton pod ------------------------------------------------------------------------------


def test_triton_pod_runs_restricted() -> None:
    """The namespace enforces the `restricted` Pod Security Standard (as in test_kubernetes)."""
    pod = _pod_spec(_triton())
    pod_context = pod.get("securityContext", {})
    assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    assert pod.get("automountServiceAccountToken") is False
    for container in pod["containers"]:
        context = {**pod_context, **container.get("securityContext", {})}
        assert context.get("runAsNonRoot") is True
        assert context.get("runAsUser", 0) != 0
        assert context.get("allowPrivilegeEscalation") is False
        assert context.get("capabilities", {}).get("drop") == ["ALL"]
        assert context.get("readOnlyRootFilesystem") is True
        assert "memory" in container["resources"]["limits"]
        # a read-only root: whatever writes gets an emptyDir
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts  # noqa: S108 - the pod's own emptyDir


def test_triton_probes_and_ports_match_its_args() -> None:
    container = _triton_container()
    flags = _triton_flags()
    ports = _container_ports(_triton())
    assert ports == _triton_ports_from_args()
    assert flags["model-control-mode"] == "poll" and int(flags["repository-poll-secs"]) > 0
    # readiness means every model is loaded
    assert flags["strict-readiness"] == "true"

    def probe(name: str) -> tuple[str, int]:
        get = container[name]["httpGet"]
        port = get["port"]
        return get["path"], ports[port] if isinstance(port, str) else port

    http = ports["http"]
    assert probe("livenessProbe") == ("/v2/health/live", http)
    assert probe("readinessProbe") == ("/v2/health/ready", http)
    assert probe("startupProbe")[1] == http
    # preStop, then Triton waits for in-flight requests: SIGKILL must come after both
    pre_stop_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    exit_timeout_s = int(flags["exit-timeout-secs"])
    assert pre_stop_s + exit_timeout_s < _pod_spec(_triton())["terminationGracePeriodSeconds"]
    service = _one(_docs(TRITON_MANIFEST), "Service", "triton")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)


def test_triton_takes_a_gpu_and_the_model_repository() -> None:
    deployment = _triton()
    pod = _pod_spec(deployment)
    container = _triton_container()
    assert container["image"].startswith("nvcr.io/nvidia/tritonserver:")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    # the repository lies on the base's models volume, mounted read-only
    claim = _one(_docs(K8S / "cloud-service-models-pvc.yaml"), "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in pod["volumes"]}
    (name,) = [
        n
        for n, v in volumes.items()
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
    ]
    assert volumes[name]["persistentVolumeClaim"]["readOnly"] is True
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == name]
    assert mount["readOnly"] is True
    repository = _triton_flags()["model-repository"]
    assert repository.startswith(mount["mountPath"].rstrip("/") + "/")
    # selectors: the Service and budget take the Triton pods, and no cloud-service object does
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _labels_match(deployment["spec"]["selector"]["matchLabels"], labels)
    for doc in _docs(TRITON_MANIFEST):
        if doc["kind"] == "Service":
            assert _labels_match(doc["spec"]["selector"], labels)
        elif doc["kind"] == "PodDisruptionBudget":
            assert doc["spec"]["selector"] == deployment["spec"]["selector"]
    for file in ("cloud-service-service.yaml", "cloud-service-pdb.yaml"):
        for doc in _docs(K8S / file):
            selector = doc["spec"]["selector"]
            assert not _labels_match(selector.get("matchLabels", selector), labels), file


# --- Prometheus -----------------------------------------------------------------------------------


def test_prometheus_discovers_the_triton_pods_metrics_port() -> None:
    # the base's Prometheus has the job: it finds nothing until the Triton variant runs
    jobs = {job["job_name"]: job for job in _prometheus_config()["scrape_configs"]}
    job = jobs["triton"]
    workload = _triton()
    template = workload["spec"]["template"]["metadata"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [NAMESPACE]
    key, _, value = sd["selectors"][0]["label"].partition("=")
    assert template["labels"][key] == value
    keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
    assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    (port,) = [p for p in _container_ports(workload) if re.fullmatch(keep["regex"], p)]
    assert _container_ports(workload)[port] == _triton_ports_from_args()["metrics"]
    assert template["annotations"]["prometheus.io/port"] == str(_container_ports(workload)[port])
    assert template["annotations"]["prometheus.io/path"] == job.get("metrics_path", "/metrics")
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets
    # no other job picks the Triton pods up
    for name, other in jobs.items():
        for other_sd in other.get("kubernetes_sd_configs", []) if name != "triton" else []:
            key, _, value = other_sd["selectors"][0]["label"].partition("=")
            assert template["labels"].get(key) != value, name


# --- the model repository -------------------------------------------------------------------------


def test_model_repository_holds_the_config_only() -> None:
    """Versions (`<n>/model.plan`) are built per GPU and never committed; no placeholders."""
    assert [p.name for p in MODEL_REPOSITORY.iterdir()] == [MODEL_NAME]
    entries = {p.name for p in (MODEL_REPOSITORY / MODEL_NAME).iterdir()}
    assert "config.pbtxt" in entries
    assert all(name.isdigit() for name in entries - {"config.pbtxt"}), entries
    tracked = subprocess.run(
        ["git", "ls-files", str(MODEL_REPOSITORY.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if tracked.returncode == 0 and tracked.stdout.strip():
        assert not [f for f in tracked.stdout.split() if not f.endswith("/config.pbtxt")]


def test_model_config_fields_with_the_services_subset() -> None:
    """Always runs: the fields the service reads, with its own (partial) ModelConfig."""
    model = _model_config_subset()
    assert model.name == MODEL_NAME == MODEL_CONFIG.parent.name
    assert model.platform == "tensorrt_plan"
    assert model.max_batch_size == 16
    (tensor,) = model.input
    assert (tensor.name, list(tensor.dims)) == ("images", [3, 640, 640])
    assert tensor.data_type == inference_pb2.DataType.TYPE_FP32
    (output,) = model.output
    assert (output.name, list(output.dims)) == ("output0", [8, 8400])
    assert output.data_type == inference_pb2.DataType.TYPE_FP32
    parameters = {key: value.string_value for key, value in model.parameters.items()}
    assert metadata_class_names(parameters) == CLASS_NAMES
    assert parameters["box_units"] == "pixels"
    # anchor-free YOLO head: 4 box values, then one score per class
    assert output.dims[0] == 4 + len(CLASS_NAMES)


_STRICT_PARSE = """
import json, sys
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
text = open(sys.argv[1], encoding="utf-8").read()
config = text_format.Parse(text, model_config_pb2.ModelConfig())
print(json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)))
"""


def _strict_model_config() -> Doc:
    """config.pbtxt parsed strictly (unknown fields are errors) with Triton's full ModelConfig
    from `tritonclient`: here if importable, else in the `.venv-triton` environment."""
    try:
        model_config_pb2 = importlib.import_module("tritonclient.grpc.model_config_pb2")
    except ImportError:
        if not TRITON_VENV_PYTHON.exists():
            pytest.skip(
                "Triton's ModelConfig schema not available: tritonclient is not importable "
                f"and {TRITON_VENV_PYTHON.relative_to(REPO)} does not exist"
            )
        result = subprocess.run(
            [str(TRITON_VENV_PYTHON), "-c", _STRICT_PARSE, str(MODEL_CONFIG)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        parsed: Doc = json.loads(result.stdout)
        return parsed
    config = text_format.Parse(
        MODEL_CONFIG.read_text(encoding="utf-8"), model_config_pb2.ModelConfig()
    )
    as_dict: Doc = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return as_dict


def test_model_config_parses_strictly_as_tritons_model_config() -> None:
    config = _strict_model_config()
    assert config["name"] == MODEL_NAME and config["platform"] == "tensorrt_plan"
    max_batch = config["max_batch_size"]
    assert max_batch == 16

    def tensor(entry: Doc) -> tuple[str, str, list[int]]:
        return entry["name"], entry["data_type"], [int(d) for d in entry["dims"]]

    assert [tensor(t) for t in config["input"]] == [("images", "TYPE_FP32", [3, 640, 640])]
    assert [tensor(t) for t in config["output"]] == [("output0", "TYPE_FP32", [8, 8400])]
    batching = config["dynamic_batching"]
    preferred = batching["preferred_batch_size"]
    assert preferred == sorted(preferred) and preferred[-1] == max_batch
    assert 0 < int(batching["max_queue_delay_microseconds"]) <= 5000  # the cloud batches first
    assert [group["kind"] for group in config["instance_group"]] == ["KIND_GPU"]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    parameters = {key: value["string_value"] for key, value in config["parameters"].items()}
    assert json.loads(parameters["class_names"]) == list(CLASS_NAMES)
    assert parameters["box_units"] == "pixels"


def test_readme_builds_the_plan_the_config_describes() -> None:
    """deploy/triton/README.md's trtexec line: shapes 1 / opt / max_batch_size of the input."""
    model = _model_config_subset()
    readme = (TRITON_DIR / "README.md").read_text(encoding="utf-8")
    (tensor,) = model.input
    dims = "x".join(str(d) for d in tensor.dims)
    shapes = dict(re.findall(rf"--(min|opt|max)Shapes={tensor.name}:(\d+)x{dims}\b", readme))
    assert set(shapes) == {"min", "opt", "max"}, shapes
    assert int(shapes["min"]) == 1 and int(shapes["max"]) == model.max_batch_size
    assert 1 <= int(shapes["opt"]) <= model.max_batch_size
    assert "--saveEngine=model.plan" in readme
    assert "not committed" in readme
