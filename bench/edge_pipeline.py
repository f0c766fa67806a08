"""Edge-agent frame-loop throughput against the bare detector, same model and threads.

    python -m bench.edge_pipeline [--frames 360] [--chunk 30] [--threads 2]
        [--models litert-int8,onnx] [--embedders none,histogram] [--cameras 1,4] [--no-decode]

Frames: the `events` scene (640x360, 25 fps; generated once into .cache), fed as fast as the
loop takes them. Variants, run interleaved chunk by chunk (`--chunk` frames each) so that the
drift of this noisy machine hits them alike:
- bare: `Detector.detect` on the pre-decoded frames (one call of C frames for C cameras);
- pipeline: an `EdgeAgent` (tracker, rules, SQLite outbox, a real Mosquitto) without its capture
  threads: each frame goes straight into every camera's newest-frame slot, then `step(0)`. The
  frames carry the scene's own timestamps (25 fps), so rules see real time and the rate limiter
  (target 120 fps) drops nothing;
- the same two with decoding included: OpenCV decodes the H.264 file frame by frame.
Throughput is camera-frames per second (C cameras: C per scene frame). The goal is
pipeline/bare >= 0.9. Then where a pipeline frame's time goes (ms per camera-frame): the
detector (batch time shared by its frames), tracking, rules and the rest (slot, limiter,
outbox writes, status publishing, the loop itself).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from bench._edge_common import agent_config, embedder_named, ensure_scene, temp_dir
from detection.detector import Detector
from edge_agent.alerts import AlertPublisher
from edge_agent.capture import CapturedFrame
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline import EdgeAgent, FrameOutcome

Image = npt.NDArray[np.uint8]
SCENE_FPS = 25.0
TARGET_FPS = 120.0  # above the scene's rate: the limiter must not drop a frame
CONNECT_TIMEOUT_S = 10.0
WARMUP_FRAMES = 5

logger = logging.getLogger(__name__)


def detector_for(config: EdgeAgentConfig) -> Detector:
    """The detector `EdgeAgent.from_config` builds: down to the tracker's low-score threshold."""
    detector_config = config.detector
    low = config.tracker.low_score_threshold
    if low is not None:
        detector_config = detector_config.model_copy(update={"confidence_threshold": low})
    return Detector.from_config(detector_config)


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

    def hook(self, cameras: int) -> Callable[[FrameOutcome], None]:
        """An outcome hook adding to these totals (a batch's detect time split over its frames)."""

        def add(outcome: FrameOutcome) -> None:
            self.frames += 1
            self.detect_s += outcome.detect_s / cameras
            self.track_s += outcome.track_s
            self.rules_s += outcome.rules_s
            self.events += len(outcome.events)

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

    def run(self, frames: int, *, timed: bool = True) -> None:
        """Feed `frames` scene frames; when `timed`, add the wall time and stage totals."""
        before = StageTotals(**vars(self.stages)) if self.stages is not None else None
        started = time.perf_counter()
        for _ in range(frames):
            self.feed(self.reader.next(), self.fed)
            self.fed += 1
        if not timed:
            return
        self.elapsed_s += time.perf_counter() - started
        if self.stages is not None and before is not None:
            for key in ("frames", "detect_s", "track_s", "rules_s", "events"):
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


@contextmanager
def pipeline_agent(
    config: EdgeAgentConfig, embedder: str, stages: StageTotals
) -> Iterator[tuple[EdgeAgent, Callable[[Image, int], None]]]:
    """An agent connected to the broker, no capture threads; `feed` fills the slots and steps."""
    agent = EdgeAgent(
        config,
        detector_for(config),
        AlertPublisher(config.mqtt, config.agent.id),
        embedder=embedder_named(embedder),
    )
    agent.hooks.append(stages.hook(len(agent.workers)))
    agent.publisher.start()
    if not agent.publisher.wait_connected(CONNECT_TIMEOUT_S):
        raise RuntimeError(f"agent {config.agent.id} not connected to the broker")
    wall_base, mono_base = time.time(), time.monotonic()
    missing = 0

    def feed(image: Image, index: int) -> None:
        nonlocal missing
        offset_s = index / SCENE_FPS  # the scene's clock: rules and tracks see real time
        for worker in agent.workers:
            frame = CapturedFrame(
                worker.name, index, wall_base + offset_s, mono_base + offset_s, image
            )
            worker.source.slot.put(frame)
        missing += len(agent.workers) - agent.step(0.0)

    try:
        yield agent, feed
    finally:
        if missing:
            logging.getLogger(__name__).warning(
                "%s: %d frames not analysed", config.agent.id, missing
            )
        agent.close()


