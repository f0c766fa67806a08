"""Starting the demo's components, in order, each stopped again by an `ExitStack`.

`start_stack(options, say, exit_stack)` renders (or reuses) the `events` scene, starts the cloud
service (the committed cloud model on ONNX Runtime CPU, a free loopback port) as a process of
its own, the camera (`RtspServer` looping the scene, or the file source paced at its frame
rate), the MQTT broker (`testbed.broker`, or an external one), the alert feed (`AlertFeed`)
and the edge agent (built, not started) with its outcome hook and the annotated video writer. A
component that does not start raises `DemoError` naming it. The real-footage mode
(`testbed.demo_real`) starts the same components from its own configs with `start_cloud_service`,
`start_camera`, `start_mqtt`, `temporary_outbox` and `watch_agent`.

The cloud stands in for a service on another machine, so it must not take the edge's CPU: it
runs as `cloud-service serve` in its own process and, where the cgroup v1 `cpu` controller is
writable (root, as on the project's machines), in a cgroup of its own: at most `--cloud-cpus`
cores (default 1, a machine of its own of one core), weighing as one plain process however many
threads it runs; `--cloud-nice N` lowers its priority too (the fallback where no cgroup can be
made). In the same process it had taken the edge's cores on a slow 2-core box (the edge analysed
5-9 of the camera's 25 frames/s). Lower is not better: at nice 10 on a loaded box the cloud
answered none of 35 escalated frames (the demo then fails its check) while the edge analysed
86 % of the camera's frames; at nice 0 in its cgroup it answered 14 of 24 and the edge, at 33 %,
still raised all 12 scripted alerts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import grpc
import numpy as np
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud_service.config import BatchingConfig, CloudServiceConfig, ServerConfig
from detection.config import DetectorConfig
from detection.runtimes.config import OnnxRuntimeConfig
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent
from testbed.alert_check import scene_agent_config
from testbed.annotate import AnnotatedVideoWriter, FrameAnnotator, SceneOverlay
from testbed.broker import BrokerUnavailableError, start_broker
from testbed.demo_report import AlertFeed, RunRecorder
from testbed.processes import (
    CpuGroup,
    ManagedProcess,
    ProcessStartError,
    free_tcp_port,
    nice_prefix,
)
from testbed.rtsp_camera import RtspServer, rtsp_server_unavailable_reason
from testbed.scenes.scenario import ScenarioSpec, make_scenario
from testbed.scenes.writer import SceneFolder, write_scene

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".cache"
MODELS = REPO_ROOT / "models"
AGENT_ID = "demo-agent"
TOPIC_PREFIX = "video-analytics"
SUBSCRIBE_TIMEOUT_S = 10.0
CLOUD_CPU_SHARES = 1024  # its cgroup weighs as one plain process, however many threads it runs
CLOUD_START_TIMEOUT_S = 120.0  # loading the model on a loaded 2-core box
CLOUD_STOP_TIMEOUT_S = 10.0


class DemoError(RuntimeError):
    """A component did not start or the run could not go on; the message says which and why."""


@dataclass(frozen=True)
class Models:
    """The committed models the demo runs and their class names."""

    edge: Path
    cloud: Path
    cloud_imgsz: int
    class_names: list[str]


def committed_models(edge_kind: str) -> Models:
    """The committed edge (`int8` or `onnx`) and cloud models, from `models/manifest.json`."""
    path = MODELS / "manifest.json"
    if not path.is_file():
        raise DemoError(f"no committed models: {path} is missing (scripts/build-models makes it)")
    manifest = json.loads(path.read_text())
    models = manifest["models"]
    edge = models["edge_tflite_int8" if edge_kind == "int8" else "edge_onnx"]
    cloud = models["cloud_onnx_fp16_weights"]
    return Models(
        edge=MODELS / str(edge["file"]),
        cloud=MODELS / str(cloud["file"]),
        cloud_imgsz=int(cloud["eval_imgsz"]),
        class_names=[str(n) for n in manifest["class_names"]],
    )


def prepare_scene(spec: ScenarioSpec, scenes_dir: Path) -> SceneFolder:
    """The scene of `spec`, rendered once and reused while its spec is unchanged."""
    root = scenes_dir / spec.name
    files = [root / "video.mp4", root / "events.json", root / "gt" / "gt.txt"]
    with contextlib.suppress(OSError, ValueError, KeyError):
        if all(f.is_file() for f in files):
            saved = json.loads((root / "scenario.json").read_text())["spec"]
            if saved == json.loads(json.dumps(spec.to_json())):
                return SceneFolder(root, files[0], files[2], files[1])
    return write_scene(spec, scenes_dir, CACHE / "media")


def start_cloud(
    models: Models, args: argparse.Namespace, stack: contextlib.ExitStack
) -> CloudProcess:
    """The cloud service with the committed cloud model (ONNX Runtime, CPU) on a free port, in
    a process of its own (see the module docstring)."""
    return start_cloud_service(
        CloudServiceConfig(
            server=ServerConfig(listen_address="127.0.0.1:0", grace_period_s=1.0),
            engine=DetectorConfig(
                runtime=OnnxRuntimeConfig(
                    model_path=models.cloud, intra_op_threads=args.cloud_threads
                ),
                class_names=models.class_names,
                input_size=(models.cloud_imgsz, models.cloud_imgsz),
            ),
            batching=BatchingConfig(max_batch_size=2),
            model_name=models.cloud.stem,
            model_version="committed",
        ),
        args.out,
        stack,
        cores=args.cloud_cpus,
        nice=args.cloud_nice,
    )


@dataclass
class CloudProcess:
    """The cloud service the demo started: its process, port and CPU share."""

    process: ManagedProcess
    port: int
    group: CpuGroup | None  # None: no cgroup here, `nice` only
    nice: int

    def describe(self) -> str:
        """`own process (pid 12), nice 0, cgroup demo-cloud-3 (1 core, cpu.shares 1024)`."""
        share = self.group.describe() if self.group else "no cgroup here (not writable)"
        return f"own process (pid {self.process.pid}), nice {self.nice}, {share}"


def start_cloud_service(
    config: CloudServiceConfig,
    folder: Path,
    stack: contextlib.ExitStack,
    *,
    cores: float | None,
    nice: int = 0,
) -> CloudProcess:
    """`cloud-service serve` on `config` (port 0: a free one) in its own process at `nice` and,
    where allowed, its own cgroup of `cores` cores; stopped by `stack`. `DemoError` when it does
    not start (with the end of its output)."""
    host, _, port_text = config.server.listen_address.rpartition(":")
    port = int(port_text) or free_tcp_port(host)
    document = config.model_dump(mode="json", exclude_none=True)
    document["server"]["listen_address"] = f"{host}:{port}"
    # nothing scrapes it here, and its fixed port may be taken (another service on the box)
    document.setdefault("metrics", {})["enabled"] = False
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cloud-service.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    group = CpuGroup.create(f"demo-cloud-{os.getpid()}", cores=cores, shares=CLOUD_CPU_SHARES)
    argv = [sys.executable, "-m", "cloud_service", "serve", "--config", str(path)]
    process = ManagedProcess(
        "cloud service",
        [*nice_prefix(nice), *argv, "--log-level", "WARNING"],
        ready_check=lambda: _serving(f"{host}:{port}"),
        cwd=REPO_ROOT,
        on_spawn=group.add if group is not None else None,
    )
    try:
        process.start(ready_timeout_s=CLOUD_START_TIMEOUT_S)
    except (ProcessStartError, OSError) as exc:
        if group is not None:
            group.remove()
        raise DemoError(f"the cloud service did not start: {exc}") from exc
    if group is not None:
        stack.callback(group.remove)
    stack.callback(lambda: process.stop(term_timeout_s=CLOUD_STOP_TIMEOUT_S))
    return CloudProcess(process, port, group, nice)


def _serving(address: str) -> bool:
    """Whether the gRPC health service at `address` reports SERVING now."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            # the stub package declares the HealthStub methods only on its channel-bound type
            reply = stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass(frozen=True)
