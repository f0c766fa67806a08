"""Accuracy of a model on a labelled folder, and the comparison of an export with its source.

Every model, source or export, goes through the same `Detector` (letterbox, runtime, the
project's decode and NMS) with ultralytics' validation settings (confidence >= 0.001, NMS IoU 0.7,
300 boxes per image), then through `detection.coco_eval`.
"""

from __future__ import annotations

import ast
import logging
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detection.coco_eval import MetricsResult, compute_metrics
from detection.config import DetectorConfig
from detection.decode import OutputLayout, detect_layout
from detection.detections import Detections
from detection.detector import Detector
from detection.errors import ModelLoadError
from detection.runtimes.base import Runtime, create_runtime
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig, TensorRTConfig
from detection.toolchain.dataset import LabelledDataset
from detection.toolchain.torch_runtime import TorchRuntimeConfig

logger = logging.getLogger(__name__)

Letterbox = Literal["fit", "fixed"]

EVAL_CONFIDENCE = 0.001  # as ultralytics val: mAP needs the low-confidence tail
EVAL_NMS_IOU = 0.7
EVAL_MAX_DETECTIONS = 300
MODEL_SUFFIXES = {
    ".pt": "torch",
    ".onnx": "onnxruntime",
    ".tflite": "litert",
    ".engine": "tensorrt",
    ".plan": "tensorrt",
}


@dataclass(frozen=True)
class LoadedModel:
    """A model file behind a `Runtime`, with what its file says about its classes."""

    path: Path
    runtime: Runtime
    class_names: tuple[str, ...]
    layout: OutputLayout


def _runtime_config(path: Path, imgsz: int, max_batch: int) -> Any:
    kind = MODEL_SUFFIXES.get(path.suffix.lower())
    if kind == "torch":
        return TorchRuntimeConfig(model_path=path, input_size_px=imgsz)
    if kind == "onnxruntime":
        return OnnxRuntimeConfig(model_path=path)
    if kind == "litert":
        return LiteRTConfig(model_path=path)
    if kind == "tensorrt":
        return TensorRTConfig(engine_path=path, max_batch_size=max_batch)
    raise ModelLoadError(
        f"{path}: unsupported model format {path.suffix!r}; expected one of "
        f"{', '.join(sorted(MODEL_SUFFIXES))}"
    )


def infer_ms(runtime: Runtime, batch: int, size: int, repeats: int) -> float:
    """Median ms per frame of `runtime` on a random `batch` x 3 x `size` x `size` input, after
    one warm-up run."""
    images = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    runtime.infer(images)  # warm-up
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        runtime.infer(images)
        runs.append((time.perf_counter() - started) * 1000.0 / batch)
    return statistics.median(runs)


def model_latency_ms(path: Path, imgsz: int, *, threads: int = 1, repeats: int = 60) -> float:
    """`infer_ms` of an ONNX or TFLite model file at batch 1 on `threads` CPU threads."""
    config: OnnxRuntimeConfig | LiteRTConfig
    kind = MODEL_SUFFIXES.get(path.suffix.lower())
    if kind == "onnxruntime":
        config = OnnxRuntimeConfig(model_path=path, intra_op_threads=threads)
    elif kind == "litert":
        config = LiteRTConfig(model_path=path, num_threads=threads)
    else:
        raise ModelLoadError(f"{path}: latency is timed for ONNX and TFLite models only")
    runtime = create_runtime(config)
    try:
        return infer_ms(runtime, 1, imgsz, repeats)
    finally:
        runtime.close()


def onnx_class_names(path: Path) -> tuple[str, ...]:
    """Class names from an ONNX file's metadata (ultralytics writes `names`); () where absent."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == "names":
            try:
                names = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return ()
            if isinstance(names, dict):
                return tuple(str(names[k]) for k in sorted(names))
    return ()


def check_output_layout(runtime: Runtime, imgsz: int, num_classes: int | None) -> OutputLayout:
    """Run one blank image and tell the YOLO layout of the output; raises
    `UnknownOutputLayoutError` for a model whose output fits no supported layout."""
    spec = runtime.input_spec
    height, width = spec.height or imgsz, spec.width or imgsz
    output = runtime.infer(np.zeros((1, 3, height, width), dtype=np.float32))
    layout = detect_layout(tuple(output.shape), num_classes)
    logger.info("model output %s: %s layout", tuple(output.shape), layout.value)
    return layout


def load_model(path: Path, imgsz: int, max_batch: int = 1) -> LoadedModel:
    """Load any supported model file and check its output layout before it is used."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    config = _runtime_config(path, imgsz, max_batch)
    runtime = create_runtime(config)
    try:
        names: tuple[str, ...] = tuple(getattr(runtime, "class_names", ()))
        if not names and path.suffix.lower() == ".onnx":
            names = onnx_class_names(path)
        layout = check_output_layout(runtime, imgsz, len(names) or None)
    except Exception:
        runtime.close()
        raise
    return LoadedModel(path, runtime, names, layout)


