"""Edge-agent frame-loop throughput against the bare detector, same model and threads.

    python -m bench.edge.edge_pipeline [--frames 360] [--chunk 30] [--threads 2]
        [--models litert-int8,onnx] [--embedders none,histogram] [--cameras 1,4] [--no-decode]
        [--escalation]

Frames: the `events` scene (640x360, 25 fps; generated once into .cache), fed as fast as the
loop takes them. Variants, run interleaved chunk by chunk (`--chunk` frames each) so that the
drift of this noisy machine hits them alike:
- bare: `Detector.detect` on the pre-decoded frames (one call of C frames for C cameras);
- pipeline: an `EdgeAgent` (tracker, rules, SQLite outbox, a real Mosquitto) without its capture
  threads: each frame goes straight into every camera's newest-frame slot, then `step(0)`. The
  frames carry the scene's own timestamps (25 fps), so rules see real time and the rate limiter
  (target 120 fps) drops nothing;
- pipeline+cloud (`--escalation`, pre-decoded frames only): the same agent with escalation on
  (the default `escalation:` settings: 2 frames/s per camera, regions on) to a real cloud
  service started in-process with the committed cloud model (ONNX Runtime, 1 thread, a free
  loopback port). The escalation stage's clock is the scene's, like the rules': the budget is
  spent per scene second, so the share of frames sent is the one a camera at 25 fps gets (the
  loop itself runs faster than real time, so the cloud sees more requests per wall second than
  it would, and its delays trip the AIMD back-off: the counters table gives the rate reached,
  sent frames per camera and scene second). After each of its chunks the bench waits, untimed
  and without stepping, until the cloud has answered what was sent, so that the cloud's work
  does not spill into the other variants' chunks; the answers are fused in the next chunk's
  steps (timed);
- the same two with decoding included: OpenCV decodes the H.264 file frame by frame.
Throughput is camera-frames per second (C cameras: C per scene frame). The goal is
pipeline/bare >= 0.9. Then where a pipeline frame's time goes (ms per camera-frame): the
detector (batch time shared by its frames), tracking, rules and the rest (slot, limiter,
outbox writes, status publishing, the loop itself).

With `--escalation`, the cost of escalation in the frame loop (the goal: within 5 % of
escalation off): pipeline+cloud against pipeline throughput, the wall time of one step (one
scene frame through `agent.step`, all cameras) at p50 and p95, the in-loop escalation work
(timed in the +cloud agent: the policy's decision on every frame, collecting and fusing the
answers), the same stage table for pipeline+cloud (its `other` column holds that work) and what
the +cloud agent's escalation did (frames sent, answers fused, answers too late to fuse). On
this 2-core machine the in-process cloud model, the JPEG encoder and the gRPC threads compete
with the loop for the same cores, so the ratio is a pessimistic bound: on a real edge device
the cloud runs elsewhere.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from bench.edge._edge_common import (
    agent_config,
    decode_all,
    embedder_named,
    ensure_scene,
    temp_dir,
)
from detection.detector import Detector
from edge_agent.capture import CapturedFrame
from edge_agent.config import EdgeAgentConfig, EscalationConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from edge_agent.pipeline.model_swap import load_detector
from testbed.demo_report import percentile

Image = npt.NDArray[np.uint8]
SCENE_FPS = 25.0
TARGET_FPS = 120.0  # above the scene's rate: the limiter must not drop a frame
CONNECT_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 10.0  # the cloud answering what a +cloud chunk sent
WARMUP_FRAMES = 5

logger = logging.getLogger(__name__)


def detector_for(config: EdgeAgentConfig) -> Detector:
    """The detector `EdgeAgent.from_config` builds: down to the tracker's low-score threshold."""
    return load_detector(config)


