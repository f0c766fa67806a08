"""What the demo watches and reports: every analysed frame, every alert from MQTT, the summary.

- `RunRecorder`: the edge agent's outcome hook. Counts frames and escalations, keeps the
  capture-to-results latency of each frame and the tracked detections (for ground-truth
  scoring), and hands frames to the annotated video writer. Runs in the frame loop: cheap.
- `AlertFeed`: a paho client subscribed to the agent's topics on the broker. Prints each alert
  as it arrives (with its capture-to-received latency) and keeps the payloads.
- `percentile`, `ground_truth`, `SummaryTable`, `add_cloud_rows`, `video_lines`, `Report`: the
  end-of-run numbers and their table, shared by the synthetic and the real-footage summaries.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from detection.coco_eval import GroundTruth
from detection.detections import Detections
from edge_agent.alerts.subscriber import format_message
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from testbed.annotate import AnnotatedVideoWriter, FrameInfo
from testbed.scenes.writer import read_mot

logger = logging.getLogger(__name__)

MIN_VISIBILITY = 0.25  # less visible ground truth is ignored in scoring, as in training labels


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100, nearest rank) of `values`; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ground_truth(gt_file: Path, n_frames: int) -> list[GroundTruth]:
    """Per-frame ground truth of a scene; boxes under `MIN_VISIBILITY` are ignored."""
    per_frame: list[list[tuple[int, int, int, int, int, float]]] = [[] for _ in range(n_frames)]
    for f, _, x, y, w, h, _, k, v in read_mot(gt_file):
        if f <= n_frames:
            per_frame[f - 1].append((x, y, x + w, y + h, k, v))
    truths = []
    for rows in per_frame:
        array = np.array(rows, dtype=np.float64).reshape(-1, 6)
        truths.append(
            GroundTruth(
                xyxy=array[:, :4].astype(np.float32),
                class_id=array[:, 4].astype(np.int64),
                ignore=array[:, 5] < MIN_VISIBILITY,
            )
        )
    return truths


def _short_event(outcome: FrameOutcome, class_names: Sequence[str]) -> list[str]:
    texts = []
    for event in outcome.events:
        name = class_names[event.class_id] if 0 <= event.class_id < len(class_names) else "?"
        place = event.zone or event.line or ""
        direction = f" {event.direction}" if event.direction else ""
        texts.append(f"{event.kind}{direction} {event.phase} #{event.track_id} {name} @{place}")
    return texts


@dataclass
class RunRecorder:
    """The agent's outcome hook (see the module docstring); thread-safe reads via `snapshot`."""

    class_names: Sequence[str]
    video: AnnotatedVideoWriter | None = None
    frames: int = 0
    escalated: int = 0
    first_frame_monotonic_s: float | None = None
    latencies_ms: list[float] = field(default_factory=list)
    # (capture frame index, tracked detections) of each analysed frame, for scoring
    detections: list[tuple[int, Detections]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _first_frame: threading.Event = field(default_factory=threading.Event)

    def __call__(self, outcome: FrameOutcome) -> None:
        """Record one analysed frame (called in the frame loop)."""
        now = time.monotonic()
        frame = outcome.frame
        latency_ms = (now - frame.monotonic_s) * 1000.0
        with self._lock:
            if self.first_frame_monotonic_s is None:
                self.first_frame_monotonic_s = frame.monotonic_s
                self._first_frame.set()
            self.frames += 1
            self.escalated += int(outcome.escalated)
            self.latencies_ms.append(latency_ms)
            self.detections.append((frame.index, outcome.detections))
            start = self.first_frame_monotonic_s
            escalated = self.escalated
        if self.video is not None:
            info = FrameInfo(
                index=frame.index,
                time_s=frame.monotonic_s - start,
                escalated=outcome.escalated,
                escalated_so_far=escalated,
                latency_ms=latency_ms,
                events=_short_event(outcome, self.class_names),
            )
            self.video.submit(frame.image, outcome.detections, info)

    def wait_first_frame(self, timeout_s: float) -> bool:
        """Block until the first frame was analysed; False on timeout."""
        return self._first_frame.wait(timeout_s)

    def snapshot(self) -> tuple[int, int]:
        """(frames analysed, frames escalated) so far."""
        with self._lock:
            return self.frames, self.escalated


@dataclass(frozen=True)
class ReceivedAlert:
    """One event message as it came from the broker."""

    topic: str
    payload: dict[str, Any]
    line: str  # readable, from `format_message`
    received_s: float  # wall clock

    @property
    def latency_ms(self) -> float:
        """From the capture of the frame that raised it to its arrival here."""
        stamp = str(self.payload["timestamp"]).replace("Z", "+00:00")
        return (self.received_s - datetime.fromisoformat(stamp).timestamp()) * 1000.0


class AlertFeed:
    """Follows `<prefix>/<agent>/#` on the broker; prints alerts as they arrive."""

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str,
        agent: str,
        class_names: Sequence[str],
        emit: Callable[[str], None],
    ) -> None:
        self.prefix = prefix
        self.class_names = list(class_names)
        self.alerts: list[ReceivedAlert] = []
        self.availability: list[str] = []
        self.last_status: dict[str, Any] = {}
        self.errors = 0
        self._emit = emit
        self._topic = f"{prefix}/{agent}/#"
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"demo-feed-{uuid.uuid4().hex[:8]}"
        )
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.reconnect_delay_set(1, 2)
        self._client.connect(host, port, keepalive=10)
        self._client.loop_start()

    def wait_subscribed(self, timeout_s: float) -> bool:
        """Block until the broker acknowledged the subscription; False on timeout."""
        return self._subscribed.wait(timeout_s)

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()

    def events(self) -> list[ReceivedAlert]:
        """The alerts received so far, in arrival order."""
        with self._lock:
            return list(self.alerts)

    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.ConnectFlags,
        reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            logger.error("alert feed: broker refused the connection: %s", reason)
            return
        client.subscribe(self._topic, qos=1)

    def _on_subscribe(self, *_args: Any) -> None:
        self._subscribed.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        received_s = time.time()
        try:
            line = format_message(
                self.prefix,
                msg.topic,
                bytes(msg.payload),
                retained=bool(msg.retain),
                class_names=self.class_names,
                received_s=received_s,
            )
        except ValueError as exc:
            self.errors += 1
            logger.warning("alert feed: %s", exc)
            return
        if "/events/" in msg.topic:
            alert = ReceivedAlert(msg.topic, json.loads(msg.payload), line, received_s)
            with self._lock:
                self.alerts.append(alert)
            self._emit(f"  ALERT {line}  [{alert.latency_ms:.0f} ms after capture]")
        elif msg.topic.endswith("/availability"):
            self.availability.append(msg.payload.decode(errors="replace"))
        elif "/status/" in msg.topic:
            self.last_status = json.loads(msg.payload)


