"""Train the committed cloud model further on fresh generated scenes, and keep it only if it wins.

    python -m testbed.build_cloud [--seed 1] [--train-scenes 160] [--epochs 10] [--lr0 0.005]
        [--work .cache/build-cloud] [--dry-run]

The cloud model of `testbed.build_models` trains for 12 epochs (about 30 min on two CPU cores):
too short to be the clear upper bound the hybrid needs. This continues from the committed
weights instead of starting again, so each run adds to every earlier one ("resume across runs"):

1. a new training set from `--seed` (scenes disjoint from earlier seeds and from every held-out
   set): many scenes, few frames of each (every 25th of 125), so the model sees more
   backgrounds, lighting and layouts per image trained; cut into native-scale 320 px tiles
   (`testbed.tiles`, two per frame) as the original build does;
2. the committed ONNX rebuilt into a trainable checkpoint (`onnx_weights.trainable_checkpoint`:
   the batch norms re-inserted from statistics of the new tiles);
3. `--epochs` of fine-tuning at `--lr0` (SGD, linear decay, mosaic until the last epoch);
4. the ONNX export at 640 with FP16-stored weights, evaluated next to the committed model on
   the held-out test scenes of `models/ACCURACY.md` (seed 0, three scenes per scenario);
5. the verdict: the candidate replaces `models/cloud/cloud-yolov5s-640-fp16w.onnx` only if its
   mean mAP50 over the scenarios is higher and no scenario loses more than `--max-drop`.
   Then the manifest's cloud row (file hash, epochs, training time, the run's record under
   `continued`) and its accuracy rows, and `models/ACCURACY.md`, are rewritten. Otherwise
   nothing under `models/` changes and the command exits 2.

Each step's output is kept in `--work`, so a rerun after an interruption resumes at the step it
reached. Needs the `tools` extra (ultralytics, torch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.accuracy import (
    AccuracyRow,
    ModelUnderTest,
    evaluate_all,
    markdown_table,
    write_test_sets,
)

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = REPO_ROOT / "models"
CLOUD_KEY = "cloud_onnx_fp16_weights"
ARCHITECTURE = "yolov5s.yaml"
TILE_PX = 320
EVAL_IMGSZ = 640
CURRENT_LABEL = "cloud YOLOv5s ONNX @640"
CANDIDATE_LABEL = "cloud YOLOv5s ONNX @640 (candidate)"


@dataclass(frozen=True)
class Verdict:
    """Candidate against the committed model, per scenario and on average (mAP50)."""

    current: dict[str, float]
    candidate: dict[str, float]
    max_drop: float

    @property
    def mean_gain(self) -> float:
        """Mean mAP50 over the scenarios, candidate minus committed."""
        return statistics.fmean(self.candidate.values()) - statistics.fmean(self.current.values())

    def failures(self) -> list[str]:
        """Why the candidate is refused (empty: it is kept)."""
        out = []
        if self.mean_gain <= 0.0:
            out.append(f"mean mAP50 does not improve ({self.mean_gain:+.4f})")
        for scenario, before in self.current.items():
            drop = before - self.candidate[scenario]
            if drop > self.max_drop:
                out.append(
                    f"{scenario} mAP50 drops {drop:.4f} ({before:.3f} -> "
                    f"{self.candidate[scenario]:.3f}; at most {self.max_drop:g})"
                )
        return out


def verdict_of(rows: list[AccuracyRow], max_drop: float) -> Verdict:
    """The verdict from `evaluate_all` rows of the committed model and the candidate."""
    current = {r.scenario: r.map50 for r in rows if r.model == CURRENT_LABEL}
    candidate = {r.scenario: r.map50 for r in rows if r.model == CANDIDATE_LABEL}
    if not current or current.keys() != candidate.keys():
        raise ValueError("both models must be evaluated on the same scenarios")
    return Verdict(current, candidate, max_drop)


def updated_manifest(
    manifest: dict[str, Any],
    model: Path,
    run: dict[str, Any],
    rows: list[AccuracyRow],
) -> dict[str, Any]:
    """`manifest` with the cloud row describing `model` (after `run`) and the candidate's
    accuracy rows in place of the committed cloud model's."""
    out: dict[str, Any] = json.loads(json.dumps(manifest))
    entry = out["models"][CLOUD_KEY]
    entry["sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    entry["bytes"] = model.stat().st_size
    entry["epochs"] = int(entry["epochs"]) + int(run["epochs"])
    entry["train_seconds"] = round(float(entry["train_seconds"]) + float(run["seconds"]), 1)
    entry.setdefault("continued", []).append(run)
    kept = [a for a in out["accuracy"] if a["model"] != CURRENT_LABEL]
    fresh = [{**asdict(r), "model": CURRENT_LABEL} for r in rows if r.model == CANDIDATE_LABEL]
    out["accuracy"] = _scenario_order(kept + fresh)
    out["accuracy_table"] = markdown_table([AccuracyRow(**a) for a in out["accuracy"]])
    return out


def _scenario_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    return sorted(rows, key=lambda r: scenarios.index(r["scenario"]))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="training scenes (not 0: the build)")
    parser.add_argument("--train-scenes", type=int, default=160)
    parser.add_argument("--frames-per-scene", type=int, default=125)
    parser.add_argument("--every", type=int, default=25, help="keep every Nth frame")
    parser.add_argument("--tiles-per-image", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr0", type=float, default=0.005)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-drop", type=float, default=0.01, help="per scenario, mAP50")
    parser.add_argument("--models", type=Path, default=MODELS)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "build-cloud")
    parser.add_argument(
        "--dry-run", action="store_true", help="evaluate and report; never touch --models"
    )
    args = parser.parse_args(argv)
    if args.seed == 0:
        parser.error("--seed 0 is the committed build's training set; pick another")
    if args.epochs < 1 or args.train_scenes < 1:
        parser.error("--epochs and --train-scenes must be >= 1")
    return args


