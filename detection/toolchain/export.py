"""Export YOLO models (an ultralytics YAML name or a user `.pt`) to ONNX and INT8 TFLite.

Ultralytics and torch come from the `tools` extra and are imported inside the functions, so the
runtime packages never need them. Exports run offline: no weight or package downloads.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from detection.errors import ExportError

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp"})
ImageSize = int | tuple[int, int]


def offline_environment() -> None:
    """Keep ultralytics from reaching the network or installing packages (set before import)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")
    if "YOLO_CONFIG_DIR" not in os.environ:
        os.environ["YOLO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="yolo-config-")


def _unambiguous_weights(path: Path) -> Path:
    """`path`, or a link to it whose name ultralytics will not swap for a `...u.pt` download."""
    from ultralytics.utils.checks import check_yolov5u_filename

    if check_yolov5u_filename(str(path), verbose=False) == str(path):
        return path
    link = Path(tempfile.mkdtemp(prefix="yolo-weights-")) / f"{path.stem}_weights.pt"
    link.symlink_to(path.resolve())
    return link


def build_model(spec: str, seed: int = 0) -> Any:
    """An ultralytics `YOLO` model from a YAML name (`yolov5s.yaml`, random weights) or `.pt` file.

    `seed` fixes the random initial weights of YAML-built models, so builds are reproducible.
    """
    offline_environment()
    import torch
    from ultralytics.models import YOLO

    if spec.endswith(".pt") and not Path(spec).is_file():
        raise ExportError(f"model weights file not found: {spec}")
    if not spec.endswith((".pt", ".yaml", ".yml")):
        raise ExportError(f"model spec must be a .yaml name or a .pt file, got {spec!r}")
    torch.manual_seed(seed)
    source = str(_unambiguous_weights(Path(spec))) if spec.endswith(".pt") else spec
    try:
        return YOLO(source, task="detect")
    # a corrupt .pt surfaces as TypeError (ultralytics wraps torch's UnpicklingError in it)
    except (FileNotFoundError, OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise ExportError(f"cannot build model {spec!r}: {exc}") from exc


def _checkpoint(spec: str, out_dir: Path, seed: int) -> Path:
    """Save the built model into `out_dir` so the export lands there (ultralytics writes beside)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(spec, seed)
    path = out_dir / f"{Path(spec).stem}_source.pt"  # not `yolov5s.pt`: see _unambiguous_weights
    model.save(path)
    return path


def _produced(result: Any, out_dir: Path, suffix: str, name: str) -> Path:
    """Move the exported file (the path ultralytics returned, else the newest `suffix` file in
    `out_dir`) to `out_dir / name`."""
    if result and Path(str(result)).is_file():
        found = Path(str(result))
    else:
        candidates = sorted(out_dir.glob(f"*{suffix}"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise ExportError(f"export reported {result!r} but no {suffix} file is in {out_dir}")
        found = candidates[-1]
    return found.replace(out_dir / name).resolve()


def export_onnx(
    spec: str, out_dir: Path, imgsz: ImageSize, dynamic: bool = True, opset: int = 17, seed: int = 0
) -> Path:
    """Export to ONNX (float32, NCHW, dynamic batch and size when `dynamic`); returns its path."""
    from ultralytics.models import YOLO

    start = time.perf_counter()
    checkpoint = _checkpoint(spec, out_dir, seed)
    try:
        result = YOLO(str(checkpoint), task="detect").export(
            format="onnx", imgsz=imgsz, dynamic=dynamic, opset=opset, device="cpu"
        )
    except Exception as exc:  # ultralytics and torch.onnx raise many unrelated types
        raise ExportError(f"ONNX export of {spec!r} failed: {exc}") from exc
    path = _produced(result, out_dir, ".onnx", f"{Path(spec).stem}.onnx")
    logger.info("exported %s to %s in %.1f s", spec, path, time.perf_counter() - start)
    return path


def calibration_images(calibration_dir: Path) -> list[Path]:
    if not calibration_dir.is_dir():
        raise ExportError(f"calibration folder not found: {calibration_dir}")
    images = sorted(p for p in calibration_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ExportError(
            f"calibration folder {calibration_dir} holds no images ({sorted(IMAGE_SUFFIXES)})"
        )
    return images


def export_tflite_float(spec: str, out_dir: Path, imgsz: ImageSize, seed: int = 0) -> Path:
    """Export to a float32 `.tflite` with litert-torch (the input of INT8 quantisation)."""
    from ultralytics.models import YOLO

    checkpoint = _checkpoint(spec, out_dir, seed)
    try:
        result = YOLO(str(checkpoint), task="detect").export(
            format="tflite", imgsz=imgsz, device="cpu"
        )
    except Exception as exc:  # ultralytics and litert-torch raise many types
        raise ExportError(f"TFLite export of {spec!r} failed: {exc}") from exc
    return _produced(result, out_dir, ".tflite", f"{Path(spec).stem}_float32.tflite")


def export_tflite_int8(
    spec: str, out_dir: Path, imgsz: ImageSize, calibration_dir: Path, seed: int = 0
) -> Path:
    """Export to an INT8 `.tflite` calibrated on the images in `calibration_dir`; returns its path.

    litert-torch converts the model to float TFLite, then ai-edge-quantizer quantises weights and
    activations to int8 except the head's box decoding (see `detection.toolchain.quantize`):
    float32 NCHW input, float32 output with boxes normalised to 0..1.
    """
    from detection.toolchain.quantize import quantize_int8

    start = time.perf_counter()
    images = calibration_images(calibration_dir)  # fail before the slow part
    float_model = export_tflite_float(spec, out_dir, imgsz, seed)
    size = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    path = quantize_int8(float_model, out_dir / f"{Path(spec).stem}_int8.tflite", images, size)
    logger.info("exported %s to %s in %.1f s", spec, path, time.perf_counter() - start)
    return path