class FrameReader:
    """Frames of the scene in order, looping: pre-decoded, or decoded from the file per call."""

    def __init__(self, video: Path, decoded: list[Image] | None) -> None:
        self._video = video
        self._decoded = decoded
        self._capture: cv2.VideoCapture | None = None
        self._position = 0

    def next(self) -> Image:
        """The next frame (decoding it now unless pre-decoded)."""
        if self._decoded is not None:
            image = self._decoded[self._position % len(self._decoded)]
            self._position += 1
            return image
        if self._capture is None:
            self._capture = cv2.VideoCapture(str(self._video), cv2.CAP_FFMPEG)
        ok, raw = self._capture.read()
        if not ok:  # end of the clip: start over
            self._capture.release()
            self._capture = cv2.VideoCapture(str(self._video), cv2.CAP_FFMPEG)
            ok, raw = self._capture.read()
            if not ok:
                raise RuntimeError(f"cannot decode {self._video}")
        return np.asarray(raw, dtype=np.uint8)

    def close(self) -> None:
        """Release the decoder."""
        if self._capture is not None:
            self._capture.release()


@dataclass
class StageTotals:
    """Seconds spent per stage, summed over the analysed camera-frames."""

    frames: int = 0
    detect_s: float = 0.0
    track_s: float = 0.0
    rules_s: float = 0.0
    events: int = 0
    escalated: int = 0  # frames the escalation stage decided to send
    escalate_s: float = 0.0  # the escalation decision (policy) on each frame, in the loop
    fuse_s: float = 0.0  # fusing the cloud's answers into the tracks, in the loop

    def hook(self, cameras: int) -> Callable[[FrameOutcome], None]:
        """An outcome hook adding to these totals (a batch's detect time split over its frames)."""

        def add(outcome: FrameOutcome) -> None:
            self.frames += 1
            self.detect_s += outcome.detect_s / cameras
            self.track_s += outcome.track_s
            self.rules_s += outcome.rules_s
            self.events += len(outcome.events)
            self.escalated += int(outcome.escalated)
            self.escalate_s += outcome.escalate_s

        return add


@dataclass
class Runner:
    """One variant: feeds one scene frame (to every camera) per `feed`; times itself."""

    name: str
    reader: FrameReader
    feed: Callable[[Image, int], None]
    cameras: int
    elapsed_s: float = 0.0
    fed: int = 0
    stages: StageTotals | None = None
    timed_stages: StageTotals = field(default_factory=StageTotals)
    after_chunk: Callable[[], None] | None = None  # untimed, after every `run`
    step_s: list[float] = field(default_factory=list)  # wall time of each timed `feed`

    def run(self, frames: int, *, timed: bool = True) -> None:
        """Feed `frames` scene frames; when `timed`, add the wall time and stage totals."""
        before = StageTotals(**vars(self.stages)) if self.stages is not None else None
        steps: list[float] = []
        started = time.perf_counter()
        for _ in range(frames):
            step_started = time.perf_counter()
            self.feed(self.reader.next(), self.fed)
            steps.append(time.perf_counter() - step_started)
            self.fed += 1
        finished = time.perf_counter()
        if self.after_chunk is not None:
            self.after_chunk()
        if not timed:
            return
        self.elapsed_s += finished - started
        self.step_s.extend(steps)
        if self.stages is not None and before is not None:
            for key in vars(self.timed_stages):
                delta = getattr(self.stages, key) - getattr(before, key)
                setattr(self.timed_stages, key, getattr(self.timed_stages, key) + delta)

    @property
    def fps(self) -> float:
        """Camera-frames per second over the timed chunks."""
        timed_frames = (self.fed - WARMUP_FRAMES) * self.cameras
        return timed_frames / self.elapsed_s if self.elapsed_s > 0 else float("nan")


def bare_feed(detector: Detector, cameras: int) -> Callable[[Image, int], None]:
    """Detect on one frame per camera, in one call."""

    def feed(image: Image, _index: int) -> None:
        detector.detect([image] * cameras)

    return feed


class SceneClock:
    """Monotonic seconds on the scene's clock: the capture time of the frame being fed."""

    def __init__(self, base_s: float) -> None:
        self.base_s = base_s
        self.now_s = base_s

    def __call__(self) -> float:
        return self.now_s

    def wall(self, wall_base_s: float) -> Callable[[], float]:
        """The same clock in epoch seconds, `wall_base_s` at this clock's start."""
        return lambda: wall_base_s + (self.now_s - self.base_s)