def _tiles(args: argparse.Namespace, work: Path) -> Path:
    from testbed.scenes.dataset import DatasetConfig, write_dataset
    from testbed.tiles import tile_dataset

    data_yaml = work / "data" / "data.yaml"
    if not data_yaml.is_file():
        config = DatasetConfig(
            scenes_per_split=(args.train_scenes, 2, 0),
            frames_per_scene=args.frames_per_scene,
            every_n_frames=args.every,
            seed=args.seed,
        )
        write_dataset(config, work / "data", REPO_ROOT / ".cache" / "media")
    tiles_yaml = work / "tiles" / "data.yaml"
    if not tiles_yaml.is_file():
        tile_dataset(data_yaml, work / "tiles", TILE_PX, args.tiles_per_image, seed=args.seed)
    return tiles_yaml


def _train(args: argparse.Namespace, current: Path, tiles_yaml: Path, work: Path) -> Path:
    from detection.toolchain.onnx_weights import trainable_checkpoint
    from detection.toolchain.train import FineTuneSpec, finetune_detector

    weights = work / "cloud-continued.pt"
    record = work / "cloud-continued.train.json"
    if weights.is_file() and record.is_file():
        return weights
    sample = sorted((tiles_yaml.parent / "images" / "train").glob("*.jpg"))[::25][:64]
    start = trainable_checkpoint(current, ARCHITECTURE, sample, work, imgsz=TILE_PX)
    spec = FineTuneSpec(
        imgsz=TILE_PX,
        epochs=args.epochs,
        batch=args.batch,
        lr0=args.lr0,
        seed=args.seed,
        close_mosaic_epochs=1,
    )
    result = finetune_detector(start, spec, tiles_yaml, work, "cloud-continued")
    record.write_text(json.dumps({"seconds": round(result.seconds, 1)}))
    return weights


def main(argv: list[str] | None = None) -> int:
    """Data, checkpoint, training, export, evaluation, verdict; exit 2 when refused."""
    from detection.toolchain.export import export_onnx
    from detection.toolchain.fp16 import store_weights_fp16

    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics-config"))
    manifest_path = args.models / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    current = args.models / manifest["models"][CLOUD_KEY]["file"]
    started = time.perf_counter()
    tiles_yaml = _tiles(args, work)
    weights = _train(args, current, tiles_yaml, work)
    candidate = work / current.name
    if not candidate.is_file():
        exported = export_onnx(str(weights), work / "export", EVAL_IMGSZ)
        store_weights_fp16(exported, candidate)
    settings = json.loads(json.dumps(manifest["settings"]))
    test_sets = write_test_sets(
        work / "test",
        REPO_ROOT / ".cache" / "media",
        int(settings["seed"]),
        int(settings["test_scenes"]),
        int(settings["frames_per_scene"]),
        int(settings["every"]),
    )
    rows = evaluate_all(
        [
            ModelUnderTest(CURRENT_LABEL, current, EVAL_IMGSZ),
            ModelUnderTest(CANDIDATE_LABEL, candidate, EVAL_IMGSZ),
        ],
        test_sets,
    )
    table = markdown_table(rows)
    verdict = verdict_of(rows, args.max_drop)
    print(table)
    print(f"\nmean mAP50 {verdict.mean_gain:+.4f} (candidate - committed)")
    run = {
        "seed": args.seed,
        "train_scenes": args.train_scenes,
        "images": f"every {args.every}th of {args.frames_per_scene} frames, "
        f"{args.tiles_per_image} tiles of {TILE_PX} px each",
        "epochs": args.epochs,
        "lr0": args.lr0,
        "seconds": json.loads((work / "cloud-continued.train.json").read_text())["seconds"],
        "mean_map50_gain": round(verdict.mean_gain, 4),
        "command": " ".join(
            ["python -m testbed.build_cloud", *(sys.argv[1:] if argv is None else argv)]
        ),
    }
    (work / "verdict.json").write_text(
        json.dumps({"run": run, "failures": verdict.failures(), "table": table}, indent=1) + "\n"
    )
    failures = verdict.failures()
    if failures:
        print("build_cloud: candidate refused: " + "; ".join(failures), file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"candidate kept (dry run: {candidate} not copied)")
        return 0
    shutil.copyfile(candidate, current)
    updated = updated_manifest(manifest, current, run, rows)
    manifest_path.write_text(json.dumps(updated, indent=1) + "\n")
    accuracy = args.models / "ACCURACY.md"
    head = accuracy.read_text().split("| scenario |", 1)[0]
    accuracy.write_text(head + updated["accuracy_table"] + "\n")
    print(f"candidate kept: {current} replaced in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
