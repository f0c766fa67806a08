"""Fleet-scale load test: real cloud replicas behind the real Envoy, many cameras, faults mid-run.

    python -m bench.cloud.fleet_load            # ~4 min: both engines, every scenario
    python -m bench.cloud.fleet_load --quick    # ~1 min: shorter phases

Everything is a real process on loopback: N `cloud-service serve` replicas, the shipped Envoy
config (`deploy/envoy/envoy.yaml`, pointed at the replicas by `testbed.envoy`) in front, and 8 edge
agents' escalation paths in this process: each agent is the real `EscalationClient` (one gRPC
stream, rotation on GOAWAY, resend on a broken stream) behind the real `EscalationBudget` (token
buckets + AIMD on round trip, queue time and overload answers, and the window on frames in
flight that slow-starts on each stream), offering frames of 8 cameras.

Two engines:
- `fast`: a trivial ONNX detector (64x64 input, one constant box), so what is measured is the
  serving path itself: gRPC through Envoy, JPEG decoding, batching, balancing, answering;
- `model`: the committed COCO cloud detector of `configs/cloud-service.cpu.yaml`.

Scenarios (per engine where it makes sense):
- `nominal`: 64 cameras at 2 frames/s (128 frames/s offered) on 2 replicas;
- `capacity` (fast): the cameras' rate raised until the answered rate stops following, to find
  the frames/s the serving path sustains on this machine (target: 3x what 50 cameras at 2
  frames/s need, 300 frames/s);
- `overload` (model): the offered rate at 2x what the replicas answer, to see the edge's AIMD
  settle, p99 stay below the deadline and every frame get exactly one answer or status;
- `faults` (fast): 2 replicas, one killed with SIGKILL mid-run, a third started later; the
  replicas' `max_connection_age_s` is short so streams re-balance within the run.

Writes `bench/results/fleet_load.{md,json,png}` (the picture: frames/s per replica over time in
the fault run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from edge_agent.config.escalation import CloudConnectionConfig, EscalationConfig
from edge_agent.escalation.budget import EscalationBudget
from edge_agent.escalation.client import EscalationClient, EscalationResult
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds
from testbed.envoy import (
    RunningEnvoy,
    running_envoy,
    wait_for_healthy_upstreams,
    write_envoy_config,
)
from testbed.processes import ManagedProcess, free_tcp_port, tcp_port_accepts

MODEL_CONFIG = REPO_ROOT / "configs" / "cloud-service.cpu.yaml"
AGENTS = 8
CAMERAS_PER_AGENT = 8
CAMERA_FPS = 2.0
DEADLINE_MS = 500
TARGET_SERVING_FPS = 3 * 50 * CAMERA_FPS  # 3x what 50 cameras at 2 frames/s need
SHARE_TOLERANCE = 0.15
KILL_AT, ADD_AT = 0.25, 0.4  # of the fault run
HEALTH_CHECK_S = 2.0  # Envoy's health-check interval in deploy/envoy/envoy.yaml
_FRAMES_TOTAL = re.compile(r"^cloud_service_frames_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


# -- engines -----------------------------------------------------------------------------------


def trivial_detector(path: Path, classes: Sequence[str] = ("person", "car")) -> Path:
    """An ONNX 'detector' with a 64x64 input whose output is one constant box per image.

    The output has the YOLOv5 layout (batch, boxes, 5 + classes) and the class names are in
    the model's metadata, so the cloud service loads it like any exported detector.
    """
    k = 5 + len(classes)
    row = [16.0, 16.0, 24.0, 24.0, 0.9] + [0.9] + [0.0] * (len(classes) - 1)
    const = helper.make_tensor("box", TensorProto.FLOAT, [1, 1, k], row)
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=1, axes=[1, 2, 3]),
        helper.make_node(
            "Constant",
            [],
            ["shape"],
            value=helper.make_tensor("s", TensorProto.INT64, [3], [-1, 1, 1]),
        ),
        helper.make_node("Reshape", ["mean", "shape"], ["mean3"]),
        helper.make_node(
            "Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])
        ),
        helper.make_node("Mul", ["mean3", "zero"], ["zeros"]),
        helper.make_node("Constant", [], ["boxes"], value=const),
        helper.make_node("Add", ["zeros", "boxes"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "trivial-detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 1, k])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"class_names": json.dumps(list(classes))})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def replica_config(
    engine: str, port: int, metrics_port: int, work: Path, *, max_connection_age_s: float
) -> dict[str, Any]:
    """The cloud-service config of one replica: the shipped CPU config with `engine` swapped."""
    config: dict[str, Any] = yaml.safe_load(MODEL_CONFIG.read_text())
    config["server"].update(
        listen_address=f"127.0.0.1:{port}",
        max_connection_age_s=max_connection_age_s,
        max_connection_age_grace_s=max(1.0, max_connection_age_s / 2),
        grace_period_s=2.0,
    )
    config["metrics"] = {"listen_port": metrics_port, "listen_host": "127.0.0.1"}
    runtime = config["engine"]["runtime"]
    # replicas, Envoy and the agents share this machine's cores: one ONNX Runtime thread per
    # replica, and no idle spinning (ONNX Runtime's default spins for work and starves the rest)
    runtime.update(intra_op_threads=1, allow_spinning=False)
    if engine == "fast":
        model = work / "trivial-detector.onnx"
        if not model.exists():
            trivial_detector(model)
        config["engine"]["runtime"]["model_path"] = str(model)
        config["engine"]["input_size"] = [64, 64]
        config["batching"].update(max_batch_size=16, max_queue_delay_ms=2)
    else:
        runtime["model_path"] = str(REPO_ROOT / runtime["model_path"])
    config["batching"]["per_stream_queue_frames"] = 64
    return config


@dataclass
class Replica:
    """One `cloud-service serve` process and its metrics port."""

    name: str
    port: int
    metrics_port: int
    process: ManagedProcess

    def answered(self) -> float:
        """Frames this replica has answered (its `cloud_service_frames_total`), 0 when down."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=1.0) as reply:  # noqa: S310 - loopback
                text = reply.read().decode()
        except OSError:
            return float("nan")
        return sum(float(v) for v in _FRAMES_TOTAL.findall(text))


