"""End-to-end latency of the edge agent at steady state, bucketed over time, with its memory.

    python -m bench.edge.edge_latency_soak [--cameras 1,4] [--duration-s 600 | --quick]
        [--bucket-s 60] [--model litert-int8|onnx] [--threads 2] [--embedder histogram|none]
        [--target-fps 25] [--shared-server]

Real pieces: one GStreamer RTSP server per camera (testbed/rtsp_server.py under the system
python, looping the `events` scene forever; `--shared-server`: all cameras on one mount), a
real Mosquitto, and the agent (`EdgeAgent.run`) in a child process of its own, so its RSS is
its own. A separate paho subscriber in this process receives the alerts.

Measured per time bucket (`--bucket-s`, default 60 s; `--quick`: 60 s run, 10 s buckets):
- frame latency: capture (wall time stamped when the frame was decoded) → outcome ready (the
  agent's outcome hook, after tracking, rules and the outbox write), p50/p99/max, and where the
  time went (mean detect / track / rules ms; the rest is waiting in the slot and for the batch);
- alert latency: the payload's `timestamp` (its frame's capture time) → received by the
  subscriber, p50/p99/max (millisecond resolution of the timestamp);
- the agent's RSS and threads at the end of the bucket, the frames analysed (and per detector
  batch), the 1-minute load average (the machine is shared: read latencies against it), and
  those dropped in the newest-frame slot (the agent was busy) or skipped by the frame-rate
  limiter.
Flat p50/p99 and RSS across buckets mean no build-up and no leak.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from bench.edge._edge_common import (
    REPO_ROOT,
    agent_config,
    embedder_named,
    ensure_scene,
    rss_mib,
    temp_dir,
)
from edge_agent.config import EdgeAgentConfig
from testbed.demo_report import percentile

logger = logging.getLogger(__name__)

CHILD_GRACE_S = 60.0  # start-up (model load, RTSP open) and close (outbox flush) of the child
CONNECT_TIMEOUT_S = 10.0


# ---- the agent, in the child process ------------------------------------------------------


@dataclass
class _Bucket:
    latencies_s: list[float] = field(default_factory=list)
    detect_s: float = 0.0
    track_s: float = 0.0
    rules_s: float = 0.0


def _proc_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run_agent(config_path: Path, embedder: str, duration_s: float, bucket_s: float) -> int:
    """The child: run the agent for `duration_s`, one JSON line of stats per bucket on stdout."""
    from edge_agent.pipeline import EdgeAgent, FrameOutcome

    config = EdgeAgentConfig.model_validate_json(config_path.read_text())
    # as production builds it (the detector down to the tracker's low-score threshold)
    agent = EdgeAgent.from_config(config, embedder=embedder_named(embedder))
    publisher = agent.publisher
    bucket = _Bucket()
    lock = threading.Lock()

    def on_outcome(outcome: FrameOutcome) -> None:
        latency = time.time() - outcome.frame.capture_time_s
        with lock:
            bucket.latencies_s.append(latency)
            bucket.detect_s += outcome.detect_s
            bucket.track_s += outcome.track_s
            bucket.rules_s += outcome.rules_s

    agent.hooks.append(on_outcome)
    agent.start()
    if not publisher.wait_connected(CONNECT_TIMEOUT_S):
        logger.warning("agent not connected to the broker after %s s", CONNECT_TIMEOUT_S)
    t0 = time.time()
    _emit({"type": "start", "t0": t0, "rss_mib": rss_mib(), "threads": _proc_threads()})
    stop = threading.Event()
    index = 0

    def close_bucket() -> None:
        nonlocal bucket, index
        with lock:
            done, bucket = bucket, _Bucket()
        n = len(done.latencies_s)
        stats = [w.source.stats() for w in agent.workers]
        _emit(
            {
                "type": "bucket",
                "index": index,
                "frames": n,
                "p50_ms": percentile(done.latencies_s, 50) * 1e3,
                "p99_ms": percentile(done.latencies_s, 99) * 1e3,
                "max_ms": max(done.latencies_s, default=math.nan) * 1e3,
                "detect_ms": done.detect_s / n * 1e3 if n else math.nan,
                "track_ms": done.track_s / n * 1e3 if n else math.nan,
                "rules_ms": done.rules_s / n * 1e3 if n else math.nan,
                "captured": sum(s.frames for s in stats),
                "slot_drops": sum(s.drops for s in stats),
                "skipped_rate": sum(w.counters.skipped_rate for w in agent.workers),
                "reconnects": sum(s.reconnects for s in stats),
                "events": sum(w.counters.events for w in agent.workers),
                "batches": agent.batches,
                "loadavg": Path("/proc/loadavg").read_text().split()[0],
                "outbox_depth": publisher.outbox.depth(),
                "rss_mib": rss_mib(),
                "threads": _proc_threads(),
            }
        )
        index += 1

    def on_idle() -> None:
        now = time.time()
        if now - t0 >= (index + 1) * bucket_s:
            close_bucket()
        if now - t0 >= duration_s:
            stop.set()

    try:
        agent.run(stop, on_idle=on_idle)
        _emit({"type": "stopping", "t": time.time()})
    finally:
        agent.close()
    return 0


# ---- the soak, in the parent process ------------------------------------------------------


@dataclass
class _Alert:
    received_s: float
    latency_s: float
    phase: str


class AlertSubscriber:
    """Receives the agent's alerts (QoS 1) and records their latency from the payload time."""

    def __init__(self, host: str, port: int, topic: str) -> None:
        self.alerts: list[_Alert] = []
        self.malformed = 0
        self._topic = topic
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-alert-subscriber")
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.connect(host, port)
        self.client.loop_start()
        if not self._subscribed.wait(CONNECT_TIMEOUT_S):
            raise RuntimeError(f"subscriber not subscribed to {topic} after {CONNECT_TIMEOUT_S} s")

    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: object,
        _flags: mqtt.ConnectFlags,
        reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            logger.error("subscriber connect failed: %s", reason)
            return
        client.subscribe(self._topic, qos=1)

    def _on_subscribe(
        self,
        _client: mqtt.Client,
        _userdata: object,
        _mid: int,
        reasons: list[ReasonCode],
        _properties: Properties | None,
    ) -> None:
        if not any(r.is_failure for r in reasons):
            self._subscribed.set()

    def _on_message(self, _client: mqtt.Client, _userdata: object, msg: mqtt.MQTTMessage) -> None:
        received = time.time()
        try:
            payload = json.loads(msg.payload)
            stamp = datetime.fromisoformat(str(payload["timestamp"]).replace("Z", "+00:00"))
        except (ValueError, KeyError):
            self.malformed += 1
            return
        self.alerts.append(
            _Alert(received, received - stamp.timestamp(), str(payload.get("phase")))
        )

    def close(self) -> None:
        """Disconnect."""
        self.client.disconnect()
        self.client.loop_stop()


