"""TF.js graph model -> ONNX with `tf2onnx`, run in a build-only virtual environment.

TensorFlow is needed only to convert, never to run: it lives in its own venv under the build
cache (pinned versions, created on first use), so neither the runtimes nor the `tools` extra
carry it. With TensorFlow 2.15 and numpy 1.26 `tf2onnx --tfjs` converts NanoDet as it is; newer
TensorFlow needs shims (numpy 2 removed `np.product`; newer op definitions want attributes the
TF.js JSON omits), so the versions are pinned rather than floating.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from detection.errors import ExportError

logger = logging.getLogger(__name__)

CONVERTER_PACKAGES: tuple[str, ...] = (
    "tensorflow-cpu==2.15.1",
    "tf2onnx==1.16.1",
    "numpy==1.26.4",
    "protobuf==3.20.3",
    "onnx==1.16.2",
)
OPSET = 13
INSTALL_TIMEOUT_S = 1800
CONVERT_TIMEOUT_S = 600


def _run(argv: list[str], what: str, timeout_s: float) -> None:
    logger.info("%s: %s", what, " ".join(argv))
    try:
        result = subprocess.run(  # noqa: S603 - explicit argument list, no shell
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ExportError(f"{what} timed out after {timeout_s:.0f} s") from exc
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        raise ExportError(f"{what} failed: {' '.join(lines[-3:])}")


def converter_python(venv: Path) -> Path:
    """The interpreter of the build venv, created and filled on first use."""
    python = venv / "bin" / "python"
    stamp = venv / "packages.txt"
    wanted = "\n".join(CONVERTER_PACKAGES) + "\n"
    if python.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted:
        return python
    if not python.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], "creating the converter venv", 120)
    _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *CONVERTER_PACKAGES,
        ],
        f"installing {', '.join(CONVERTER_PACKAGES)} into {venv}",
        INSTALL_TIMEOUT_S,
    )
    stamp.write_text(wanted, encoding="utf-8")
    return python


def convert_tfjs(graph_json: Path, target: Path, python: Path) -> Path:
    """Convert a TF.js graph model (its JSON next to its weight shards) to ONNX at `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [
            str(python),
            "-m",
            "tf2onnx.convert",
            "--tfjs",
            str(graph_json),
            "--output",
            str(target),
            "--opset",
            str(OPSET),
        ],
        f"tf2onnx --tfjs {graph_json.name}",
        CONVERT_TIMEOUT_S,
    )
    if not target.is_file():
        raise ExportError(f"tf2onnx wrote no {target}")
    return target
