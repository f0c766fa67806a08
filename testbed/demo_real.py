"""The demo on real footage: `python -m testbed.demo --source real`.

The same hybrid as the synthetic demo, on a real clip instead of a generated scene:

1. fetches OpenCV's `vtest` clip (768x576, 10 fps, 79.5 s, people walking across a campus path)
   as RTSP-friendly H.264 (`testbed.media.sample_clip`, cached under `.cache/media`);
2. starts the cloud service of `configs/demo-real.cloud.yaml` (the committed COCO-80 FP32 model
   on ONNX Runtime, CPU) in-process on a free loopback port;
3. serves the clip as a camera over RTSP (GStreamer) where available, else lets the agent read
   the file paced at its frame rate;
4. starts the MQTT broker and the alert feed as the synthetic demo does;
5. builds the edge agent of `configs/demo-real.edge.yaml` (the committed COCO-80 INT8 model, the
   tracker, a zone on the path and a counting line people walk across, escalation), pointed at
   what was started: camera URL, broker port, cloud port and a temporary outbox.

There is no scripted ground truth for real footage: `summarise_real` reports what ran (frames,
rate, share escalated, bytes sent, fusion, latency), the tracks seen and the alerts raised by
rule, kind and class. Its checks: frames were analysed, the edge detected objects (the clip has
people in every frame, so none at all means a broken model or config), the cloud answered and the
video was written.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from cloud_service.config import CloudServiceConfig
from configkit.yaml_loader import ConfigError, parse_yaml, validate_loaded
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent
from testbed.demo_report import (
    ReceivedAlert,
    Report,
    SummaryTable,
    add_cloud_rows,
    latency_text,
    pace_of,
    video_lines,
)
from testbed.demo_stack import (
    CACHE,
    MODELS,
    REPO_ROOT,
    DemoError,
    Models,
    Printer,
    Stack,
    overlay_of,
    start_camera,
    start_cloud_service,
    start_mqtt,
    step,
    temporary_outbox,
    warm_up,
    watch_agent,
)
from testbed.media import LICENCE_NOTES, probe_video, sample_clip

EDGE_CONFIG = REPO_ROOT / "configs" / "demo-real.edge.yaml"
CLOUD_CONFIG = REPO_ROOT / "configs" / "demo-real.cloud.yaml"
CLIP = "vtest"
# `--edge-model onnx`: the unquantised model on the edge too
FP32_EDGE_MODEL = MODELS / "coco" / "nanodet-coco-fp32.onnx"
_MODEL_KEYS = ("model_path", "engine_path")  # the model file of any runtime config

ModelT = TypeVar("ModelT", bound=BaseModel)


def _repo_path(path: str | Path) -> Path:
    """A config's path: relative ones are relative to the repository root."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def read_config(path: Path, model: type[ModelT]) -> dict[str, Any]:
    """The YAML document of `path` (a copy to edit), after checking that it is a valid config."""
    try:
        loaded = parse_yaml(path.read_text(encoding="utf-8"), str(path))
        validate_loaded(loaded, model)
    except (OSError, ConfigError) as exc:
        raise DemoError(f"{path} is not a usable config:\n{exc}") from exc
    document = copy.deepcopy(loaded.data)
    if not isinstance(document, dict):
        raise DemoError(f"{path} is not a mapping")
    return document


def _resolve_model(runtime: dict[str, Any], replacement: Path | None = None) -> Path:
    """Make the runtime's model file absolute (or `replacement`); returns it."""
    for key in _MODEL_KEYS:
        if key in runtime:
            runtime[key] = str(replacement or _repo_path(runtime[key]))
            return Path(runtime[key])
    raise DemoError(f"the runtime config names no model file: {runtime}")


def cloud_config(threads: int) -> tuple[CloudServiceConfig, Path]:
    """`configs/demo-real.cloud.yaml` on a free loopback port with `threads` ONNX Runtime
    threads, and its model file."""
    document = read_config(CLOUD_CONFIG, CloudServiceConfig)
    document.setdefault("server", {})["listen_address"] = "127.0.0.1:0"
    runtime = document["engine"]["runtime"]
    model = _resolve_model(runtime)
    if runtime.get("type") == "onnxruntime":
        runtime["intra_op_threads"] = threads
    return CloudServiceConfig.model_validate(document), model


def point_edge_document(
    document: dict[str, Any],
    args: argparse.Namespace,
    camera_url: str,
    mqtt: tuple[str, int],
    cloud_port: int,
    outbox: Path,
) -> None:
    """Point the document of `configs/demo-real.edge.yaml` at the camera, broker and cloud the
    demo started (and at the FP32 model with `--edge-model onnx`)."""
    cameras = document["cameras"]
    if len(cameras) != 1:
        raise DemoError(f"{EDGE_CONFIG} must have exactly one camera, has {len(cameras)}")
    cameras[0].update(url=camera_url, loop_file=True)
    _resolve_model(
        document["detector"]["runtime"], FP32_EDGE_MODEL if args.edge_model == "onnx" else None
    )
    document["escalation"].update(
        cloud_address=f"127.0.0.1:{cloud_port}",
        per_camera_frames_per_s=args.escalation_fps,
        per_agent_frames_per_s=args.escalation_fps,
    )
    document["mqtt"].update(host=mqtt[0], port=mqtt[1], outbox_path=str(outbox))