def _start_servers(clip: Path, cameras: int, shared: bool) -> list[Any]:
    from testbed.rtsp_camera import RtspServer

    servers = [RtspServer(clip) for _ in range(1 if shared else cameras)]
    for server in servers:
        server.start()
    return servers


def _read_child(process: subprocess.Popen[str], records: list[dict[str, Any]]) -> None:
    assert process.stdout is not None  # Popen(stdout=PIPE)
    for line in process.stdout:
        if line.startswith("{"):
            records.append(json.loads(line))
        else:
            sys.stderr.write(f"[agent] {line}")


def soak(args: argparse.Namespace, cameras: int) -> tuple[list[dict[str, Any]], AlertStats]:
    """Run one soak with `cameras` cameras; the child's records and the alerts received."""
    from testbed.broker import start_broker

    scene = ensure_scene(args.scene_dir)
    with temp_dir("edge-soak-") as tmp:
        work = Path(tmp)
        broker = start_broker("mosquitto", work)
        servers = _start_servers(scene / "video.mp4", cameras, args.shared_server)
        try:
            urls = [servers[0 if args.shared_server else i].url for i in range(cameras)]
            config = agent_config(
                scene,
                camera_urls=urls,
                model=args.model,
                threads=args.threads,
                embedder=args.embedder,
                target_fps=args.target_fps,
                mqtt_port=broker.port,
                outbox_path=work / "outbox.sqlite",
            )
            config_path = work / "agent.json"
            config_path.write_text(config.model_dump_json())
            topic = f"{config.mqtt.topic_prefix}/{config.agent.id}/events/#"
            subscriber = AlertSubscriber(broker.host, broker.port, topic)
            records: list[dict[str, Any]] = []
            command = [sys.executable, "-m", "bench.edge.edge_latency_soak", "--role", "agent"]
            command += ["--config", str(config_path), "--embedder", args.embedder]
            command += ["--duration-s", str(args.duration_s), "--bucket-s", str(args.bucket_s)]
            process = subprocess.Popen(  # noqa: S603 (this module)
                command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
            )
            reader = threading.Thread(target=_read_child, args=(process, records), daemon=True)
            reader.start()
            try:
                process.wait(timeout=args.duration_s + CHILD_GRACE_S)
            finally:
                if process.poll() is None:
                    process.kill()
                reader.join(timeout=5.0)
                subscriber.close()
        finally:
            for server in servers:
                server.stop()
            broker.stop()
    if process.returncode != 0:
        raise RuntimeError(f"the agent exited with status {process.returncode}")
    return records, AlertStats.from_alerts(subscriber, records, args.bucket_s)


