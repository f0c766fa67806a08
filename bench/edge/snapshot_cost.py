"""What event media cost the edge agent's frame loop: media off vs snapshots vs snapshots+clips.

    python -m bench.edge.snapshot_cost [--frames 720] [--chunk 30] [--threads 2]
        [--model litert-int8] [--vp8] [--results-dir bench/results]

Frames: the `events` scene (640x360, 25 fps, 360 frames, generated once into .cache; looped),
whose rules (zone enter / exit, loiter, line cross) fire every second or so. Each variant is an
`EdgeAgent.from_config` with its `media:` section (tracker, rules, SQLite outbox, a real
Mosquitto; no capture threads: each frame goes into the camera's newest-frame slot, then
`step(0)`, as in `bench.edge.edge_pipeline`), on the scene's own timestamps; the store's clock
(clip stall time-outs, retention) is the scene's too, so the pauses while the other variants run
do not cut clips short. Variants, run interleaved chunk by chunk (the order rotating each round)
so the drift of this shared machine hits them alike:
- off: no media;
- snapshots: a `MediaStore` with the annotated snapshot and the clean crop of every event start;
- snapshots+clips: also clips (3 s before, 5 s after, 5 fps, `mp4v`, the default): every
  camera's frames JPEG-encoded into the ring at 5 fps, then one video per event start (the
  ring's JPEGs decoded and encoded again);
- snapshots+clips(mjpeg): the same with the ring's JPEGs put into an AVI file as they are;
- snapshots+clips(vp8) with `--vp8`: the same with browser-playable VP8 / WebM clips.

The loop runs as fast as it can (the scene's 25 fps is no limit; on a faster box media work piles
up faster per wall second than on a live camera). After each chunk the bench waits, *timed*, until
the media threads have written everything queued (`MediaStore.wait_idle`), so each variant pays
for its own files and none spills into another's chunk: `fps` counts that wait (all the work),
`loop fps` leaves it out (the loop's own rate while the media threads run beside it). The goal:
snapshots / off >= 0.95.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench import harness
from bench.edge._edge_common import (
    agent_config,
    decode_all,
    embedder_named,
    ensure_scene,
    temp_dir,
)
from bench.edge.edge_pipeline import (
    CONNECT_TIMEOUT_S,
    SCENE_FPS,
    TARGET_FPS,
    WARMUP_FRAMES,
    FrameReader,
    Image,
    SceneClock,
)
from bench.harness import RESULTS
from edge_agent.capture import CapturedFrame
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.media import MediaConfig
from edge_agent.media import MediaStore
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from testbed.demo_report import percentile

SETTLE_TIMEOUT_S = 60.0  # the media store finishing its snapshots and clips
GOAL = 0.95

logger = logging.getLogger(__name__)


@dataclass
class Variant:
    """One agent and its media settings; times itself chunk by chunk."""

    name: str
    media: dict[str, Any] | None  # the `media:` section, None: off
    feed: Callable[[Image, int], None] = lambda _image, _index: None
    store: MediaStore | None = None
    reader: FrameReader | None = None
    fed: int = 0
    timed_frames: int = 0
    elapsed_s: float = 0.0  # timed chunks, the media wait included
    settle_s: float = 0.0  # of which: waiting for the media threads after each chunk
    cpu_s: float = 0.0  # CPU time of this process over the timed chunks (all its threads)
    step_s: list[float] = field(default_factory=list)
    events: int = 0  # event starts with a frame (the ones that get media)
    files: dict[str, Any] = field(default_factory=dict)  # what it wrote (after the run)

    @property
    def slug(self) -> str:
        """The name as an agent id / folder name."""
        return re.sub(r"[^a-z0-9]+", "-", self.name).strip("-")

    def count(self, outcome: FrameOutcome) -> None:
        """An outcome hook: count the event starts (each has the outcome's frame)."""
        self.events += sum(event.phase == "start" for event in outcome.events)

    def run(self, frames: int, *, timed: bool = True) -> None:
        """Feed `frames` scene frames, then wait for the media threads; time both if `timed`."""
        assert self.reader is not None
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(frames):
            step_started = time.perf_counter()
            self.feed(self.reader.next(), self.fed)
            if timed:
                self.step_s.append(time.perf_counter() - step_started)
            self.fed += 1
        fed_at = time.perf_counter()
        if self.store is not None and not self.store.wait_idle(SETTLE_TIMEOUT_S):
            logger.warning("%s: media still busy after %.0f s", self.name, SETTLE_TIMEOUT_S)
        finished, cpu_finished = time.perf_counter(), time.process_time()
        if timed:
            self.cpu_s += cpu_finished - cpu_started
            self.timed_frames += frames
            self.elapsed_s += finished - started
            self.settle_s += finished - fed_at

    @property
    def fps(self) -> float:
        """Frames per second over the timed chunks, the media wait included."""
        return self.timed_frames / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per frame (detector, loop and media threads)."""
        return self.cpu_s / self.timed_frames * 1e3 if self.timed_frames else float("nan")

    @property
    def loop_fps(self) -> float:
        """Frames per second of the loop alone (the media wait left out)."""
        loop_s = self.elapsed_s - self.settle_s
        return self.timed_frames / loop_s if loop_s > 0 else float("nan")


@contextmanager
def media_agent(
    config: EdgeAgentConfig, variant: Variant, work: Path
) -> Iterator[Callable[[Image, int], None]]:
    """An agent as production builds it (`EdgeAgent.from_config`) with the variant's `media:`
    section, its media store on the scene's clock, connected to the broker, no capture threads;
    `feed` puts one frame into the camera's slot and steps."""
    wall_base, mono_base = time.time(), time.monotonic()
    clock = SceneClock(wall_base)
    if variant.media is not None:
        document = {"enabled": True, "directory": str(work / variant.slug), **variant.media}
        config = config.model_copy(update={"media": MediaConfig.model_validate(document)})
    agent = EdgeAgent.from_config(config, embedder=embedder_named("none"), wall_clock=clock)
    store = agent.media
    agent.hooks.append(variant.count)

    def feed(image: Image, index: int) -> None:
        offset_s = index / SCENE_FPS
        clock.now_s = wall_base + offset_s
        for worker in agent.workers:
            worker.source.slot.put(
                CapturedFrame(worker.name, index, wall_base + offset_s, mono_base + offset_s, image)
            )
        agent.step(0.0)

    try:
        agent.start(capture=False)  # the broker connection and the media store's threads
        if not agent.publisher.wait_connected(CONNECT_TIMEOUT_S):
            raise RuntimeError(f"agent {config.agent.id} not connected to the broker")
        variant.store = store
        yield feed
    finally:
        agent.close(flush_timeout_s=SETTLE_TIMEOUT_S)


def variants(vp8: bool) -> list[Variant]:
    """Off, snapshots, snapshots+clips (mp4v, mjpeg, and VP8 if asked)."""
    clips = {"enabled": True, "pre_s": 3.0, "post_s": 5.0, "fps": 5.0, "codec": "mp4v"}
    found = [
        Variant("off", None),
        Variant("snapshots", {"snapshot": True, "crop": True}),
        Variant("snapshots+clips", {"clips": clips}),
        Variant("snapshots+clips(mjpeg)", {"clips": {**clips, "codec": "mjpeg"}}),
    ]
    if vp8:
        found.append(Variant("snapshots+clips(vp8)", {"clips": {**clips, "codec": "vp8"}}))
    return found


def run(args: argparse.Namespace) -> tuple[list[Variant], int]:
    """Every variant over the same frames, interleaved; the variants and the clip's length."""
    from testbed.broker import start_broker

    scene = ensure_scene(args.scene_dir)
    video = scene / "video.mp4"
    decoded = decode_all(video)
    found = variants(args.vp8)
    with temp_dir("snapshot-cost-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        broker = start_broker("mosquitto", work)
        stack.callback(broker.stop)
        for variant in found:
            agent_id = f"bench-media-{variant.slug}"
            config = agent_config(
                scene,
                camera_urls=[str(video)],
                model=args.model,
                threads=args.threads,
                embedder="none",
                target_fps=TARGET_FPS,
                mqtt_port=broker.port,
                outbox_path=work / f"{agent_id}.sqlite",
                agent_id=agent_id,
            )
            variant.feed = stack.enter_context(media_agent(config, variant, work))
            variant.reader = FrameReader(video, decoded)
        for variant in found:
            variant.run(WARMUP_FRAMES, timed=False)
            variant.events = 0
        done = rounds = 0
        while done < args.frames:
            chunk = min(args.chunk, args.frames - done)
            start = rounds % len(found)  # each variant in each place in turn: no order effects
            for variant in found[start:] + found[:start]:
                variant.run(chunk)
            done += chunk
            rounds += 1
        for variant in found:  # pending clips written by `close`, untimed
            if variant.store is not None:
                variant.store.close(timeout_s=SETTLE_TIMEOUT_S)
            variant.files = _files(variant, work)
    return found, len(decoded)


def _files(variant: Variant, work: Path) -> dict[str, Any]:
    """What the variant wrote: files per kind, MiB, and the store's counters."""
    folder = work / variant.slug
    paths = [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    kinds = {
        "snapshots": sum(p.name.endswith(".jpg") and "_crop" not in p.name for p in paths),
        "crops": sum(p.name.endswith("_crop.jpg") for p in paths),
        "clips": sum("_clip." in p.name for p in paths),
    }
    clip_frames = sorted(_frame_count(p) for p in paths if "_clip." in p.name)
    stats = variant.store.stats() if variant.store is not None else None
    return {
        **kinds,
        "mib": sum(p.stat().st_size for p in paths) / 2**20,
        "clip_frames_median": float(np.median(clip_frames)) if clip_frames else None,
        "clip_frames_max": clip_frames[-1] if clip_frames else None,
        "dropped": (stats.dropped + stats.dropped_frames) if stats else 0,
        "failed": stats.failed if stats else 0,
    }


def _frame_count(path: Path) -> int:
    capture = cv2.VideoCapture(str(path))
    count = 0
    while capture.grab():
        count += 1
    capture.release()
    return count


def extra_cpu_ms(variant: Variant, off: Variant) -> float:
    """CPU milliseconds the variant spent per event start beyond what `off` spent."""
    extra_s = (variant.cpu_ms - off.cpu_ms) / 1e3 * variant.timed_frames
    return extra_s / variant.events * 1e3 if variant.events else float("nan")


def table(found: list[Variant]) -> str:
    """The Markdown table: throughput, ratio to off, step times, events and files."""
    off = found[0]
    lines = [
        "| media | fps | vs off | loop fps | loop vs off | CPU ms/frame | CPU vs off "
        "| extra CPU ms per event | step p50 ms | step p95 ms | media wait % | event starts "
        "| snapshots | crops | clips | clip frames (median / max) | MiB | dropped | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|",
    ]
    for v in found:
        files = v.files
        median, most = files.get("clip_frames_median"), files.get("clip_frames_max")
        clip_frames = "–" if median is None else f"{median:.0f} / {most}"
        lines.append(
            f"| {v.name} | {v.fps:.1f} | **{v.fps / off.fps:.3f}** | {v.loop_fps:.1f} "
            f"| {v.loop_fps / off.loop_fps:.3f} | {v.cpu_ms:.1f} | {v.cpu_ms / off.cpu_ms:.3f} "
            f"| {extra_cpu_ms(v, off):.0f} "
            f"| {percentile(v.step_s, 50) * 1e3:.2f} "
            f"| {percentile(v.step_s, 95) * 1e3:.2f} | {100 * v.settle_s / v.elapsed_s:.1f} "
            f"| {v.events} | {files.get('snapshots', 0)} | {files.get('crops', 0)} "
            f"| {files.get('clips', 0)} | {clip_frames} "
            f"| {files.get('mib', 0.0):.1f} | {files.get('dropped', 0)} "
            f"| {files.get('failed', 0)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every variant, print the table, write the results files."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=720, help="scene frames per variant")
    parser.add_argument("--chunk", type=int, default=30, help="frames per interleaved chunk")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="litert-int8", choices=["litert-int8", "onnx"])
    parser.add_argument("--vp8", action="store_true", help="add snapshots+clips with VP8 clips")
    parser.add_argument("--scene-dir", type=Path, default=None, help="an events scene folder")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    found, clip_frames = run(args)
    machine = harness.machine(f"OpenCV {cv2.__version__}")
    title = (
        f"Event media cost in the edge frame loop: {args.frames} scene frames per variant "
        f"(events scene, {clip_frames} frames 640x360 at 25 fps, looped), model {args.model}, "
        f"{args.threads} threads, chunks of {args.chunk} interleaved; {machine}"
    )
    body = table(found)
    off = found[0]
    verdicts = [
        f"{v.name}: {v.fps / off.fps:.3f}x off "
        f"({'meets' if v.fps / off.fps >= GOAL else 'misses'} the {GOAL}x goal)"
        for v in found[1:]
    ]
    notes = (
        "fps: frames per second with the media threads' work for each chunk waited for (timed); "
        "loop fps: without that wait. CPU: this process's CPU time (detector, loop, media "
        "threads) per frame over the timed chunks, less sensitive to the other load on a "
        "shared machine than wall time; extra CPU per event: that CPU beyond `off`, over the "
        "event starts (a clip's share: its ring frames, decoding and encoding). Step: one "
        "frame through `agent.step`. Event starts: rule events with phase `start` (each gets a "
        "snapshot; a crop when it has a box; a clip once its camera's frames are in the ring). "
        "The loop runs as fast as it can on the scene's "
        "timestamps (on a box faster than the scene's 25 fps, media work per wall second grows "
        "with it). Clips: 3 s before, 5 s after, 5 fps; mp4v unless named. Media threads run at "
        "nice 10 (`worker_niceness`)."
    )
    text = f"**{title}**\n\n{body}\n\n" + "; ".join(verdicts) + ".\n\n" + notes + "\n"
    print(text)
    document = {
        "title": title,
        "goal_ratio": GOAL,
        "settings": {
            "frames": args.frames,
            "chunk": args.chunk,
            "threads": args.threads,
            "model": args.model,
            "machine": machine,
        },
        "variants": [
            {
                "name": v.name,
                "media": v.media,
                "fps": v.fps,
                "ratio_to_off": v.fps / off.fps,
                "loop_fps": v.loop_fps,
                "loop_ratio_to_off": v.loop_fps / off.loop_fps,
                "cpu_ms_per_frame": v.cpu_ms,
                "cpu_ratio_to_off": v.cpu_ms / off.cpu_ms,
                "extra_cpu_ms_per_event": extra_cpu_ms(v, off),
                "step_p50_ms": percentile(v.step_s, 50) * 1e3,
                "step_p95_ms": percentile(v.step_s, 95) * 1e3,
                "media_wait_s": v.settle_s,
                "event_starts": v.events,
                "files": v.files,
            }
            for v in found
        ],
    }
    harness.write_results("snapshot_cost", text, document, args.results_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