def start_replica(name: str, engine: str, port: int, work: Path, age_s: float) -> Replica:
    """Start one replica on `port` and wait until it accepts connections."""
    metrics_port = free_tcp_port()
    config = replica_config(engine, port, metrics_port, work, max_connection_age_s=age_s)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = ["python", "-m", "cloud_service", "serve", "--config", str(path)]
    process = ManagedProcess(name, argv, ready_check=lambda: tcp_port_accepts("127.0.0.1", port))
    process.start(ready_timeout_s=60.0)
    return Replica(name, port, metrics_port, process)


# -- the simulated fleet -----------------------------------------------------------------------


@dataclass
class Ledger:
    """Every frame submitted and every result delivered, to check 'exactly one answer'."""

    submitted: set[str] = field(default_factory=set)
    results: dict[str, list[EscalationResult]] = field(default_factory=lambda: defaultdict(list))
    answered_at: list[tuple[float, float]] = field(default_factory=list)  # (time, rtt)
    refused_budget: int = 0
    refused_client: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def deliver(self, result: EscalationResult) -> None:
        with self.lock:
            self.results[result.request_id].append(result)
            if result.rtt_s is not None and result.ok:  # latency of frames answered with boxes
                self.answered_at.append((time.monotonic(), result.rtt_s))