@dataclass
class SummaryTable:
    """Rows of `label | value` for the end-of-run table, with section headings."""

    rows: list[tuple[str, str]] = field(default_factory=list)

    def section(self, title: str) -> None:
        """A heading row."""
        self.rows.append((f"-- {title}", ""))

    def add(self, label: str, value: str) -> None:
        """One row."""
        self.rows.append((label, value))

    def lines(self) -> list[str]:
        """The table as aligned text."""
        width = max((len(label) for label, value in self.rows if value), default=10)
        return [f"  {label:<{width}}  {value}" if value else label for label, value in self.rows]


BEHIND_SHARE = 0.9  # below this share of the camera's frame rate the edge is behind it


@dataclass(frozen=True)
class Pace:
    """How the edge kept up with its camera: frames analysed per second against the camera's."""

    camera_fps: float
    analysed_fps: float
    stale: int  # frames the edge never analysed (replaced by newer ones, or over its rate)

    @property
    def share(self) -> float:
        """Analysed frames per camera frame."""
        return self.analysed_fps / self.camera_fps if self.camera_fps > 0 else 0.0

    @property
    def behind(self) -> bool:
        """Whether the edge analysed less than `BEHIND_SHARE` of the camera's frames."""
        return self.share < BEHIND_SHARE

    def text(self) -> str:
        """The summary row: whether the edge is behind the camera, and by how much."""
        rate = f"{self.analysed_fps:.1f} of the camera's {self.camera_fps:g} frames/s"
        if not self.behind:
            return f"keeps up: {rate} ({100 * self.share:.0f} %)"
        every = 1.0 / self.share if self.share > 0 else float("inf")
        return (
            f"BEHIND the camera: {rate} ({100 * self.share:.0f} %); {self.stale} frames "
            f"skipped as stale, tracks and rules see about every {every:.1f}th frame"
        )

    def numbers(self) -> dict[str, float | int | bool]:
        """For summary.json."""
        return {
            "camera_fps": self.camera_fps,
            "analysed_fps": round(self.analysed_fps, 2),
            "share": round(self.share, 3),
            "behind": self.behind,
            "stale": self.stale,
        }