@contextmanager
def pipeline_agent(
    config: EdgeAgentConfig, embedder: str, stages: StageTotals
) -> Iterator[tuple[EdgeAgent, Callable[[Image, int], None]]]:
    """An agent as production builds it (`EdgeAgent.from_config`: labels, webhook and media
    where `config` enables them), on the scene's clock, with no capture threads: `feed` fills
    the slots and steps. With `config.escalation` enabled it is connected to the cloud before
    this yields.
    """
    wall_base, mono_base = time.time(), time.monotonic()
    clock = SceneClock(mono_base)
    agent = EdgeAgent.from_config(
        config, embedder=embedder_named(embedder), clock=clock, wall_clock=clock.wall(wall_base)
    )
    escalation = agent.escalation
    missing = 0

    def feed(image: Image, index: int) -> None:
        nonlocal missing
        offset_s = index / SCENE_FPS  # the scene's clock: rules and tracks see real time
        clock.now_s = mono_base + offset_s
        for worker in agent.workers:
            frame = CapturedFrame(
                worker.name, index, wall_base + offset_s, mono_base + offset_s, image
            )
            worker.source.slot.put(frame)
        fused_s = sum(w.counters.fuse_s for w in agent.workers)
        missing += len(agent.workers) - agent.step(0.0)
        stages.fuse_s += sum(w.counters.fuse_s for w in agent.workers) - fused_s

    try:
        agent.hooks.append(stages.hook(len(agent.workers)))
        agent.start(capture=False)
        if not agent.publisher.wait_connected(CONNECT_TIMEOUT_S):
            raise RuntimeError(f"agent {config.agent.id} not connected to the broker")
        if escalation is not None:
            if not escalation.client.wait_connected(CONNECT_TIMEOUT_S):
                raise RuntimeError(f"agent {config.agent.id} not connected to the cloud")
        yield agent, feed
    finally:
        if missing:
            logging.getLogger(__name__).warning(
                "%s: %d frames not analysed", config.agent.id, missing
            )
        agent.close()


def settle_escalations(agent: EdgeAgent, stages: StageTotals) -> None:
    """Wait (no step) until every frame sent to the cloud is encoded, submitted and answered.

    The answers stay queued in the client: the next step fuses them.
    """
    stage = agent.escalation
    if stage is None:
        return
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        counters = stage.counters
        handled = counters.sent + counters.dropped_busy  # each sent decision ends as one of these
        if handled >= stages.escalated and stage.client.stats().in_flight == 0:
            return
        time.sleep(0.002)
    logger.warning(
        "%s: escalations still in flight after %.0f s", agent.config.agent.id, SETTLE_TIMEOUT_S
    )


@dataclass(frozen=True)
class EscalationTally:
    """What the +cloud agent's escalation did over the whole run (warm-up included)."""

    considered: int
    hard: int
    sent: int
    refused_budget: int
    dropped_busy: int
    offline: int
    answered: int
    failed: int
    fused: int
    late: int
    rtt_p50_ms: float
    sent_per_camera_s: float  # frames sent per camera and scene second (the budget: 2)

    @classmethod
    def of(cls, agent: EdgeAgent, scene_frames: int) -> EscalationTally:
        """The counters of `agent` (which has an escalation stage) after `scene_frames`."""
        stage = agent.escalation
        assert stage is not None
        c = stage.counters
        rtts = stage.client.stats().rtt_samples_s
        return cls(
            considered=c.considered,
            hard=c.hard,
            sent=c.sent,
            refused_budget=c.refused_budget,
            dropped_busy=c.dropped_busy,
            offline=c.offline,
            answered=c.answered,
            failed=c.failed,
            fused=sum(w.counters.fusion.answers for w in agent.workers),
            late=sum(w.counters.fusion.late for w in agent.workers),
            rtt_p50_ms=percentile(rtts, 50) * 1e3,
            sent_per_camera_s=c.sent / max(1, len(agent.workers)) / (scene_frames / SCENE_FPS),
        )


@dataclass(frozen=True)
class Result:
    """One row: model, embedder and cameras, with each runner."""

    model: str
    embedder: str
    cameras: int
    runners: dict[str, Runner]
    skipped: int
    escalation: EscalationTally | None = None  # the pipeline+cloud agent's, with --escalation