@dataclass
class AlertStats:
    """Alert latencies per bucket, counted from the agent's `t0` up to its `stopping`."""

    per_bucket: dict[int, list[float]]
    after_stop: int
    malformed: int

    @classmethod
    def from_alerts(
        cls, subscriber: AlertSubscriber, records: list[dict[str, Any]], bucket_s: float
    ) -> AlertStats:
        """Bucket the subscriber's alerts by receipt time."""
        t0 = next(r["t0"] for r in records if r["type"] == "start")
        stop = next((r["t"] for r in records if r["type"] == "stopping"), math.inf)
        per_bucket: dict[int, list[float]] = {}
        after = 0
        for alert in subscriber.alerts:
            if alert.received_s >= stop:
                after += 1  # `close()` ending lasting events: stamped with an older frame
                continue
            index = max(0, int((alert.received_s - t0) // bucket_s))
            per_bucket.setdefault(index, []).append(alert.latency_s)
        return cls(per_bucket, after, subscriber.malformed)


def _ms(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"


def print_tables(
    cameras: int, records: list[dict[str, Any]], alerts: AlertStats, args: argparse.Namespace
) -> None:
    """The per-bucket table of one soak and a summary line."""
    start = next(r for r in records if r["type"] == "start")
    buckets = [r for r in records if r["type"] == "bucket"]
    print(
        f"\n### {cameras} camera(s), {args.model}, {args.embedder} embedder, "
        f"{args.threads} threads, target {args.target_fps:g} fps, {args.duration_s:g} s\n"
    )
    print(
        "| bucket | frames | fps/cam | frame p50 ms | p99 | max | detect/track/rules ms "
        "| alerts | alert p50 ms | p99 | max | slot drops | rate skips | frames/batch | RSS MiB "
        "| threads | load 1 min |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    previous: dict[str, Any] = {"slot_drops": 0, "skipped_rate": 0, "batches": 0}
    for b in buckets:
        lat = alerts.per_bucket.get(b["index"], [])
        end_s = (b["index"] + 1) * args.bucket_s
        stages = f"{_ms(b['detect_ms'])}/{_ms(b['track_ms'])}/{_ms(b['rules_ms'])}"
        print(
            f"| {b['index'] * args.bucket_s:g}–{end_s:g} s | {b['frames']} "
            f"| {b['frames'] / args.bucket_s / cameras:.1f} "
            f"| {_ms(b['p50_ms'])} | {_ms(b['p99_ms'])} | {_ms(b['max_ms'])} | {stages} "
            f"| {len(lat)} | {_ms(percentile(lat, 50) * 1e3)} | {_ms(percentile(lat, 99) * 1e3)} "
            f"| {_ms(max(lat, default=math.nan) * 1e3)} "
            f"| {b['slot_drops'] - previous['slot_drops']} "
            f"| {b['skipped_rate'] - previous['skipped_rate']} "
            f"| {b['frames'] / max(1, b['batches'] - previous['batches']):.2f} "
            f"| {b['rss_mib']:.1f} | {b['threads']} | {b['loadavg']} |"
        )
        previous = b
    if not buckets:
        print("(no bucket completed)")
        return
    last = buckets[-1]
    first_full = buckets[1] if len(buckets) > 1 else buckets[0]
    print(
        f"\nRSS: {start['rss_mib']:.1f} MiB at start, {first_full['rss_mib']:.1f} after bucket "
        f"{first_full['index']}, {last['rss_mib']:.1f} at the end "
        f"({last['rss_mib'] - first_full['rss_mib']:+.1f} MiB since). "
        f"Captured {last['captured']}, analysed {sum(b['frames'] for b in buckets)}, "
        f"slot drops {last['slot_drops']}, rate skips {last['skipped_rate']}, reconnects "
        f"{last['reconnects']}, events {last['events']}, outbox depth at the end "
        f"{last['outbox_depth']}; alerts after stop {alerts.after_stop}, "
        f"malformed {alerts.malformed}."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the soaks (or, with `--role agent`, the agent child) and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", default="1,4", help="comma-separated camera counts")
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--bucket-s", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="60 s run, 10 s buckets")
    parser.add_argument("--model", choices=("litert-int8", "onnx"), default="litert-int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embedder", choices=("none", "histogram"), default="histogram")
    parser.add_argument("--target-fps", type=float, default=25.0)
    parser.add_argument("--shared-server", action="store_true", help="one RTSP mount for all")
    parser.add_argument("--scene-dir", type=Path, default=None, help="an events scene folder")
    parser.add_argument("--role", choices=("soak", "agent"), default="soak", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.bucket_s = 60.0, 10.0
    if args.role == "agent":
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        return run_agent(args.config, args.embedder, args.duration_s, args.bucket_s)
    logging.basicConfig(level=logging.WARNING)
    counts = [int(c) for c in args.cameras.split(",")]
    print(
        "Edge agent soak: RTSP → agent (child process) → Mosquitto → subscriber; "
        f"{'one shared RTSP mount' if args.shared_server else 'one RTSP server per camera'}."
    )
    for cameras in counts:
        records, alerts = soak(args, cameras)
        print_tables(cameras, records, alerts, args)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
