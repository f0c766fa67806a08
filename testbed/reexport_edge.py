"""Export the committed edge model again at another fixed input shape, without training.

    python -m testbed.reexport_edge --shape 192,320 [--work .cache/reexport-edge]

The committed INT8 TFLite is fixed at 320x320; a 16:9 camera letterboxed into it spends 40 % of
the pixels on padding. This rebuilds the training checkpoint from the committed ONNX model
(`detection.toolchain.onnx_weights`), regenerates the seed-0 training frames the committed INT8
model was calibrated on (`testbed.build_models`: the same dataset settings, the same 200
frames), and exports INT8 at `--shape` (height, width) to
`models/edge/edge-yolov5n-<W>x<H>-int8.tflite`. Add its manifest row from the printed values.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EDGE_ONNX = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx"
ARCHITECTURE = "yolov5n.yaml"


def _shape(text: str) -> tuple[int, int]:
    height, _, width = text.partition(",")
    try:
        shape = (int(height), int(width))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected HEIGHT,WIDTH, got {text!r}") from exc
    if min(shape) < 32 or any(side % 32 for side in shape):
        raise argparse.ArgumentTypeError(f"sides must be multiples of 32, got {text!r}")
    return shape


def main(argv: list[str] | None = None) -> int:
    """Rebuild, calibrate, export; print the manifest values."""
    from detection.toolchain.export import export_tflite_int8
    from detection.toolchain.onnx_weights import checkpoint_from_onnx
    from testbed.build_models import committed_data

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=_shape, required=True, help="HEIGHT,WIDTH, e.g. 192,320")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / ".cache" / "reexport-edge")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    manifest = json.loads((REPO_ROOT / "models" / "manifest.json").read_text())
    _data, calibration = committed_data(args.work)
    checkpoint = checkpoint_from_onnx(
        EDGE_ONNX, ARCHITECTURE, manifest["class_names"], args.work / "edge-yolov5n-320.pt"
    )
    height, width = args.shape
    exported = export_tflite_int8(
        str(checkpoint), args.work / f"export-{width}x{height}", (height, width), calibration
    )
    target = REPO_ROOT / "models" / "edge" / f"edge-yolov5n-{width}x{height}-int8.tflite"
    shutil.copyfile(exported, target)
    data_bytes = target.read_bytes()
    print(
        json.dumps(
            {
                "file": str(target.relative_to(REPO_ROOT / "models")),
                "sha256": hashlib.sha256(data_bytes).hexdigest(),
                "bytes": len(data_bytes),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