def pace_of(frames: int, ran_s: float, camera_fps: float, stale: int) -> Pace:
    """The edge's pace over a run of `ran_s` seconds."""
    return Pace(camera_fps, frames / max(ran_s, 1e-6), stale)


def latency_text(values: Sequence[float]) -> str:
    """`p50 / p95 / p99 ms (n)` of latencies in ms."""
    if not values:
        return "n/a (none)"
    p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
    return f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms  ({len(values)} samples)"


@dataclass
class Report:
    """The summary's lines, what failed, and the numbers (also written as JSON)."""

    lines: list[str]
    problems: list[str]
    numbers: dict[str, Any]

    @classmethod
    def written(
        cls, out: Path, lines: list[str], problems: list[str], numbers: dict[str, Any]
    ) -> Report:
        """The report, with `numbers` written to `out/summary.json` and a line saying where."""
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(numbers, indent=1))
        lines.append(f"  numbers: {out / 'summary.json'}")
        return cls(lines, problems, numbers)


def reasons_line(hard: dict[str, int], sent: dict[str, int]) -> str:
    """Hard frames per reason, most first, with how many of them were sent: a frame counts
    under each of its reasons (`refresh`: the periodic whole frame)."""
    if not hard:
        return "none"
    ordered = sorted(hard.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{reason} {n} ({sent.get(reason, 0)})" for reason, n in ordered)


def add_cloud_rows(t: SummaryTable, agent: EdgeAgent, frames: int, stream_bytes: float) -> None:
    """The `cloud escalation` section: hard frames, share escalated, answers, bytes, fusion."""
    esc = agent.escalation.counters if agent.escalation is not None else None
    worker = agent.workers[0]
    t.section("cloud escalation")
    if esc is not None:
        sent, bytes_sent = esc.sent, esc.bytes_sent
        t.add("hard frames", f"{esc.hard} ({esc.refused_budget} over budget)")
        t.add("why hard (sent)", reasons_line(esc.hard_reasons, esc.sent_reasons))
        t.add("escalated", f"{sent} frames = {100.0 * sent / max(frames, 1):.1f}% of analysed")
        t.add("answers", f"{esc.answered} answered, {esc.failed} failed, {esc.dropped_busy} busy")
        t.add(
            "bytes sent to cloud",
            f"{bytes_sent / 1024:.0f} KiB ({bytes_sent / max(sent, 1) / 1024:.1f} KiB/frame; "
            f"{100.0 * bytes_sent / max(stream_bytes, 1):.1f}% of the camera's H.264 stream)",
        )
        stage = agent.escalation
        if stage is not None:
            up = stage.uplinks.counters
            t.add(
                "uplink encoding",
                f"{up.video_frames} frames as {stage.config.uplink.codec} "
                f"({up.keyframes} keyframes, {up.keyframes_asked} asked for), "
                f"{up.jpeg_not_announced + up.jpeg_encoder_failed} whole frames as JPEG "
                f"(replica without the codec: {up.jpeg_not_announced}, encoder failed: "
                f"{up.jpeg_encoder_failed})",
            )
    f = worker.counters.fusion
    t.add("answers fused", f"{f.answers} ({f.late} too late)")
    t.add("tracks by fusion", f"{f.confirmed} confirmed, {f.reclassified} reclassified, "
          f"{f.rejected} rejected, {f.removed} removed, {f.created} created")  # fmt: skip
    agreement = worker.cloud_trust.agreement
    if agreement is not None:
        t.add("cloud agreement", f"{100.0 * agreement:.0f}% of sure edge tracks seen by the "
              f"cloud ({worker.cloud_trust.checked} checked)")  # fmt: skip


def video_lines(video: AnnotatedVideoWriter | None) -> list[str]:
    """The `annotated video` lines of the summary."""
    text = "not written (--no-video)"
    if video is not None:
        text = f"{video.path} ({video.frames_written} frames"
        text += f", {video.frames_dropped} dropped)" if video.frames_dropped else ")"
    return ["-- annotated video", f"  {text}"]