@dataclass(frozen=True)
class Result:
    """One row: model, embedder and cameras, with each runner."""

    model: str
    embedder: str
    cameras: int
    runners: dict[str, Runner]
    skipped: int


def run_variant(
    args: argparse.Namespace,
    scene: Path,
    decoded: list[Image],
    model: str,
    embedder: str,
    cameras: int,
    mqtt_port: int,
    work: Path,
) -> Result:
    """Bare and pipeline (and their decode-included twins), interleaved chunk by chunk."""
    video = scene / "video.mp4"
    with ExitStack() as stack:
        runners: list[Runner] = []
        agents: list[EdgeAgent] = []
        for decode in (False, True) if args.decode else (False,):
            suffix = "+decode" if decode else ""
            agent_id = f"bench-{model}-{embedder}-{cameras}{suffix}".replace("+", "-")
            config = agent_config(
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
        for runner in runners:
            runner.run(WARMUP_FRAMES, timed=False)
        done = 0
        while done < args.frames:
            chunk = min(args.chunk, args.frames - done)
            for runner in runners:
                runner.run(chunk)
            done += chunk
        skipped = sum(w.counters.skipped_rate for a in agents for w in a.workers)
    return Result(model, embedder, cameras, {r.name: r for r in runners}, skipped)


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
    print("\n### Where a pipeline camera-frame's time goes (ms, pre-decoded frames)\n")
    print(
        "| model | embedder | cameras | total | detect (bare) | detect (in loop) | track "
        "| rules | other | events | rate skips |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        pipe, bare = r.runners["pipeline"], r.runners["bare"]
        s = pipe.timed_stages
        n = max(1, s.frames)
        total_ms = pipe.elapsed_s / n * 1e3
        detect, track, rules = (s.detect_s / n * 1e3, s.track_s / n * 1e3, s.rules_s / n * 1e3)
        other = total_ms - detect - track - rules
        print(
            f"| {r.model} | {r.embedder} | {r.cameras} | {total_ms:.2f} "
            f"| {1e3 / bare.fps:.2f} | {detect:.2f} | {track:.2f} | {rules:.2f} | {other:.2f} "
            f"| {s.events} | {r.skipped} |"
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from testbed.broker import start_broker

    scene = ensure_scene(args.scene_dir)
    decoded = _decode_all(scene / "video.mp4")
    results: list[Result] = []
    with temp_dir("edge-pipeline-") as tmp:
        work = Path(tmp)
        broker = start_broker("mosquitto", work)
        try:
            for model in args.models.split(","):
                for embedder in args.embedders.split(","):
                    for cameras in (int(c) for c in args.cameras.split(",")):
                        results.append(
                            run_variant(
                                args, scene, decoded, model, embedder, cameras, broker.port, work
                            )
                        )
        finally:
            broker.stop()
    print(
        f"Edge pipeline vs bare detector: {args.frames} scene frames per variant "
        f"({len(decoded)} in the clip, 640x360), {args.threads} threads, chunks of {args.chunk} "
        f"interleaved (the machine is shared and noisy: compare ratios, not absolute numbers)."
    )
    print_tables(results)
    return 0


def _decode_all(video: Path) -> list[Image]:
    capture = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    frames: list[Image] = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(np.asarray(image, dtype=np.uint8))
    capture.release()
    if not frames:
        raise RuntimeError(f"no frame decoded from {video}")
    return frames


if __name__ == "__main__":
    raise SystemExit(main())