class Endpoints:
    """Where the agent's camera, broker and cloud are, and its outbox file."""

    camera_url: str
    mqtt_host: str
    mqtt_port: int
    cloud_address: str
    outbox: Path


def agent_document(
    scene: SceneFolder, models: Models, at: Endpoints, escalation_fps: float
) -> dict[str, Any]:
    """The edge agent's config: the scene's zone, line and rules, escalation to the cloud."""
    document = scene_agent_config(
        scene.root,
        camera_url=at.camera_url,
        model_path=models.edge,
        class_names=models.class_names,
        mqtt_port=at.mqtt_port,
        mqtt_host=at.mqtt_host,
        outbox_path=at.outbox,
        agent_id=AGENT_ID,
        loop_file=True,
    )
    document["mqtt"].update(topic_prefix=TOPIC_PREFIX, status_interval_s=2.0)
    document["escalation"] = {
        "enabled": True,
        "cloud_address": at.cloud_address,
        "per_camera_frames_per_s": escalation_fps,
        "per_agent_frames_per_s": escalation_fps,
        "deadline_ms": 2000,
        "connection": {"reconnect_min_backoff_ms": 200, "reconnect_max_backoff_ms": 1000},
    }
    return document


def overlay_of(document: dict[str, Any]) -> SceneOverlay:
    """The camera's zones and lines (normalised) from an agent config document."""
    (camera,) = document["cameras"]
    return SceneOverlay(
        zones=[(z["name"], [tuple(p) for p in z["points"]]) for z in camera["zones"]],
        lines=[(ln["name"], [tuple(p) for p in ln["points"]]) for ln in camera["lines"]],
    )


