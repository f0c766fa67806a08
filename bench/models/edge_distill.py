"""Distillation on a generated camera unlike the training data: edge before/after vs the cloud.

    python -m bench.models.edge_distill [--site far-haze] [--frames 500] [--epochs 20] [--probe]

A site is one camera: a preset's geometry over one fixed background framing, seen through a
`Look` (`testbed.scenes.looks`) the edge model never trained on; the default, `far-haze`, is the
`small_far` preset through a hazy, low-contrast lens, where the committed cloud model is clearly
better than the edge (`--probe` lists each site's edge and cloud scores). The bench:
1. renders `--frames` frames of the site from collection scenes and escalates each one, whole,
   to the committed cloud model; the real `LabelStore` keeps the JPEG and the cloud's answer
   as the agent would;
2. runs `vision-toolchain distill` (`detection.toolchain.distill`) on that store: fine-tune,
   INT8 export, check on the camera's newest records and the general validation set;
3. scores the edge model before and after and the cloud model against the ground truth on
   held-out scenes of the same site (seeds never rendered for collection), and the edge models
   on the general validation set (forgetting).
Prints a table; writes `bench/results/edge_distill.{md,json}`. `--probe` only prints the edge and
cloud scores of each site (which cameras have a gap worth closing).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import grpc
import numpy as np

from bench import harness
from bench.harness import REPO_ROOT, RESULTS
from detection.coco_eval import GroundTruth
from detection.detector import Detector
from detection.toolchain.dataset import LabelledDataset, LabelledImage, load_dataset
from protos.analytics.v1 import analytics_pb2 as pb
from testbed.scenes.background import BackgroundSpec
from testbed.scenes.dataset import DatasetConfig, write_dataset
from testbed.scenes.looks import LOOKS, Look, apply_look
from testbed.scenes.scenario import build_renderer, make_scenario

logger = logging.getLogger(__name__)

MODELS = REPO_ROOT / "models"
EDGE_ONNX = MODELS / "edge" / "edge-yolov5n-320.onnx"
EDGE_INT8 = MODELS / "edge" / "edge-yolov5n-320-int8.tflite"
CLOUD = MODELS / "cloud" / "cloud-yolov5s-640-fp16w.onnx"
CACHE = REPO_ROOT / ".cache"
SCENE_FRAMES = 250
COLLECT_SEED = 971_000
HELD_OUT_SEED = 972_000
MIN_VISIBILITY = 0.25
CLOUD_MIN_SCORE = 0.1  # the label store's `min_score`: the toolchain picks its own cut


@dataclass(frozen=True)
class Site:
    """One camera: a preset's scenes over a fixed background, seen through a look."""

    name: str
    preset: str
    background: BackgroundSpec
    look: Look


SITES: dict[str, Site] = {
    "night-ir": Site(
        "night-ir", "quiet", BackgroundSpec("bikes-street", 0.3, still=True), LOOKS["night-ir"]
    ),
    "night-ir-crowded": Site(
        "night-ir-crowded",
        "crowded",
        BackgroundSpec("bikes-cobbles", 0.6, still=True),
        LOOKS["night-ir"],
    ),
    "washed": Site(
        "washed", "quiet", BackgroundSpec("bikes-pavement", 0.5, still=True), LOOKS["washed"]
    ),
    "day": Site("day", "quiet", BackgroundSpec("bikes-street", 0.3, still=True), LOOKS["day"]),
    "far-dim": Site(
        "far-dim", "small_far", BackgroundSpec("bikes-street", 0.3, still=True), LOOKS["dim"]
    ),
    "far-haze": Site(
        "far-haze", "small_far", BackgroundSpec("bikes-street", 0.3, still=True), LOOKS["haze"]
    ),
    "far-day": Site(
        "far-day", "small_far", BackgroundSpec("bikes-street", 0.3, still=True), LOOKS["day"]
    ),
}