class Agent:
    """One edge agent's escalation path: budget (AIMD) + client, for `CAMERAS_PER_AGENT` cameras."""

    def __init__(
        self, index: int, target: str, ledger: Ledger, camera_fps: float, window: bool = True
    ) -> None:
        self.name = f"agent-{index:02d}"
        self.window = window  # False: the agent before its window on frames in flight
        self.cameras = [f"cam-{index:02d}-{c}" for c in range(CAMERAS_PER_AGENT)]
        self.camera_fps = camera_fps
        self.config = EscalationConfig(
            enabled=True,
            cloud_address=target,
            per_camera_frames_per_s=max(CAMERA_FPS, camera_fps),
            per_agent_frames_per_s=max(CAMERA_FPS, camera_fps) * CAMERAS_PER_AGENT,
            per_camera_bytes_per_s=10**8,
            per_agent_bytes_per_s=10**9,
            deadline_ms=DEADLINE_MS,
            max_in_flight=64,
            connection=CloudConnectionConfig(send_queue_frames=64, reconnect_min_backoff_ms=100),
        )
        self.ledger = ledger
        self.budget = EscalationBudget.from_config(self.config, time.monotonic())
        self.multipliers: list[tuple[float, float]] = []
        self._budget_lock = threading.Lock()
        self.client = EscalationClient(self.config, self.name, on_result=self._on_result)

    def _on_result(self, result: EscalationResult) -> None:
        self.ledger.deliver(result)
        with self._budget_lock:
            self.budget.observe(
                time.monotonic(),
                rtt_s=result.rtt_s,
                queue_time_ms=result.queue_time_ms,
                overloaded=result.overloaded or result.result is None,
                answered=result.ok,
            )

    def run(self, jpeg: bytes, stop: threading.Event) -> None:
        """Offer one frame per camera every 1/fps s (spread over the period) until `stop`."""
        period = 1.0 / (self.camera_fps * len(self.cameras))
        frame, next_at = 0, time.monotonic()
        while not stop.is_set():
            for camera in self.cameras:
                next_at += period
                delay = next_at - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
                frame += 1
                now = time.monotonic()
                with self._budget_lock:
                    self.budget.follow_stream(self.client.stream_id)  # as the agent's stage
                    in_flight = self.client.in_flight if self.window else 0
                    granted = not self.budget.refuses_frame(
                        camera, now, in_flight
                    ) and self.budget.try_acquire(camera, len(jpeg), now)
                    if len(self.multipliers) == 0 or now - self.multipliers[-1][0] > 0.5:
                        self.multipliers.append((now, self.budget.rate_multiplier(now)))
                if not granted:
                    with self.ledger.lock:
                        self.ledger.refused_budget += 1
                    continue
                request = pb.FrameRequest(
                    agent_id=self.name,
                    camera_id=camera,
                    frame_id=frame,
                    request_id=f"{self.name}/{camera}/{frame}",
                    jpeg=jpeg,
                )
                request.capture_time.CopyFrom(timestamp_from_seconds(time.time()))
                request.deadline.CopyFrom(timestamp_from_seconds(time.time() + DEADLINE_MS / 1e3))
                if self.client.submit(request):
                    with self.ledger.lock:
                        self.ledger.submitted.add(request.request_id)
                else:
                    with self.ledger.lock:
                        self.ledger.refused_client += 1


# -- one run -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one scenario measured."""

    name: str
    engine: str
    replicas: int
    seconds: float
    offered_fps: float
    submitted: int
    answered_ok: int
    answered_fps: float
    p50_ms: float
    p99_ms: float
    resource_exhausted: int
    other_status: dict[str, int]
    failed_locally: int
    no_result: int
    duplicates: int
    refused_budget: int
    refused_client: int
    replica_share: dict[str, float]
    share_max_dev: float
    aimd_multiplier_end: float
    aimd_multiplier_min: float
    rotations: int
    resent: int
    settled_at: float
    cpu_ms_per_frame: dict[str, float] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)


def _frame_jpeg(engine: str) -> bytes:
    """A real street frame (ultralytics' bus.jpg), at the size a camera would send."""
    import ultralytics

    path = Path(ultralytics.__file__).parent / "assets" / "bus.jpg"
    image = cv2.imread(str(path))
    if image is None:
        raise FileNotFoundError(path)
    image = cv2.resize(image, (640, 360) if engine == "fast" else (960, 540))
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok  # noqa: S101 - a resize of a real image always encodes
    return bytes(data)