def run_variant(
    args: argparse.Namespace,
    scene: Path,
    decoded: list[Image],
    model: str,
    embedder: str,
    cameras: int,
    mqtt_port: int,
    work: Path,
    cloud_address: str | None = None,
) -> Result:
    """Bare and pipeline (and their decode-included twins), interleaved chunk by chunk.

    With `cloud_address`, pipeline+cloud too: the pre-decoded pipeline with escalation on.
    """
    video = scene / "video.mp4"
    tally: EscalationTally | None = None
    with ExitStack() as stack:
        runners: list[Runner] = []
        agents: list[EdgeAgent] = []
        cloud_agent: tuple[EdgeAgent, StageTotals] | None = None

        def config_for(agent_id: str) -> EdgeAgentConfig:
            return agent_config(
                scene,
                camera_urls=[str(video)] * cameras,
                model=model,
                threads=args.threads,
                embedder=embedder,
                target_fps=TARGET_FPS,
                mqtt_port=mqtt_port,
                outbox_path=work / f"{agent_id}.sqlite",
                agent_id=agent_id,
            )

        for decode in (False, True) if args.decode else (False,):
            suffix = "+decode" if decode else ""
            agent_id = f"bench-{model}-{embedder}-{cameras}{suffix}".replace("+", "-")
            config = config_for(agent_id)
            detector = stack.enter_context(detector_for(config))
            reader = FrameReader(video, None if decode else decoded)
            stack.callback(reader.close)
            runners.append(Runner(f"bare{suffix}", reader, bare_feed(detector, cameras), cameras))
            stages = StageTotals()
            agent, feed = stack.enter_context(pipeline_agent(config, embedder, stages))
            agents.append(agent)
            reader = FrameReader(video, None if decode else decoded)
            stack.callback(reader.close)
            runners.append(Runner(f"pipeline{suffix}", reader, feed, cameras, stages=stages))
            if cloud_address is not None and not decode:
                cloud_config = config_for(f"{agent_id}-cloud")
                escalation = EscalationConfig.model_validate(
                    {"enabled": True, "cloud_address": cloud_address}
                )
                cloud_config = cloud_config.model_copy(update={"escalation": escalation})
                stages = StageTotals()
                agent, feed = stack.enter_context(pipeline_agent(cloud_config, embedder, stages))
                agents.append(agent)
                cloud_agent = (agent, stages)
                reader = FrameReader(video, decoded)
                settle = partial(settle_escalations, agent, stages)
                runners.append(
                    Runner(
                        "pipeline+cloud", reader, feed, cameras, stages=stages, after_chunk=settle
                    )
                )
        for runner in runners:
            runner.run(WARMUP_FRAMES, timed=False)
        done = 0
        while done < args.frames:
            chunk = min(args.chunk, args.frames - done)
            for runner in runners:
                runner.run(chunk)
            done += chunk
        skipped = sum(w.counters.skipped_rate for a in agents for w in a.workers)
        if cloud_agent is not None:
            agent, stages = cloud_agent
            settle_escalations(agent, stages)
            agent.step(0.0)  # no frame: only fuses the last answers
            tally = EscalationTally.of(agent, WARMUP_FRAMES + args.frames)
    return Result(model, embedder, cameras, {r.name: r for r in runners}, skipped, tally)


def _ratio(result: Result, a: str, b: str) -> str:
    if a not in result.runners or b not in result.runners:
        return "–"
    return f"{result.runners[a].fps / result.runners[b].fps:.2f}"


def _fps(result: Result, name: str) -> str:
    return f"{result.runners[name].fps:.1f}" if name in result.runners else "–"


def print_tables(results: list[Result]) -> None:
    """Throughput and per-stage tables."""
    print("\n### Throughput (camera-frames/s)\n")
    print(
        "| model | embedder | cameras | bare | pipeline | pipeline/bare "
        "| bare+decode | pipeline+decode | pipeline/bare (decode) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.model} | {r.embedder} | {r.cameras} | {_fps(r, 'bare')} "
            f"| {_fps(r, 'pipeline')} | **{_ratio(r, 'pipeline', 'bare')}** "
            f"| {_fps(r, 'bare+decode')} | {_fps(r, 'pipeline+decode')} "
            f"| {_ratio(r, 'pipeline+decode', 'bare+decode')} |"
        )
    print_stages(results, "pipeline")
    if any("pipeline+cloud" in r.runners for r in results):
        print_escalation(results)