def site_frames(
    site: Site, first_seed: int, count: int, every: int
) -> Iterator[tuple[str, np.ndarray, GroundTruth]]:
    """`count` frames of `site` (every `every`-th of successive scenes from `first_seed`), with
    their ground truth (objects at least `MIN_VISIBILITY` visible)."""
    produced, seed = 0, first_seed
    media = CACHE / "media"
    while produced < count:
        spec = make_scenario(site.preset, seed, n_frames=SCENE_FRAMES)
        spec = dataclasses.replace(spec, name=f"{site.name}-s{seed}", background=site.background)
        renderer = build_renderer(spec, media)
        for index in range(0, spec.n_frames, every):
            if produced == count:
                break
            image, truth = renderer.render(index)
            image = apply_look(image, site.look, seed * 100_000 + index)
            keep = truth.visibility >= MIN_VISIBILITY
            xywh = truth.box_xywh[keep].astype(np.float32)
            xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
            yield f"{spec.name}_f{index:05d}", image, GroundTruth(xyxy, truth.class_id[keep])
            produced += 1
        seed += 1


def labelled_set(
    site: Site, folder: Path, first_seed: int, count: int, every: int
) -> LabelledDataset:
    """Rendered frames written as JPEG (quality 90) with their ground truth, as a labelled set."""
    folder.mkdir(parents=True, exist_ok=True)
    images = []
    for stem, image, truth in site_frames(site, first_seed, count, every):
        path = folder / f"{stem}.jpg"
        if not path.is_file():
            cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        images.append(LabelledImage(path, truth, image.shape[:2]))
    return LabelledDataset(folder, tuple(images), ("person", "car", "truck", "forklift"))


def general_sets(replay_scenes: int) -> Path:
    """The build's validation split (the general set) and a replay split of training scenes."""
    root = CACHE / "edge-distill" / f"general-r{replay_scenes}"
    if not (root / "data.yaml").is_file():
        config = DatasetConfig(
            scenes_per_split=(replay_scenes, 4, 0), frames_per_scene=125, every_n_frames=5, seed=0
        )
        write_dataset(config, root, CACHE / "media")
    return root / "data.yaml"


def probe(sites: list[Site], count: int) -> None:
    from detection.toolchain.evaluate import evaluate_model

    for site in sites:
        held = labelled_set(
            site, CACHE / "edge-distill" / site.name / "held-out", HELD_OUT_SEED, count, 5
        )
        edge = evaluate_model(EDGE_INT8, held, 320)
        cloud = evaluate_model(CLOUD, held, 640)
        boxes = sum(len(i.ground_truth) for i in held.images)
        print(
            f"{site.name:18s} {len(held.images)} frames {boxes} boxes: edge INT8 mAP50 "
            f"{edge.map50:.3f} ({edge.map50_95:.3f}), "
            f"cloud {cloud.map50:.3f} ({cloud.map50_95:.3f})"
        )


Answer = Callable[[np.ndarray, GroundTruth], list[pb.Detection]]