class Printer:
    """Thread-safe line output: progress from the main thread, alerts from the MQTT thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        """Print one line now."""
        with self._lock:
            print(line, flush=True)


@contextlib.contextmanager
def step(say: Callable[[str], None], what: str) -> Iterator[None]:
    """Announce a start-up step and its duration; failures become `DemoError`s naming it."""
    started = time.perf_counter()
    try:
        yield
    except DemoError:
        raise
    except (ProcessStartError, BrokerUnavailableError, OSError, RuntimeError, ValueError) as exc:
        raise DemoError(f"{what} failed: {exc}") from exc
    say(f"   ready in {time.perf_counter() - started:.1f} s")


@dataclass
class Stack:
    """What the run started, for the summary and the shutdown."""

    scene: SceneFolder | None  # the scripted scene; None for real footage
    clip: Path  # the video the camera serves
    scene_frames: int  # frames in one pass of the clip
    scene_fps: float
    models: Models
    cloud: CloudProcess
    camera: str  # "rtsp" or "file"
    camera_url: str
    broker: str  # "mosquitto", "amqtt" or "external host:port"
    agent: EdgeAgent
    feed: AlertFeed
    recorder: RunRecorder
    video: AnnotatedVideoWriter | None


def start_stack(args: argparse.Namespace, say: Printer, stack: contextlib.ExitStack) -> Stack:
    """Start every component in order; each is stopped by `stack` in reverse order."""
    models = committed_models(args.edge_model)
    with step(say, "rendering the scene"):
        say("== scene: the scripted `events` scene (zone, line, loiterer) over real video")
        spec = make_scenario("events", args.seed)
        scene = prepare_scene(spec, args.out / "scenes")
        say(f"   {scene.root}")
    with step(say, "starting the cloud service"):
        say(f"== cloud service: {models.cloud.name} on ONNX Runtime (CPU) ...")
        cloud = start_cloud(models, args, stack)
        say(f"   gRPC on 127.0.0.1:{cloud.port}; {cloud.describe()}")
    assert scene.video is not None  # noqa: S101 - written with video on
    with step(say, "starting the camera"):
        camera, url = start_camera(args.camera, scene.video, say, stack)
    with step(say, "starting the MQTT broker"):
        broker, host, port, feed = start_mqtt(
            args, TOPIC_PREFIX, AGENT_ID, models.class_names, say, stack
        )
    with step(say, "starting the edge agent"):
        at = Endpoints(url, host, port, f"127.0.0.1:{cloud.port}", temporary_outbox(stack))
        document = agent_document(scene, models, at, args.escalation_fps)
        say(f"== edge agent: {models.edge.name}, tracker, rules, escalation <= "
            f"{args.escalation_fps:g} frames/s")  # fmt: skip
        agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document))
        warm_up(agent, scene.video)
        video, recorder = watch_agent(
            agent, models.class_names, overlay_of(document), spec.fps, args, stack
        )
    return Stack(
        scene=scene,
        clip=scene.video,
        scene_frames=spec.n_frames,
        scene_fps=spec.fps,
        models=models,
        cloud=cloud,
        camera=camera,
        camera_url=url,
        broker=broker,
        agent=agent,
        feed=feed,
        recorder=recorder,
        video=video,
    )


def start_camera(
    choice: str, video: Path, say: Printer, stack: contextlib.ExitStack, what: str = "the scene"
) -> tuple[str, str]:
    """("rtsp", url) with a started RTSP server, or ("file", path) for the paced file source."""
    reason = rtsp_server_unavailable_reason() if choice != "file" else "--camera file"
    if reason is None:
        server = RtspServer(video, mount="camera")
        server.start()
        stack.callback(server.stop)
        say(f"== camera: RTSP server (GStreamer) looping {what} at {server.url}")
        return "rtsp", server.url
    if choice == "rtsp":
        raise DemoError(f"no RTSP server here: {reason}")
    say(f"== camera: {what} file, paced at its frame rate (no RTSP server: {reason})")
    return "file", str(video)


def start_mqtt(
    args: argparse.Namespace,
    prefix: str,
    agent_id: str,
    class_names: list[str],
    say: Printer,
    stack: contextlib.ExitStack,
) -> tuple[str, str, int, AlertFeed]:
    """(broker, host, port, feed): the broker (`--mqtt-host` or a local one) and the alert feed
    subscribed to the agent's topics on it."""
    if args.mqtt_host:
        host, port = args.mqtt_host, args.mqtt_port
        broker = f"external {host}:{port}"
    else:
        local = start_broker(args.broker, args.out / "broker")
        stack.callback(local.stop)
        broker, host, port = local.kind, local.host, local.port
    say(f"== MQTT broker: {broker} at {host}:{port}")
    feed = AlertFeed(host, port, prefix, agent_id, class_names, say)
    stack.callback(feed.close)
    if not feed.wait_subscribed(SUBSCRIBE_TIMEOUT_S):
        raise DemoError(f"cannot subscribe on the MQTT broker at {host}:{port}")
    return broker, host, port, feed