def start_real_stack(args: argparse.Namespace, say: Printer, stack: contextlib.ExitStack) -> Stack:
    """Start every component for real footage (see the module docstring), in order."""
    # both configs checked before anything starts; identity, topics and class names as the
    # agent will have them
    cloud_cfg, cloud_model = cloud_config(args.cloud_threads)
    document = read_config(EDGE_CONFIG, EdgeAgentConfig)
    config = EdgeAgentConfig.model_validate(document)
    class_names = list(config.detector.class_names)
    with step(say, "fetching the clip"):
        say(f"== footage: OpenCV's `{CLIP}` clip, people walking across a campus path (real video)")
        clip = sample_clip(CACHE / "media", name=CLIP)
        info = probe_video(clip)
        say(f"   {clip} ({info.width}x{info.height}, {info.fps:g} fps, {info.duration_s:.1f} s)")
    with step(say, "starting the cloud service"):
        say(f"== cloud service: {cloud_model.name} on ONNX Runtime (CPU), "
            f"{CLOUD_CONFIG.relative_to(REPO_ROOT)} ...")  # fmt: skip
        cloud = start_cloud_service(
            cloud_cfg, args.out, stack, cores=args.cloud_cpus, nice=args.cloud_nice
        )
        say(f"   gRPC on 127.0.0.1:{cloud.port}; {cloud.describe()}")
    with step(say, "starting the camera"):
        camera, url = start_camera(args.camera, clip, say, stack, what="the clip")
    with step(say, "starting the MQTT broker"):
        broker, host, port, feed = start_mqtt(
            args, config.mqtt.topic_prefix, config.agent.id, class_names, say, stack
        )
    with step(say, "starting the edge agent"):
        point_edge_document(document, args, url, (host, port), cloud.port, temporary_outbox(stack))
        config = EdgeAgentConfig.model_validate(document)
        edge_model = _resolve_model(document["detector"]["runtime"])
        say(f"== edge agent: {edge_model.name}, {EDGE_CONFIG.relative_to(REPO_ROOT)}: tracker, "
            f"zone and line rules, escalation <= {args.escalation_fps:g} frames/s")  # fmt: skip
        agent = EdgeAgent.from_config(config)
        warm_up(agent, clip)
        if not class_names:  # none in the config: the detector has the model's own
            class_names = [str(n) for n in getattr(agent.detector, "class_names", ())]
            feed.class_names = class_names
        video, recorder = watch_agent(
            agent, class_names, overlay_of(document), info.fps, args, stack
        )
    input_size = cloud_cfg.engine.input_size
    models = Models(
        edge=edge_model,
        cloud=cloud_model,
        cloud_imgsz=max(input_size) if input_size else 0,
        class_names=class_names,
    )
    return Stack(
        scene=None,
        clip=clip,
        scene_frames=info.frame_count,
        scene_fps=info.fps,
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


def label_of(payload: Mapping[str, Any], class_names: Sequence[str]) -> str | None:
    """The class name of an alert payload (`None` for zone events without an object): its own
    `label`, else (a payload from an agent that sends none) looked up by its class id."""
    label = payload.get("label")
    if isinstance(label, str):
        return label
    class_id = payload.get("class")
    if not isinstance(class_id, int):
        return None
    return class_names[class_id] if 0 <= class_id < len(class_names) else str(class_id)


def _alert_rows(alerts: Sequence[ReceivedAlert], class_names: Sequence[str]) -> list[str]:
    """`rule (kind): 3 start, 1 end` per rule, then the objects the alerts were about."""
    phases: dict[tuple[str, str], Counter[str]] = {}
    for a in alerts:
        key = (str(a.payload.get("rule")), str(a.payload.get("kind")))
        phases.setdefault(key, Counter())[str(a.payload.get("phase"))] += 1
    rows = [
        f"{rule} ({kind}): " + ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items()))
        for (rule, kind), counts in sorted(phases.items())
    ]
    labels = Counter(
        label_of(a.payload, class_names) or "-" for a in alerts if a.payload.get("phase") == "start"
    )
    if labels:
        by_label = ", ".join(f"{label} {n}" for label, n in labels.most_common())
        rows.append(f"started by class: {by_label}")
    return rows