def store_escalations(
    frames: Iterable[tuple[str, np.ndarray, GroundTruth]],
    camera: str,
    store_dir: Path,
    answer: Answer,
) -> int:
    """Escalate each frame (whole, JPEG quality 85) and keep `answer`'s boxes for it in a real
    `LabelStore` at `store_dir`, as the agent does, on a fixed capture clock (one frame every
    2 s). Returns the number of frames kept."""
    import shutil

    from edge_agent.config.labels import LabelStoreConfig
    from edge_agent.escalation import EscalationResult
    from edge_agent.labels import LabelStore
    from protos.analytics.v1 import analytics_pb2 as pb
    from protos.analytics.v1.timestamps import timestamp_from_seconds

    if store_dir.exists():
        shutil.rmtree(store_dir)
    config = LabelStoreConfig(
        enabled=True, directory=store_dir, min_score=CLOUD_MIN_SCORE, max_pending=4096
    )
    start_s = 1_795_000_000.0  # 2026-11-18
    store = LabelStore(config, "bench", clock=lambda: start_s)
    store.start()
    for frame_id, (_stem, image, truth) in enumerate(frames):
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])
        if not ok:
            raise RuntimeError("cannot encode a frame")
        request = pb.FrameRequest(
            camera_id=camera,
            frame_id=frame_id,
            request_id=f"{camera}/{frame_id}",
            jpeg=jpeg.tobytes(),
            original_width=image.shape[1],
            original_height=image.shape[0],
            capture_time=timestamp_from_seconds(start_s + 2.0 * frame_id),
        )
        store.sent(request)
        result = pb.FrameResult(
            request_id=request.request_id, model_name="cloud", model_version="1",
            detections=answer(image, truth),
        )  # fmt: skip
        ok_code = grpc.StatusCode.OK
        store.answered(
            EscalationResult(camera, frame_id, request.request_id, ok_code, "", result, 0.1)
        )
    store.close(timeout_s=120.0)
    if store.counters.dropped or store.counters.failed:
        raise RuntimeError(f"label store lost frames: {store.counters}")
    return store.counters.kept_frames


def detector_answer(detector: Detector) -> Answer:
    """A cloud that answers with `detector`'s boxes (score >= `CLOUD_MIN_SCORE`)."""
    from protos.analytics.v1 import analytics_pb2 as pb

    names = list(detector.config.class_names)

    def answer(image: np.ndarray, _truth: GroundTruth) -> list[pb.Detection]:
        found = detector.detect([image])[0]
        return [
            pb.Detection(
                class_id=int(c),
                class_name=names[int(c)],
                score=float(p),
                x1=float(b[0]),
                y1=float(b[1]),
                x2=float(b[2]),
                y2=float(b[3]),
            )  # fmt: skip
            for b, c, p in zip(found.xyxy, found.class_id, found.confidence, strict=True)
            if p >= CLOUD_MIN_SCORE
        ]

    return answer


@dataclass(frozen=True)
class Row:
    """One model scored against the ground truth."""

    model: str
    camera_map50: float
    camera_map50_95: float
    general_map50: float | None
    general_map50_95: float | None


def _score(
    name: str, path: Path, imgsz: int, held: LabelledDataset, general: LabelledDataset | None
) -> Row:
    from detection.toolchain.evaluate import evaluate_model

    camera = evaluate_model(path, held, imgsz)
    wide = evaluate_model(path, general, imgsz) if general is not None else None
    return Row(
        name,
        camera.map50,
        camera.map50_95,
        wide.map50 if wide else None,
        wide.map50_95 if wide else None,
    )


def _change(before: float | None, after: float | None) -> str:
    return "–" if before is None or after is None else f"{after - before:+.3f}"


def _cell(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.3f}"


def markdown(site: Site, rows: list[Row], summary: dict[str, object]) -> str:
    """The results table and the summary lines."""
    lines = [
        f"## Distillation on site `{site.name}` ({site.preset} preset, {site.background.segment} "
        f"still, look `{site.look.name}`)",
        "",
        "Scored against the ground truth: the camera's held-out scenes (seeds never collected) "
        "and the general validation set.",
        "",
        "| model | camera mAP50 | camera mAP50-95 | general mAP50 | general mAP50-95 |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.model} | {_cell(r.camera_map50)} | {_cell(r.camera_map50_95)} | "
        f"{_cell(r.general_map50)} | {_cell(r.general_map50_95)} |"
        for r in rows
    ]
    lines += ["", *(f"- {key}: {value}" for key, value in summary.items())]
    return "\n".join(lines) + "\n"