def temporary_outbox(stack: contextlib.ExitStack) -> Path:
    """The agent's MQTT outbox file in a temporary folder that `stack` removes."""
    outbox_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="demo-")))
    return outbox_dir / "outbox.sqlite3"


def warm_up(agent: EdgeAgent, clip: Path) -> None:
    """One inference on the clip's first frame before the camera streams: a runtime's first
    run sets itself up (XNNPACK, ONNX Runtime's arenas) and took the first second of the scene
    on a loaded 2-core box, where its first people walk into the zone."""
    capture = cv2.VideoCapture(str(clip))
    try:
        ok, frame = capture.read()
    finally:
        capture.release()
    if ok:
        agent.detector.detect([np.asarray(frame, dtype=np.uint8)])


def watch_agent(
    agent: EdgeAgent,
    class_names: list[str],
    overlay: SceneOverlay,
    fps: float,
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
) -> tuple[AnnotatedVideoWriter | None, RunRecorder]:
    """Hook a `RunRecorder` (and, unless `--no-video`, the annotated video writer) to `agent`."""
    video = None
    if not args.no_video:
        annotator = FrameAnnotator(class_names, overlay)
        video = AnnotatedVideoWriter(args.out / "annotated.mp4", annotator, fps=fps)
        stack.callback(video.close)
    recorder = RunRecorder(class_names, video)
    agent.hooks.append(recorder)
    return video, recorder
