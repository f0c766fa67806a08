"""Regenerate the project's own detectors from scratch: data, training, export, accuracy, manifest.

    python -m testbed.build_models            # or: scripts/build-models

1. a YOLO dataset of generated scenes (train / val), deterministic from `--seed`;
2. the edge model: YOLOv5n at 320 px on whole frames;
3. the cloud model: YOLOv5s trained on 320 px tiles at native scale, run on whole 640 px frames
   (a CPU can train it in minutes; it sees small objects at twice the edge model's resolution);
4. exports: edge ONNX (FP32, dynamic batch) and INT8 TFLite (calibrated on generated frames),
   cloud ONNX with FP16-stored weights;
5. accuracy of each on held-out scenes of every scenario, and `models/manifest.json`.

Needs the `tools` extra (ultralytics, torch, litert-torch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from testbed.accuracy import ModelUnderTest, evaluate_all, markdown_table, write_test_sets
from testbed.scenes.dataset import DatasetConfig, write_dataset
from testbed.tiles import tile_dataset

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
EDGE_IMGSZ = 320
CLOUD_TILE_PX = 320
CLOUD_IMGSZ = 640
CALIBRATION_IMAGES = 200


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _calibration_folder(data_root: Path, out: Path, count: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    images = sorted((data_root / "images" / "train").glob("*.jpg"))
    step = max(len(images) // count, 1)
    for image in images[::step][:count]:
        shutil.copy(image, out / image.name)
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Regenerate data and models from a seed.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "models")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "build-models")
    parser.add_argument("--train-scenes", type=int, default=48)
    parser.add_argument("--val-scenes", type=int, default=4)
    parser.add_argument("--frames-per-scene", type=int, default=125)
    parser.add_argument("--every", type=int, default=5, help="keep every Nth frame")
    parser.add_argument("--edge-epochs", type=int, default=25)
    parser.add_argument("--cloud-epochs", type=int, default=12)
    parser.add_argument("--test-scenes", type=int, default=3, help="per scenario")
    parser.add_argument("--batch", type=int, default=16)
    return parser.parse_args(argv)


def committed_data(work: Path) -> tuple[Path, Path]:
    """(data folder, calibration folder) of the committed models' build (seed 0): the training
    and validation scenes regenerated into `work/data` (kept when there) and the 200 INT8
    calibration frames picked from them into `work/calibration`."""
    build = _parse([])
    data = work / "data"
    if not (data / "data.yaml").is_file():
        config = DatasetConfig(
            scenes_per_split=(build.train_scenes, build.val_scenes, 0),
            frames_per_scene=build.frames_per_scene,
            every_n_frames=build.every,
            seed=build.seed,
        )
        write_dataset(config, data, REPO_ROOT / ".cache" / "media")
    calibration = _calibration_folder(data, work / "calibration", CALIBRATION_IMAGES)
    return data, calibration


def _data(args: argparse.Namespace, cache: Path) -> tuple[Path, Path]:
    work = args.work
    data_yaml = work / "data" / "data.yaml"
    if not data_yaml.is_file():
        config = DatasetConfig(
            scenes_per_split=(args.train_scenes, args.val_scenes, 0),
            frames_per_scene=args.frames_per_scene,
            every_n_frames=args.every,
            seed=args.seed,
        )
        write_dataset(config, work / "data", cache)
    tiles_yaml = work / "tiles" / "data.yaml"
    if not tiles_yaml.is_file():
        tile_dataset(data_yaml, work / "tiles", CLOUD_TILE_PX, tiles_per_image=1, seed=args.seed)
    return data_yaml, tiles_yaml


def _train(args: argparse.Namespace, data_yaml: Path, tiles_yaml: Path) -> dict[str, Any]:
    from detection.toolchain.train import TrainSpec, train_detector

    specs = {
        "edge": (TrainSpec("yolov5n.yaml", EDGE_IMGSZ, args.edge_epochs, args.batch, args.seed),
                 data_yaml),
        "cloud": (TrainSpec("yolov5s.yaml", CLOUD_TILE_PX, args.cloud_epochs, args.batch,
                            args.seed), tiles_yaml),
    }  # fmt: skip
    trained: dict[str, Any] = {}
    for name, (spec, data) in specs.items():
        weights = args.work / f"{name}.pt"
        record = args.work / f"{name}.train.json"
        if not (weights.is_file() and record.is_file()):
            result = train_detector(spec, data, args.work, name)
            record.write_text(json.dumps({"seconds": round(result.seconds, 1)}))
        trained[name] = {
            "weights": weights,
            "spec": spec,
            "train_seconds": json.loads(record.read_text())["seconds"],
        }
    return trained


def _export(args: argparse.Namespace, trained: dict[str, Any], data_yaml: Path) -> dict[str, Path]:
    from detection.toolchain.export import export_onnx, export_tflite_int8
    from detection.toolchain.fp16 import store_weights_fp16

    out = args.out
    calibration = _calibration_folder(
        data_yaml.parent, args.work / "calibration", CALIBRATION_IMAGES
    )
    edge_pt, cloud_pt = str(trained["edge"]["weights"]), str(trained["cloud"]["weights"])
    exported = {
        "edge_onnx": export_onnx(edge_pt, args.work / "export-edge-onnx", EDGE_IMGSZ),
        "edge_tflite": export_tflite_int8(
            edge_pt, args.work / "export-edge-tflite", EDGE_IMGSZ, calibration
        ),
        "cloud_onnx_fp32": export_onnx(cloud_pt, args.work / "export-cloud-onnx", CLOUD_IMGSZ),
    }
    final = {
        "edge_onnx": out / "edge" / f"edge-yolov5n-{EDGE_IMGSZ}.onnx",
        "edge_tflite": out / "edge" / f"edge-yolov5n-{EDGE_IMGSZ}-int8.tflite",
        "cloud_onnx": out / "cloud" / f"cloud-yolov5s-{CLOUD_IMGSZ}-fp16w.onnx",
    }
    for path in final.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exported["edge_onnx"], final["edge_onnx"])
    shutil.copyfile(exported["edge_tflite"], final["edge_tflite"])
    store_weights_fp16(exported["cloud_onnx_fp32"], final["cloud_onnx"])
    return final


def _manifest(
    args: argparse.Namespace,
    trained: dict[str, Any],
    files: dict[str, Path],
    table: str,
    rows: list[Any],
) -> dict[str, Any]:
    import torch
    import ultralytics

    def entry(key: str, role: str, imgsz: int) -> dict[str, Any]:
        path = files[key]
        spec = trained[role]["spec"]
        return {
            "file": str(path.relative_to(args.out)),
            "sha256": _sha256(path),
            "bytes": path.stat().st_size,
            "architecture": spec.model_yaml,
            "train_imgsz": spec.imgsz,
            "eval_imgsz": imgsz,
            "epochs": spec.epochs,
            "train_seconds": trained[role]["train_seconds"],
        }

    return {
        "command": "python -m testbed.build_models " + " ".join(sys.argv[1:]),
        "seed": args.seed,
        "settings": {k: str(v) for k, v in vars(args).items() if k not in ("out", "work")},
        "class_names": ["person", "car", "truck", "forklift"],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "versions": {"ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "models": {
            "edge_onnx": entry("edge_onnx", "edge", EDGE_IMGSZ),
            "edge_tflite_int8": entry("edge_tflite", "edge", EDGE_IMGSZ),
            "cloud_onnx_fp16_weights": entry("cloud_onnx", "cloud", CLOUD_IMGSZ),
        },
        "accuracy": [row.__dict__ for row in rows],
        "accuracy_table": table,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every step; each step's output is cached in `--work`, so a rerun resumes."""
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("YOLO_CONFIG_DIR", str(args.work / "ultralytics-config"))
    cache = REPO_ROOT / ".cache" / "media"
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data_yaml, tiles_yaml = _data(args, cache)
    trained = _train(args, data_yaml, tiles_yaml)
    files = _export(args, trained, data_yaml)
    test_sets = write_test_sets(
        args.work / "test", cache, args.seed, args.test_scenes, args.frames_per_scene, args.every
    )
    models = [
        ModelUnderTest("edge YOLOv5n ONNX FP32 @320", files["edge_onnx"], EDGE_IMGSZ),
        ModelUnderTest("edge YOLOv5n TFLite INT8 @320", files["edge_tflite"], EDGE_IMGSZ),
        ModelUnderTest("cloud YOLOv5s ONNX @640", files["cloud_onnx"], CLOUD_IMGSZ),
    ]
    rows = evaluate_all(models, test_sets)
    table = markdown_table(rows)
    manifest = _manifest(args, trained, files, table, rows)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (args.out / "ACCURACY.md").write_text(
        "# Accuracy of the committed models\n\n"
        f"Held-out generated scenes, seed {args.seed}; regenerate with `{manifest['command']}`.\n\n"
        + table
        + "\n"
    )
    print(table)
    print(
        f"done in {time.perf_counter() - started:.0f} s; manifest at {args.out / 'manifest.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