def _detector_config(
    model: LoadedModel, imgsz: int, letterbox: Letterbox = "fixed"
) -> DetectorConfig:
    spec = model.runtime.input_spec
    settings: dict[str, Any] = {
        # fixed by default: every format is measured on the same square input
        "letterbox": letterbox,
        "confidence_threshold": EVAL_CONFIDENCE,
        "iou_threshold": EVAL_NMS_IOU,
        "max_detections": EVAL_MAX_DETECTIONS,
        "class_names": list(model.class_names),
        "input_size": None if spec.height and spec.width else (imgsz, imgsz),
    }
    runtime_config = _runtime_config(model.path, imgsz, spec.max_batch_size or 1)
    if isinstance(runtime_config, TorchRuntimeConfig):
        # the torch runtime is a toolchain tool, deliberately outside the runtime config union:
        # validate the settings with a stand-in runtime, then put the real one in
        stand_in = {"type": "onnxruntime", "model_path": str(model.path)}
        template = DetectorConfig.model_validate({"runtime": stand_in, **settings})
        return template.model_copy(update={"runtime": runtime_config})
    return DetectorConfig(runtime=runtime_config, **settings)


def evaluate_detector(
    detector: Detector,
    dataset: LabelledDataset,
    class_names: tuple[str, ...] = (),
    batch_size: int = 8,
) -> MetricsResult:
    """Run `detector` over every image of `dataset` and score its boxes against the labels."""
    predictions: list[Detections] = []
    images = dataset.images
    for start in range(0, len(images), batch_size):
        frames = [item.load() for item in images[start : start + batch_size]]
        predictions.extend(detector.detect(frames))
    names = dataset.class_names or class_names or tuple(detector.config.class_names)
    return compute_metrics([i.ground_truth for i in images], predictions, class_names=names)


def open_detector(path: Path, imgsz: int, letterbox: Letterbox = "fixed") -> Detector:
    """A `Detector` with validation settings over any supported model file (checked layout);
    `letterbox: fit` lets a dynamic-shape model take each image at its fitted shape."""
    model = load_model(path, imgsz)
    try:
        return Detector(model.runtime, _detector_config(model, imgsz, letterbox))
    except Exception:
        model.runtime.close()
        raise


def evaluate_model(
    path: Path, dataset: LabelledDataset, imgsz: int, letterbox: Letterbox = "fixed"
) -> MetricsResult:
    """Load a model file of any supported format and evaluate it on `dataset`."""
    with open_detector(path, imgsz, letterbox) as detector:
        result = evaluate_detector(detector, dataset)
    logger.info("%s: mAP50-95 %.4f, mAP50 %.4f", path, result.map50_95, result.map50)
    return result


def evaluate_source_model(
    pt_or_onnx_path: Path, dataset: LabelledDataset, imgsz: int
) -> MetricsResult:
    """Evaluate the source of an export: a `.pt` run by torch, or an ONNX run by ONNX Runtime,
    both through the project's decode and NMS."""
    if Path(pt_or_onnx_path).suffix.lower() not in (".pt", ".onnx"):
        raise ModelLoadError(f"a source model must be .pt or .onnx, got {pt_or_onnx_path}")
    return evaluate_model(pt_or_onnx_path, dataset, imgsz)


def _num(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.4f}"


def _delta(export: float, source: float) -> str:
    if math.isnan(export) or math.isnan(source):
        return "–"
    return f"{export - source:+.4f}"


@dataclass(frozen=True)
class Comparison:
    """Metrics of an export next to those of its source model, on the same labelled folder."""

    source_name: str
    export_name: str
    source: MetricsResult
    export: MetricsResult

    def markdown(self) -> str:
        """Summary and per-class tables, with export - source deltas."""
        s, e = self.source, self.export
        rows = [
            ("mAP50-95", s.map50_95, e.map50_95),
            ("mAP50", s.map50, e.map50),
            (f"recall@{s.score_threshold:g} (IoU 0.5)", s.overall.recall, e.overall.recall),
            ("mAP50-95 small", s.small.map50_95, e.small.map50_95),
            ("mAP50 small", s.small.map50, e.small.map50),
        ]
        lines = [
            f"## Accuracy: `{self.export_name}` vs source `{self.source_name}`",
            "",
            f"{s.num_images} images, {s.overall.num_gt} boxes ({s.small.num_gt} small).",
            "",
            "| metric | source | export | delta |",
            "|---|---:|---:|---:|",
        ]
        lines += [f"| {n} | {_num(a)} | {_num(b)} | {_delta(b, a)} |" for n, a, b in rows]
        lines += [
            "",
            "| class | GT | AP50-95 source | AP50-95 export | delta | AP50 source | AP50 export "
            "| delta |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        exported = {c.class_id: c for c in e.per_class}
        for c in s.per_class:
            x = exported.get(c.class_id)
            ap, ap50 = (x.ap50_95, x.ap50) if x else (math.nan, math.nan)
            if c.num_gt == 0:
                continue
            lines.append(
                f"| {c.name} | {c.num_gt} | {_num(c.ap50_95)} | {_num(ap)} | "
                f"{_delta(ap, c.ap50_95)} | {_num(c.ap50)} | {_num(ap50)} "
                f"| {_delta(ap50, c.ap50)} |"
            )
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: both results and the headline deltas."""

        def delta(a: float, b: float) -> float | None:
            return None if math.isnan(a) or math.isnan(b) else b - a

        return {
            "source": {"model": self.source_name, **self.source.to_dict()},
            "export": {"model": self.export_name, **self.export.to_dict()},
            "delta": {
                "map50_95": delta(self.source.map50_95, self.export.map50_95),
                "map50": delta(self.source.map50, self.export.map50),
            },
        }