@dataclass
class Cluster:
    """Replicas behind Envoy: the target agents use, the replicas, ports Envoy knows that nothing
    serves yet, and Envoy itself."""

    target: str
    replicas: list[Replica]
    spare_ports: list[int]
    envoy: RunningEnvoy


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the agents, the load generator)."""
    times = os.times()
    return times.user + times.system


@contextmanager
def _cluster(
    engine: str, replicas: int, work: Path, age_s: float, spare: int = 0
) -> Iterator[Cluster]:
    """`replicas` running replicas (+ `spare` ports Envoy knows but nothing serves yet) behind
    Envoy."""
    ports = [free_tcp_port() for _ in range(replicas + spare)]
    with ExitStack() as stack:
        running = [
            start_replica(f"r{i}", engine, p, work, age_s) for i, p in enumerate(ports[:replicas])
        ]
        for replica in running:
            stack.callback(replica.process.stop)
        listen, admin = free_tcp_port(), free_tcp_port()
        config = write_envoy_config(
            work / "envoy.yaml",
            listen_port=listen,
            admin_port=admin,
            upstreams=[("127.0.0.1", p) for p in ports],
        )
        envoy = stack.enter_context(running_envoy(config))
        wait_for_healthy_upstreams(envoy.admin_port, replicas, timeout_s=30.0)
        yield Cluster(f"127.0.0.1:{listen}", running, ports[replicas:], envoy)


def run_scenario(
    name: str,
    engine: str,
    work: Path,
    *,
    replicas: int = 2,
    seconds: float = 20.0,
    camera_fps: float = CAMERA_FPS,
    age_s: float = 300.0,
    faults: bool = False,
    agents_n: int = AGENTS,
    window: bool = True,
) -> RunResult:
    """Run one scenario end to end and measure it (`window` False: agents without their window
    on frames in flight, as before it).

    `faults`: one spare port in Envoy's cluster; replica r0 is killed (SIGKILL) at 25 % of the
    run and a new replica starts on the spare port at 40 %. The share is then judged from one
    `age_s` (+ one Envoy health-check interval, 2 s) after the new replica serves.
    """
    ledger = Ledger()
    jpeg = _frame_jpeg(engine)
    with _cluster(engine, replicas, work, age_s, spare=1 if faults else 0) as cluster:
        target, running, spare = cluster.target, cluster.replicas, cluster.spare_ports
        agents = [Agent(i, target, ledger, camera_fps, window) for i in range(agents_n)]
        for agent in agents:
            agent.client.start()
        for agent in agents:
            agent.client.wait_connected(10.0)
        stop = threading.Event()
        threads = [threading.Thread(target=a.run, args=(jpeg, stop), daemon=True) for a in agents]
        started = time.monotonic()
        cpu_start = {
            "replicas": sum(cpu_seconds(r.process.pid) for r in running),
            "envoy": cpu_seconds(cluster.envoy.process.pid),
            "agents": own_cpu_seconds(),
        }
        for thread in threads:
            thread.start()
        timeline: list[dict[str, float]] = []
        base = {r.name: r.answered() for r in running}
        last = dict(base)
        killed = added = False
        added_at = float("nan")
        extra: list[Replica] = []
        while time.monotonic() - started < seconds:
            time.sleep(1.0)
            t = time.monotonic() - started
            if faults and not killed and t >= seconds * KILL_AT:
                running[0].process.kill()
                killed = True
            if faults and not added and t >= seconds * ADD_AT:
                extra.append(start_replica("r-new", engine, spare[0], work, age_s))
                added_at = time.monotonic() - started
                base["r-new"] = 0.0
                last["r-new"] = 0.0
                added = True
            t = time.monotonic() - started  # starting a replica above takes seconds
            span = max(1e-3, t - (timeline[-1]["t"] if timeline else 0.0))
            point: dict[str, float] = {"t": round(t, 1)}
            for replica in [*running, *extra]:
                now_count = replica.answered()
                if now_count == now_count:  # not NaN: the replica is up; frames per second
                    point[replica.name] = (now_count - last.get(replica.name, 0.0)) / span
                    last[replica.name] = now_count
                else:
                    point[replica.name] = 0.0
            timeline.append(point)
        stop.set()
        for thread in threads:
            thread.join(5.0)
        elapsed = time.monotonic() - started
        cpu_used = {
            "replicas": sum(cpu_seconds(r.process.pid) for r in [*running, *extra]),
            "envoy": cpu_seconds(cluster.envoy.process.pid),
            "agents": own_cpu_seconds(),
        }
        cpu_used = {k: v - cpu_start[k] for k, v in cpu_used.items()}
        time.sleep(DEADLINE_MS / 1e3 + 2.5)  # every frame: its answer or its local failure
        totals = {r.name: last[r.name] - base[r.name] for r in [*running, *extra]}
        for agent in agents:
            agent.client.close()
        for replica in extra:
            replica.process.stop()
    settled = added_at + age_s + HEALTH_CHECK_S if faults else 0.0
    result = _summarise(
        name, engine, replicas, elapsed, camera_fps, ledger, agents, totals, timeline, settled
    )
    frames = max(1, sum(len(v) for v in ledger.results.values()))
    result.cpu_ms_per_frame = {k: round(1e3 * v / frames, 2) for k, v in cpu_used.items()}
    return result


def _summarise(
    name: str,
    engine: str,
    replicas: int,
    elapsed: float,
    camera_fps: float,
    ledger: Ledger,
    agents: Sequence[Agent],
    totals: dict[str, float],
    timeline: list[dict[str, float]],
    settled_at: float,
) -> RunResult:
    """The run's numbers; the share is judged on the timeline from `settled_at` (0: all)."""
    faults = settled_at > 0
    codes: Counter[str] = Counter()
    failed_locally = duplicates = no_result = 0
    for rid in ledger.submitted:
        outcomes = ledger.results.get(rid, [])
        if not outcomes:
            no_result += 1
            continue
        duplicates += len(outcomes) - 1
        first = outcomes[0]
        if first.result is None:
            failed_locally += 1
        codes[first.code.name] += 1
    rtts = np.array([rtt for _, rtt in ledger.answered_at], np.float64) * 1e3
    ok = codes.get("OK", 0)
    total = sum(totals.values())
    # share among the replicas that were up for the whole run (the fault run compares the two
    # that end it: the survivor and the one added)
    compared = {k: v for k, v in totals.items() if not (faults and k == "r0")}
    share = {k: (v / total if total else 0.0) for k, v in totals.items()}
    compared_total = sum(compared.values())
    even = 1.0 / max(1, len(compared))
    if faults:  # once the added replica had one connection age to take its share
        tail = [p for p in timeline if p["t"] >= settled_at]
        sums = {k: sum(p.get(k, 0.0) for p in tail) for k in compared}
        tail_total = sum(sums.values())
        dev = max(abs(v / tail_total - even) / even for v in sums.values()) if tail_total else 1.0
    else:
        dev = (
            max(abs(v / compared_total - even) / even for v in compared.values())
            if compared_total
            else 1.0
        )
    multipliers = [m for a in agents for _, m in a.multipliers]
    ends = [a.multipliers[-1][1] for a in agents if a.multipliers]
    stats = [a.client.stats() for a in agents]
    return RunResult(
        name=name,
        engine=engine,
        replicas=replicas,
        seconds=round(elapsed, 1),
        offered_fps=len(agents) * CAMERAS_PER_AGENT * camera_fps,
        submitted=len(ledger.submitted),
        answered_ok=ok,
        answered_fps=round(ok / elapsed, 1),
        p50_ms=round(float(np.percentile(rtts, 50)), 1) if rtts.size else float("nan"),
        p99_ms=round(float(np.percentile(rtts, 99)), 1) if rtts.size else float("nan"),
        resource_exhausted=codes.get("RESOURCE_EXHAUSTED", 0),
        other_status={k: v for k, v in codes.items() if k not in ("OK", "RESOURCE_EXHAUSTED")},
        failed_locally=failed_locally,
        no_result=no_result,
        duplicates=duplicates,
        refused_budget=ledger.refused_budget,
        refused_client=ledger.refused_client,
        replica_share={k: round(v, 3) for k, v in share.items()},
        share_max_dev=round(dev, 3),
        aimd_multiplier_end=round(float(np.mean(ends)), 3) if ends else 1.0,
        aimd_multiplier_min=round(min(multipliers), 3) if multipliers else 1.0,
        rotations=sum(s.rotations for s in stats),
        resent=sum(s.resent for s in stats),
        settled_at=round(settled_at, 1),
        timeline=timeline,
    )