def print_stages(results: list[Result], name: str) -> None:
    """Where a camera-frame of runner `name` spends its time (ms, pre-decoded frames)."""
    print(f"\n### Where a {name} camera-frame's time goes (ms, pre-decoded frames)\n")
    print(
        "| model | embedder | cameras | total | detect (bare) | detect (in loop) | track "
        "| rules | other | events | rate skips |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        pipe, bare = r.runners[name], r.runners["bare"]
        s = pipe.timed_stages
        n = max(1, s.frames)
        total_ms = pipe.elapsed_s / n * 1e3
        detect, track, rules = (s.detect_s / n * 1e3, s.track_s / n * 1e3, s.rules_s / n * 1e3)
        other = _other_ms(pipe)
        print(
            f"| {r.model} | {r.embedder} | {r.cameras} | {total_ms:.2f} "
            f"| {1e3 / bare.fps:.2f} | {detect:.2f} | {track:.2f} | {rules:.2f} | {other:.2f} "
            f"| {s.events} | {r.skipped} |"
        )


def _other_ms(runner: Runner) -> float:
    """Ms per camera-frame outside detection, tracking and rules (timed chunks)."""
    s = runner.timed_stages
    n = max(1, s.frames)
    return (runner.elapsed_s - s.detect_s - s.track_s - s.rules_s) / n * 1e3


def _step_ms(runner: Runner, q: float) -> str:
    return f"{percentile(runner.step_s, q) * 1e3:.2f}"


def print_escalation(results: list[Result]) -> None:
    """Escalation on against off: throughput, step times, stages and the +cloud counters."""
    rows = [r for r in results if "pipeline+cloud" in r.runners]
    print("\n### Escalation on (pipeline+cloud) against off (pipeline), pre-decoded frames\n")
    print(
        "Step: one scene frame through `agent.step` (all cameras), ms. Other: ms per "
        "camera-frame outside detection, tracking and rules; its growth is the in-loop "
        "escalation work, timed as policy (the decision on each frame) and fusion (collecting "
        "and fusing the answers), ms per camera-frame. The rest of the gap is the cloud model, "
        "JPEG encoder and gRPC threads taking the same cores (this process, this machine): the "
        "ratio is a pessimistic bound.\n"
    )
    print(
        "| model | embedder | cameras | pipeline fps | +cloud fps | +cloud/pipeline "
        "| step p50 | step p95 | +cloud step p50 | +cloud step p95 | other: +cloud - pipeline "
        "| policy | fusion |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pipe, cloud = r.runners["pipeline"], r.runners["pipeline+cloud"]
        n = max(1, cloud.timed_stages.frames)
        print(
            f"| {r.model} | {r.embedder} | {r.cameras} | {pipe.fps:.1f} | {cloud.fps:.1f} "
            f"| **{cloud.fps / pipe.fps:.3f}** | {_step_ms(pipe, 50)} | {_step_ms(pipe, 95)} "
            f"| {_step_ms(cloud, 50)} | {_step_ms(cloud, 95)} "
            f"| {_other_ms(cloud) - _other_ms(pipe):+.2f} "
            f"| {cloud.timed_stages.escalate_s / n * 1e3:.3f} "
            f"| {cloud.timed_stages.fuse_s / n * 1e3:.3f} |"
        )
    print_stages(rows, "pipeline+cloud")
    print(
        "\n### What the +cloud agent's escalation did (whole run, warm-up included)\n\n"
        "Sent: frames (or their crops) submitted to the cloud; fused: answers folded into the "
        "tracks; late: answers past the fusion horizon (dropped); sent/s per camera: per scene "
        "second (the budget is 2; the AIMD back-off cuts it while the cloud is slow).\n"
    )
    print(
        "| model | embedder | cameras | considered | hard | sent | refused (budget) "
        "| dropped (busy) | offline | answered | failed | fused | late | RTT p50 ms "
        "| sent/s per camera |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r.escalation
        if t is None:
            continue
        print(
            f"| {r.model} | {r.embedder} | {r.cameras} | {t.considered} | {t.hard} | {t.sent} "
            f"| {t.refused_budget} | {t.dropped_busy} | {t.offline} | {t.answered} | {t.failed} "
            f"| {t.fused} | {t.late} | {t.rtt_p50_ms:.0f} | {t.sent_per_camera_s:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    """Run every variant and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=360, help="scene frames per variant")
    parser.add_argument("--chunk", type=int, default=30, help="frames per interleaved chunk")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="litert-int8,onnx")
    parser.add_argument("--embedders", default="none,histogram")
    parser.add_argument("--cameras", default="1,4")
    parser.add_argument("--no-decode", dest="decode", action="store_false")
    parser.add_argument("--scene-dir", type=Path, default=None, help="an events scene folder")
    parser.add_argument(
        "--escalation",
        action="store_true",
        help="add pipeline+cloud: escalation on, to an in-process cloud service",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="with --escalation: this process (the edge) on CPU 0, the cloud service in its own "
        "process on the other CPUs, as when the cloud is another machine",
    )
    args = parser.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {0})  # threads started from now on inherit it
    logging.basicConfig(level=logging.WARNING)
    from testbed.broker import start_broker

    scene = ensure_scene(args.scene_dir)
    decoded = decode_all(scene / "video.mp4")
    results: list[Result] = []
    with temp_dir("edge-pipeline-") as tmp:
        work = Path(tmp)
        with ExitStack() as stack:
            broker = start_broker("mosquitto", work)
            stack.callback(broker.stop)
            cloud_address = None
            if args.escalation:
                cloud = pinned_cloud(work) if args.pin else in_process_cloud(work)
                cloud_address = stack.enter_context(cloud)
            for model in args.models.split(","):
                for embedder in args.embedders.split(","):
                    for cameras in (int(c) for c in args.cameras.split(",")):
                        results.append(
                            run_variant(
                                args,
                                scene,
                                decoded,
                                model,
                                embedder,
                                cameras,
                                broker.port,
                                work,
                                cloud_address,
                            )
                        )
    print(
        f"Edge pipeline vs bare detector: {args.frames} scene frames per variant "
        f"({len(decoded)} in the clip, 640x360), {args.threads} threads, chunks of {args.chunk} "
        f"interleaved (the machine is shared and noisy: compare ratios, not absolute numbers)."
    )
    print_tables(results)
    return 0


@contextmanager
def in_process_cloud(work: Path) -> Iterator[str]:
    """The demo's cloud service (committed cloud model, 1 thread), which the demo now starts in
    a process of its own (`testbed.demo_stack.start_cloud`); its address."""
    from testbed.demo_stack import committed_models, start_cloud

    with ExitStack() as stack:
        args = argparse.Namespace(
            cloud_threads=1, out=work / "cloud", cloud_cpus=None, cloud_nice=0
        )
        service = start_cloud(committed_models("int8"), args, stack)
        yield f"127.0.0.1:{service.port}"


@contextmanager
def pinned_cloud(work: Path) -> Iterator[str]:
    """`cloud-service serve` (committed cloud model, 1 thread) as a child process on every CPU
    but 0 (`taskset`), so the edge's CPU 0 runs only the edge; its address."""
    import yaml

    from testbed.demo_stack import committed_models
    from testbed.processes import ManagedProcess, free_tcp_port, tcp_port_accepts

    models = committed_models("int8")
    port = free_tcp_port()
    config = work / "cloud.yaml"
    document = {
        "server": {"listen_address": f"127.0.0.1:{port}", "grace_period_s": 1},
        "engine": {
            "runtime": {
                "type": "onnxruntime",
                "model_path": str(models.cloud),
                "intra_op_threads": 1,
            },
            "class_names": models.class_names,
            "input_size": [models.cloud_imgsz, models.cloud_imgsz],
        },
        "batching": {"max_batch_size": 2},
        "model_name": models.cloud.stem,
        "model_version": "committed",
        "metrics": {"enabled": False},
    }
    config.write_text(yaml.safe_dump(document))
    cpus = ",".join(str(c) for c in range(1, os.cpu_count() or 2))
    argv = ["taskset", "-c", cpus, sys.executable, "-m", "cloud_service", "serve", "--config"]
    process = ManagedProcess(
        "cloud-service",
        [*argv, str(config)],
        ready_check=lambda: tcp_port_accepts("127.0.0.1", port),
    )
    process.start(ready_timeout_s=60.0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.stop()


if __name__ == "__main__":
    raise SystemExit(main())