def _tracks_text(s: Stack) -> tuple[str, dict[str, int]]:
    """Distinct tracks the agent reported, by class."""
    first_class: dict[int, int] = {}
    for _, detections in s.recorder.detections:
        for track_id, class_id in zip(
            detections.tracker_id.tolist(), detections.class_id.tolist(), strict=True
        ):
            if track_id >= 0:
                first_class.setdefault(int(track_id), int(class_id))
    names = s.models.class_names
    by_class = Counter(names[c] if 0 <= c < len(names) else str(c) for c in first_class.values())
    shown = ", ".join(f"{name} {n}" for name, n in by_class.most_common())
    return f"{len(first_class)} ({shown or 'none'})", dict(by_class)


def summarise_real(s: Stack, ran_s: float, args: argparse.Namespace) -> Report:
    """The end-of-run summary of a real-footage run; see the module docstring."""
    esc = s.agent.escalation.counters if s.agent.escalation is not None else None
    worker = s.agent.workers[0]
    frames = s.recorder.frames
    alerts = s.feed.events()
    alert_latencies = [a.latency_ms for a in alerts if a.payload.get("phase") == "start"]
    pass_s = s.scene_frames / s.scene_fps
    stream_bytes = s.clip.stat().st_size * ran_s / pass_s
    sent = esc.sent if esc else 0
    tracks, tracks_by_class = _tracks_text(s)
    detected = sum(len(d) for _, d in s.recorder.detections)

    t = SummaryTable()
    t.section("run")
    t.add("footage", f"{CLIP}: {s.scene_fps:g} fps, {pass_s:.1f} s per pass, {s.clip}")
    t.add("footage source", LICENCE_NOTES.get(CLIP, "testbed.media sample clip"))
    t.add("camera", f"{s.camera}: {s.camera_url}")
    t.add("broker", s.broker)
    t.add("models", f"edge {s.models.edge.name}, cloud {s.models.cloud.name}")
    t.add("streamed", f"{ran_s:.1f} s")
    t.section("edge")
    t.add("frames analysed", f"{frames} ({frames / max(ran_s, 1e-6):.1f} fps)")
    stale = worker.source.stats().drops + worker.counters.skipped_rate
    pace = pace_of(frames, ran_s, s.scene_fps, stale)
    t.add("frames dropped (stale)", str(stale))
    t.add("edge vs camera", pace.text())
    t.add(
        "focus crops",
        f"{worker.counters.focus_crops} looked at, {s.agent.focus_budget.skipped} left out "
        "(no time left in the frame period)",
    )
    t.add("detections", f"{detected} ({detected / max(frames, 1):.1f} per frame)")
    t.add("tracks", tracks)
    add_cloud_rows(t, s.agent, frames, stream_bytes)
    t.section("latency")
    t.add("capture -> frame results", latency_text(s.recorder.latencies_ms))
    t.add("capture -> alert via MQTT", latency_text(alert_latencies))
    t.section(f"alerts ({len(alerts)} messages)")
    lines = ["", "== summary", *t.lines()]
    lines += [f"  {row}" for row in _alert_rows(alerts, s.models.class_names)]
    lines += [f"  {a.line}" for a in alerts]
    lines.append("  (real footage: no scripted events to check; these are the alerts raised)")
    lines += video_lines(s.video)

    problems = []
    if frames == 0:
        problems.append("no frame was analysed")
    elif detected == 0:
        problems.append(
            f"the edge model ({s.models.edge.name}) detected nothing in {frames} frames of "
            "footage with people in every frame"
        )
    if esc is not None and esc.answered == 0:
        problems.append("the cloud answered no escalated frame")
    if s.video is not None and (s.video.error or s.video.frames_written == 0):
        problems.append(f"annotated video not written: {s.video.error or 'no frames'}")
    starts = [a for a in alerts if a.payload.get("phase") == "start"]
    numbers = {
        "source": "real",
        "clip": str(s.clip),
        "frames_analysed": frames,
        "streamed_s": ran_s,
        "pace": pace.numbers(),
        "escalated": sent,
        "escalated_share": sent / max(frames, 1),
        "hard_reasons": dict(esc.hard_reasons) if esc else {},
        "sent_reasons": dict(esc.sent_reasons) if esc else {},
        "answered": esc.answered if esc else 0,
        "bytes_sent": esc.bytes_sent if esc else 0,
        "fusion": dataclasses.asdict(worker.counters.fusion),
        "latency_ms": {"results": s.recorder.latencies_ms, "alerts": alert_latencies},
        "detections": detected,
        "tracks_by_class": tracks_by_class,
        "alerts": [
            {**a.payload, "label": label_of(a.payload, s.models.class_names)} for a in alerts
        ],
        "alerts_by_rule": dict(Counter(str(a.payload.get("rule")) for a in starts)),
        "alerts_by_kind": dict(Counter(str(a.payload.get("kind")) for a in starts)),
        "alerts_by_label": dict(
            Counter(label_of(a.payload, s.models.class_names) or "-" for a in starts)
        ),
        "video": str(s.video.path) if s.video else None,
        "video_frames": s.video.frames_written if s.video else 0,
        "problems": problems,
    }
    return Report.written(args.out, lines, problems, numbers)