# -- report ------------------------------------------------------------------------------------


def _table(results: Sequence[RunResult]) -> str:
    head = (
        "| scenario | engine | offered f/s | answered f/s | p50 / p99 ms | RESOURCE_EXHAUSTED "
        "| other status | failed locally | no result | duplicates | per-replica share (max dev) "
        "| AIMD end (min) | CPU ms/frame replicas, Envoy, agents |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in results:
        shares = ", ".join(f"{k} {v:.2f}" for k, v in r.replica_share.items())
        other = ", ".join(f"{k} {v}" for k, v in r.other_status.items()) or "0"
        cpu = ", ".join(f"{v:.1f}" for v in r.cpu_ms_per_frame.values())
        rows.append(
            f"| {r.name} | {r.engine} | {r.offered_fps:.0f} | {r.answered_fps:.1f} | "
            f"{r.p50_ms:.0f} / {r.p99_ms:.0f} | {r.resource_exhausted} | {other} | "
            f"{r.failed_locally} | {r.no_result} | {r.duplicates} | {shares} "
            f"({r.share_max_dev:.0%}) | {r.aimd_multiplier_end:.2f} "
            f"({r.aimd_multiplier_min:.2f}) | {cpu} |"
        )
    return head + "\n".join(rows) + "\n"


def _plot(result: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({k for p in result.timeline for k in p if k != "t"})
    fig, ax = plt.subplots(figsize=(8, 3.5))
    t = [p["t"] for p in result.timeline]
    for name in names:
        ax.plot(t, [p.get(name, 0.0) for p in result.timeline], label=name)
    ax.axvline(result.seconds * KILL_AT, color="grey", ls="--", lw=0.8)
    ax.axvline(result.seconds * ADD_AT, color="grey", ls=":", lw=0.8)
    ax.axvline(result.settled_at, color="green", ls=":", lw=0.8)
    ax.set_xlabel("s (dashed: r0 killed; dotted: r-new started, then one connection age)")
    ax.set_ylabel("frames answered per s")
    ax.set_title("Per-replica frames/s behind Envoy, 64 cameras on 8 agent streams")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (~1 min)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "fleet_load")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    seconds = 8.0 if args.quick else 20.0
    results: list[RunResult] = []
    results.append(run_scenario("nominal", "fast", args.work, seconds=seconds))
    for factor in (2.0, 3.0) if args.quick else (2.0, 3.0, 4.0):
        fps = CAMERA_FPS * factor
        results.append(
            run_scenario(
                f"capacity x{factor:g}", "fast", args.work, seconds=seconds, camera_fps=fps
            )
        )
    # the same past capacity with agents that have no window on frames in flight (before it)
    fps = CAMERA_FPS * (3.0 if args.quick else 4.0)
    results.append(
        run_scenario(
            f"capacity x{fps / CAMERA_FPS:g}, no window",
            "fast",
            args.work,
            seconds=seconds,
            camera_fps=fps,
            window=False,
        )
    )
    results.append(
        run_scenario(
            "faults", "fast", args.work, seconds=2 * seconds, age_s=seconds / 4, faults=True
        )
    )
    nominal_model = run_scenario("nominal", "model", args.work, seconds=seconds)
    results.append(nominal_model)
    results.append(
        run_scenario("nominal, no window", "model", args.work, seconds=seconds, window=False)
    )
    # 2x overload: offer twice what the replicas answered at full rate
    capacity = max(1.0, nominal_model.answered_fps)
    over_fps = 2 * capacity / (AGENTS * CAMERAS_PER_AGENT)
    results.append(
        run_scenario("overload 2x", "model", args.work, seconds=seconds, camera_fps=over_fps)
    )
    table = _table(results)
    print(table)
    harness.write_results("fleet_load", table, [asdict(r) for r in results], args.out)
    fault = next(r for r in results if r.name == "faults")
    _plot(fault, args.out / "fleet_load.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