def run(site: Site, args: argparse.Namespace) -> int:
    """Collect, distill, score; print and write the results."""
    from detection.toolchain.distill import DistillRefused, DistillSettings, distill
    from detection.toolchain.distill_data import LabelCut
    from detection.toolchain.evaluate import open_detector
    from detection.toolchain.train import FineTuneSpec

    work = CACHE / "edge-distill" / site.name
    started = time.perf_counter()
    general_yaml = general_sets(args.replay_scenes)
    general = load_dataset(general_yaml, "val")
    held = labelled_set(site, work / "held-out", HELD_OUT_SEED, args.held_out, 5)
    cloud_started = time.perf_counter()
    with open_detector(CLOUD, 640) as cloud:
        frames = site_frames(site, COLLECT_SEED, args.frames, args.every)
        store_escalations(frames, site.name, work / "labels", detector_answer(cloud))
    cloud_s = time.perf_counter() - cloud_started
    settings = DistillSettings(
        labels=work / "labels",
        camera=site.name,
        base=EDGE_ONNX,
        current=EDGE_INT8,
        general_data=general_yaml,
        out=work / "out",
        work=work / "distill",
        replay_data=general_yaml,
        replay_fraction=args.replay,
        cut=LabelCut(args.label_score, args.ignore_score),
    )
    schedule = FineTuneSpec(imgsz=320, epochs=args.epochs, lr0=args.lr0, batch=16)
    try:
        report = distill(settings, schedule)
        verdict = f"handed over ({report.reason})"
    except DistillRefused as exc:
        report, verdict = exc.report, f"refused ({exc})"
    model = Path(report.model)
    rows = [
        _score("edge INT8 in service", EDGE_INT8, 320, held, general),
        _score("edge INT8 distilled", model, 320, held, general),
        _score("edge FP32 distilled", settings.work / "distilled.pt", 320, held, general),
        _score("cloud (the teacher)", CLOUD, 640, held, None),
    ]
    before, after, _fp32, teacher = (r.camera_map50 for r in rows)
    gap = teacher - before
    closed = (after - before) / gap if gap > 0 else math.nan
    summary: dict[str, object] = {
        "gap to the cloud closed (camera mAP50)": f"{closed:.1%}",
        "general mAP50 change": _change(rows[0].general_map50, rows[1].general_map50),
        "distill verdict": verdict,
        "escalated frames collected": args.frames,
        "trained on": (
            f"{report.train_images} camera images ({report.label_boxes} cloud "
            f"boxes >= {args.label_score:g} as labels, {report.masked_boxes} masked), "
            f"{report.replay_images} replayed"
        ),
        "schedule": f"{args.epochs} epochs, lr0 {args.lr0:g}, batch 16, 320 px",
        "seconds": (
            f"{time.perf_counter() - started:.0f} in all, cloud labelling {cloud_s:.0f}, "
            f"fine-tuning {report.train_seconds:.0f}"
        ),
        "command": harness.command_line(__spec__.name, args.argv),
    }
    text = markdown(site, rows, summary)
    print(text)
    if not args.no_write:
        record = {
            "site": site.name,
            "rows": [dataclasses.asdict(r) for r in rows],
            "gap_closed": None if math.isnan(closed) else closed,
            "summary": summary,
            "distill_report": report.to_dict(),
        }
        harness.write_results("edge_distill", text, record, RESULTS, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", choices=sorted(SITES), default="far-haze")
    parser.add_argument("--frames", type=int, default=500, help="escalated frames collected")
    parser.add_argument("--held-out", type=int, default=150, help="held-out frames scored")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--probe", action="store_true", help="only edge vs cloud per site")
    parser.add_argument("--every", type=int, default=5, help="collect every Nth frame")
    parser.add_argument("--lr0", type=float, default=0.002)
    parser.add_argument("--replay", type=float, default=0.5, help="replayed per camera image")
    parser.add_argument("--replay-scenes", type=int, default=4, help="x 25 images")
    parser.add_argument("--label-score", type=float, default=0.3)
    parser.add_argument("--ignore-score", type=float, default=0.15)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.probe:
        probe(list(SITES.values()), args.held_out)
        return 0
    return run(SITES[args.site], args)


if __name__ == "__main__":
    raise SystemExit(main())
