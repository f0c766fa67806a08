"""Model updates across a fleet: download + verify + warm-up per model size (issue 34).

    python -m bench.fleet.fleet_rollout [--repeats 5]

Publishes the committed models (edge INT8 TFLite ~2.9 MB, edge ONNX ~10 MB, cloud ONNX ~18.6 MB)
into a fresh store, serves it with Debian's nginx over HTTPS on loopback (a test CA,
`testbed.static_store`), and for each model, `--repeats` times into an empty cache, times what an
edge box does before a new model can run:

- `manifest`: fetch the signed manifest and check its Ed25519 signature (`fleet.download`,
  `fleet.signing`);
- `download`: fetch the artifact over HTTPS into `<hex>.part` and check its sha256 before the
  rename (`Downloader.artifact`); `hash` is the sha256 pass alone, part of `download`;
- `load`: build the `detection.detector.Detector` on the verified file;
- `first inference`: one frame (a 1280x720 grey frame: timing, not accuracy) through it.

Medians (and the slowest run) in ms. Prints a markdown table and writes
`bench/results/fleet_rollout.md` and `.json`. The fleet-wide rollout of 8 boxes is described in
the markdown (see the notes written with it).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from bench import harness
from bench.fleet.fleet_boxes import fleet_table, run_fleet
from bench.harness import REPO_ROOT, RESULTS
from detection.config import DetectorConfig
from detection.detector import Detector
from detection.runtimes.config import LiteRTConfig, OnnxRuntimeConfig
from fleet.download import Downloader
from fleet.manifest import ModelManifest
from fleet.signing import Signer, Verifier, generate_key
from fleet.store import DirectoryStore, sha256_of_file
from testbed.static_store import StoreServer, make_test_pki

# (label, file, input size a dynamic model runs at)
MODELS: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("edge INT8 TFLite", "models/edge/edge-yolov5n-320-int8.tflite", (320, 320)),
    ("edge ONNX", "models/edge/edge-yolov5n-320.onnx", (320, 320)),
    ("cloud ONNX", "models/cloud/cloud-yolov5s-640-fp16w.onnx", (640, 640)),
)

T = TypeVar("T")


@dataclass(frozen=True)
class SizeRow:
    """Median (and worst) milliseconds of each step for one model."""

    model: str
    file: str
    megabytes: float
    repeats: int
    manifest_ms: float
    download_ms: float
    download_ms_max: float
    hash_ms: float
    load_ms: float
    first_inference_ms: float
    total_ms: float
    total_ms_max: float
    download_mb_s: float


def _timed(step: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = step()
    return result, (time.perf_counter() - started) * 1000.0


def _detector_config(manifest: ModelManifest, path: Path) -> DetectorConfig:
    runtime = (
        OnnxRuntimeConfig(model_path=path, intra_op_threads=2)
        if manifest.runtime == "onnx"
        else LiteRTConfig(model_path=path, num_threads=2)
    )
    return DetectorConfig(runtime=runtime, input_size=manifest.input)


def one_run(
    downloader: Downloader, name: str, trusted: Verifier, frame: np.ndarray
) -> dict[str, float]:
    """Manifest + signature, download + sha256, load and first inference, timed."""
    signed, manifest_ms = _timed(lambda: downloader.manifest(name, "1").verified(trusted))
    path, download_ms = _timed(lambda: downloader.artifact(signed))
    _, hash_ms = _timed(lambda: sha256_of_file(path))
    detector, load_ms = _timed(lambda: Detector.from_config(_detector_config(signed, path)))
    _, infer_ms = _timed(lambda: detector.detect([frame]))
    detector.close()
    return {
        "manifest_ms": manifest_ms,
        "download_ms": download_ms,
        "hash_ms": hash_ms,
        "load_ms": load_ms,
        "first_inference_ms": infer_ms,
        "total_ms": manifest_ms + download_ms + load_ms + infer_ms,
        "bytes": float(signed.bytes),
    }


def measure(
    server: StoreServer, ca: Path, name: str, trusted: Verifier, repeats: int, work: Path
) -> list[dict[str, float]]:
    """`repeats` runs of `one_run`, each into a new, empty cache."""
    frame = np.full((720, 1280, 3), 114, dtype=np.uint8)
    return [
        one_run(
            Downloader(server.url, work / f"cache-{name}-{i}", ca_path=ca, timeout_s=60),
            name,
            trusted,
            frame,
        )
        for i in range(repeats)
    ]


def summarise(label: str, file: str, runs: list[dict[str, float]]) -> SizeRow:
    """One row of medians from `runs`."""

    def median(key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 1)

    size = runs[0]["bytes"]
    return SizeRow(
        model=label,
        file=file,
        megabytes=round(size / 1e6, 2),
        repeats=len(runs),
        manifest_ms=median("manifest_ms"),
        download_ms=median("download_ms"),
        download_ms_max=round(max(run["download_ms"] for run in runs), 1),
        hash_ms=median("hash_ms"),
        load_ms=median("load_ms"),
        first_inference_ms=median("first_inference_ms"),
        total_ms=median("total_ms"),
        total_ms_max=round(max(run["total_ms"] for run in runs), 1),
        download_mb_s=round(size / 1e6 / (median("download_ms") / 1000.0), 1),
    )


def table(rows: list[SizeRow]) -> str:
    """The markdown table of the per-size rows."""
    lines = [
        "| model | MB | manifest + signature ms | download + sha256 ms (max) | of which sha256 ms "
        "| load ms | first inference ms | total ms (max) | download MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.megabytes} | {r.manifest_ms} | {r.download_ms} "
            f"({r.download_ms_max}) | {r.hash_ms} | {r.load_ms} | {r.first_inference_ms} "
            f"| {r.total_ms} ({r.total_ms_max}) | {r.download_mb_s} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Run the bench; print the table and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per model (1..50)")
    parser.add_argument(
        "--boxes",
        type=int,
        default=8,
        help="agent processes for the fleet-wide rollout (0..16; 0: skip)",
    )
    parser.add_argument(
        "--box-fps", type=float, default=2.0, help="frames/s each box analyses (0.5..10)"
    )
    args = parser.parse_args()
    if not 1 <= args.repeats <= 50:
        parser.error("--repeats must be 1..50")
    if not 0 <= args.boxes <= 16:
        parser.error("--boxes must be 0..16")
    if not 0.5 <= args.box_fps <= 10:
        parser.error("--box-fps must be 0.5..10")
    load_before = harness.load_average()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = Path(tmp)
        public = generate_key(work / "bench.pem")
        signer = Signer.from_file(work / "bench.pem")
        store = DirectoryStore(work / "store")
        names = {}
        for label, file, size in MODELS:
            name = Path(file).stem.replace("_", "-")
            store.publish(REPO_ROOT / file, name, "1", signer, input_size=size)
            names[label] = name
        pki = make_test_pki(work / "pki")
        server = StoreServer(store.root, work / "nginx", pki)
        server.start()
        try:
            rows = [
                summarise(
                    label,
                    file,
                    measure(
                        server, pki.ca_cert, names[label], Verifier([public]), args.repeats, work
                    ),
                )
                for label, file, _ in MODELS
            ]
            fleet_rows = (
                run_fleet(
                    work, store, signer, server.url, pki.ca_cert, boxes=args.boxes,
                    target_fps=args.box_fps,
                )
                if args.boxes
                else []
            )  # fmt: skip
        finally:
            server.stop()
    text = table(rows)
    print(text)
    fleet_text = ""
    if fleet_rows:
        fleet_text = fleet_table(fleet_rows)
        print()
        print(fleet_text)
    command = (
        f"python -m bench.fleet.fleet_rollout --repeats {args.repeats} --boxes {args.boxes} "
        f"--box-fps {args.box_fps:g}"
    )
    load = f"load average {load_before:.1f} before, {harness.load_average():.1f} after"
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {load}"
    document = {
        "command": command,
        "machine": machine,
        "store": "nginx over HTTPS on loopback (testbed.static_store)",
        "sizes": [asdict(row) for row in rows],
        "fleet": {
            "boxes": args.boxes,
            "box_fps": args.box_fps,
            "rollouts": [asdict(row) for row in fleet_rows],
        },
    }
    fleet_section = (
        f"\n## Fleet-wide rollout: {args.boxes} agent processes\n\n"
        f"Each box a real `edge-agent run` at {args.box_fps:g} frames/s, one camera, `fleet:` on; "
        "seconds from publishing the rollout (stage `all`) to each box's retained status "
        "reporting the model running, and the boxes' own download + warm-up + swap time "
        "(their `swapped` events).\n\n"
        f"{fleet_text}\n"
        if fleet_rows
        else ""
    )
    markdown = (
        f"# Fleet rollout: download + verify + warm-up per model size\n\n"
        f"`{command}` on {machine}; medians of "
        f"{args.repeats} runs, each into an empty cache, from nginx over HTTPS on loopback.\n\n"
        f"{text}\n{fleet_section}"
    )
    harness.write_results("fleet_rollout", markdown, document, RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
