"""GPU benchmark of the cloud service, one prepared script that runs in a few minutes.

    python -m bench.cloud.gpu_cloud --prepare        # here, once (tools extra): YOLOv5x graph
    python -m bench.cloud.gpu_cloud [--out-dir DIR]  # on the GPU machine, .cache/gpu-bench carried

Measures, each section skipped with its reason where it cannot run:
1. NVJPEG batched decode (nvImageCodec, torchvision) at 720p and 1080p, images/s, against the
   CPU decoder on all cores.
2. The GPU engine for YOLOv5x (640, random weights) at each batch size: ONNX Runtime with the
   CUDA EP (host arrays in and out, as the service does, and device-resident through IOBinding),
   the TensorRT EP with `--trt-ep` (builds an engine: minutes), a TensorRT engine with
   `--trt-engine`, and plain torch FP16 as a reference of what the GPU does with the
   architecture where neither is installed.
3. End-to-end server throughput through gRPC (bench/cloud/gpu_cloud_e2e.py).
The table goes to stdout and, when `--out-dir` or `$OUT` is set, to `gpu_cloud.md` there.
Without a CUDA GPU it prints "no CUDA GPU: nothing measured" and exits 0.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.cloud._gpu_common import CPU_SMOKE, GPU, Report, Target
from bench.cloud.gpu_cloud_model import IMGSZ, MODEL_DIR, materialize, prepare

DECODE_BATCHES = (1, 8, 32)
ENGINE_BATCHES = (1, 2, 4, 8, 16, 32)


def cuda_device() -> str | None:
    """The GPU's name, or None where torch or a CUDA GPU is missing (the reason printed)."""
    try:
        import torch
    except ImportError as exc:
        print(f"torch does not import: {exc}")
        return None
    return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None


def time_per_run_ms(
    run: Callable[[], object], seconds: float, sync: Callable[[], object]
) -> tuple[float, float]:
    """(first run ms, mean ms of the runs after it); runs for at least `seconds`, 3 runs."""
    started = time.perf_counter()
    run()
    sync()
    first_ms = (time.perf_counter() - started) * 1000.0
    run()  # second warm-up: cuDNN / allocator settle after the first
    sync()
    runs, started = 0, time.perf_counter()
    while True:
        run()
        runs += 1
        if runs >= 3 and time.perf_counter() - started >= seconds:
            sync()
            return first_ms, (time.perf_counter() - started) * 1000.0 / runs


# --- 1. JPEG decoding -----------------------------------------------------------------------


def _gpu_decoders(limits: Any, target: Target) -> list[tuple[str, Callable[[], Any]]]:
    """(label, factory) of each GPU decoder variant; the CPU stand-ins in a smoke run."""
    from cloud_service.decoders.nvimgcodec import NvImageCodecDecoder
    from cloud_service.decoders.nvjpeg import TorchvisionNvjpegDecoder

    if target.smoke:
        return [
            (
                "nvimgcodec",
                partial(NvImageCodecDecoder, limits=limits, backend_kinds=("CPU_ONLY",)),
            ),
            ("torchvision", partial(TorchvisionNvjpegDecoder, limits=limits, device="cpu")),
        ]
    return [
        ("nvimgcodec", partial(NvImageCodecDecoder, limits=limits)),
        (
            "nvimgcodec HW engine",
            partial(NvImageCodecDecoder, limits=limits, backend_kinds=("HW_GPU_ONLY",)),
        ),
        (
            "nvimgcodec CUDA",
            partial(NvImageCodecDecoder, limits=limits, backend_kinds=("GPU_ONLY",)),
        ),
        ("torchvision", partial(TorchvisionNvjpegDecoder, limits=limits)),
    ]


def decode_section(report: Report, seconds: float, target: Target) -> None:
    """NVJPEG decoders and the CPU decoder on every core, images/s."""
    from bench.cloud.jpeg_decoders import sample_jpegs
    from cloud_service.decoders import CpuDecoder, JpegLimits, create_codec
    from detection.errors import RuntimeUnavailableError

    limits = JpegLimits(max_jpeg_bytes=64 * 1024 * 1024, max_image_pixels=100_000_000)
    jpegs, source = sample_jpegs(85)
    report.line(f"\n## 1. JPEG decode (q85, {source})\n")
    report.table(["decoder", "output", "resolution", "batch", "images/s"])
    batches = DECODE_BATCHES[:2] if target.smoke else DECODE_BATCHES
    for label, factory in _gpu_decoders(limits, target):
        try:
            decoder = factory()
        except RuntimeUnavailableError as exc:
            report.row([label, "-", "-", "-", f"skipped: {exc}"])
            continue
        for resolution, jpeg in jpegs.items():
            for batch in batches:
                run = partial(decoder.decode_batch_device, [jpeg] * batch)
                _, ms = time_per_run_ms(run, seconds, target.sync)
                report.row([label, "GPU tensors", resolution, batch, f"{batch * 1000 / ms:.0f}"])
            run = partial(decoder.decode_batch, [jpeg] * 16)
            _, ms = time_per_run_ms(run, seconds, target.sync)
            report.row([label, "host BGR", resolution, 16, f"{16 * 1000 / ms:.0f}"])
        decoder.close()
    threads = os.cpu_count() or 1
    for codec_name in ("simplejpeg", "opencv"):
        try:
            codec = create_codec(codec_name)
        except RuntimeUnavailableError as exc:
            report.row([f"cpu/{codec_name}", "-", "-", "-", f"skipped: {exc}"])
            continue
        cpu = CpuDecoder(codec, limits=limits, threads=threads)
        for resolution, jpeg in jpegs.items():
            _, ms = time_per_run_ms(partial(cpu.decode_batch, [jpeg] * 32), seconds, lambda: None)
            report.row(
                [f"{cpu.name} x{threads} threads", "host BGR", resolution, 32, f"{32000 / ms:.0f}"]
            )
        cpu.close()


# --- 2. Engines -----------------------------------------------------------------------------


def _engine_rows(
    report: Report,
    label: str,
    make_run: Callable[[int], Callable[[], object]],
    sync: Callable[[], object],
    sizes: Sequence[int],
    seconds: float,
) -> None:
    for batch in sizes:
        try:
            first_ms, ms = time_per_run_ms(make_run(batch), seconds, sync)
        except Exception as exc:  # out of memory, a shape the engine rejects: report, go on
            report.row([label, batch, "-", "-", "-", f"failed: {type(exc).__name__}: {exc}"[:200]])
            continue
        report.row([label, batch, f"{first_ms:.0f}", f"{ms:.1f}", f"{batch * 1000 / ms:.0f}", ""])


def _onnx_rows(
    report: Report, model: Path, sizes: Sequence[int], seconds: float, trt_ep: bool, target: Target
) -> None:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if target.smoke:
        available = [*available, "CUDAExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        report.row(
            [
                "ORT CUDA EP",
                "-",
                "-",
                "-",
                "-",
                f"skipped: onnxruntime {ort.__version__} has {available}; needs onnxruntime-gpu",
            ]
        )
        return
    name_cuda: Any = ("CUDAExecutionProvider", {"device_id": 0})
    first = ["CPUExecutionProvider"] if target.smoke else [name_cuda, "CPUExecutionProvider"]
    variants: list[tuple[str, list[Any]]] = [("ORT CUDA EP fp32", first)]
    if trt_ep and "TensorrtExecutionProvider" in available:
        cache = MODEL_DIR / "trt-ep-cache"
        shape = f"3x{IMGSZ}x{IMGSZ}"
        options = {
            "trt_fp16_enable": True,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_profile_min_shapes": f"images:1x{shape}",
            "trt_profile_opt_shapes": f"images:8x{shape}",
            "trt_profile_max_shapes": f"images:{max(sizes)}x{shape}",
        }
        variants.append(
            ("ORT TensorRT EP fp16", [("TensorrtExecutionProvider", options), name_cuda])
        )
    elif trt_ep:
        report.row(["ORT TensorRT EP", "-", "-", "-", "-", f"skipped: not in {available}"])
    rng = np.random.default_rng(0)
    ort_device = "cpu" if target.smoke else "cuda"
    for label, providers in variants:
        session = ort.InferenceSession(str(model), providers=providers)
        if session.get_providers()[0] != (
            providers[0] if isinstance(providers[0], str) else providers[0][0]
        ):
            report.row(
                [
                    label,
                    "-",
                    "-",
                    "-",
                    "-",
                    f"skipped: session fell back to {session.get_providers()}",
                ]
            )
            continue
        input_name, output_name = session.get_inputs()[0].name, session.get_outputs()[0].name

        def host_run(
            batch: int, session: Any = session, input_name: str = input_name
        ) -> Callable[[], object]:
            images = rng.random((batch, 3, IMGSZ, IMGSZ), dtype=np.float32)
            return partial(session.run, None, {input_name: images})

        _engine_rows(report, f"{label}, host in/out", host_run, lambda: None, sizes, seconds)

        def device_run(
            batch: int,
            session: Any = session,
            input_name: str = input_name,
            output_name: str = output_name,
        ) -> Callable[[], object]:
            images = ort.OrtValue.ortvalue_from_numpy(
                rng.random((batch, 3, IMGSZ, IMGSZ), dtype=np.float32), ort_device, 0
            )
            binding = session.io_binding()
            binding.bind_ortvalue_input(input_name, images)
            binding.bind_output(output_name, ort_device, 0)
            return partial(session.run_with_iobinding, binding)

        _engine_rows(report, f"{label}, on device", device_run, lambda: None, sizes, seconds)
        del session


def _tensorrt_rows(report: Report, engine: Path, sizes: Sequence[int], seconds: float) -> None:
    try:
        from detection.runtimes.config import TensorRTConfig
        from detection.runtimes.tensorrt import TensorRTRuntime

        runtime = TensorRTRuntime(TensorRTConfig(engine_path=engine, max_batch_size=max(sizes)))
    except Exception as exc:  # TensorRT, cuda-python or pydantic missing; a bad engine file
        report.row(
            ["TensorRT runtime", "-", "-", "-", "-", f"skipped: {type(exc).__name__}: {exc}"[:200]]
        )
        return
    rng = np.random.default_rng(0)
    usable = [b for b in sizes if b <= (runtime.input_spec.max_batch_size or max(sizes))]

    def make_run(batch: int) -> Callable[[], object]:
        return partial(runtime.infer, rng.random((batch, 3, IMGSZ, IMGSZ), dtype=np.float32))

    _engine_rows(
        report, f"TensorRT {engine.name}, host in/out", make_run, lambda: None, usable, seconds
    )
    runtime.close()


def _torch_rows(report: Report, sizes: Sequence[int], seconds: float, target: Target) -> None:
    import torch

    from bench.models.yolov5_reference import build

    torch.backends.cudnn.benchmark = True
    model = build(target.yolo_scale, device=target.device, half=target.half)
    dtype = torch.float16 if target.half else torch.float32

    def make_run(batch: int) -> Callable[[], object]:
        images = torch.rand((batch, 3, IMGSZ, IMGSZ), device=target.device, dtype=dtype)
        images = images.contiguous(memory_format=torch.channels_last)

        def run() -> object:
            with torch.inference_mode():
                return model(images)

        return run

    _engine_rows(
        report,
        f"torch {'fp16' if target.half else 'fp32'} eager YOLOv5{target.yolo_scale} "
        "(reference, not a service engine)",
        make_run,
        target.sync,
        sizes,
        seconds,
    )


def engine_section(report: Report, args: argparse.Namespace, target: Target) -> Path | None:
    """YOLOv5x at each batch size on every GPU engine installed; returns the ONNX model used."""
    report.line(f"\n## 2. YOLOv5x {IMGSZ}x{IMGSZ} engines (random weights)\n")
    report.table(["engine", "batch", "first run ms", "ms/batch", "images/s", "note"])
    sizes = args.batch_sizes
    model: Path | None = None
    try:
        model = args.onnx or materialize()
    except FileNotFoundError as exc:
        report.row(["ONNX model", "-", "-", "-", "-", f"skipped: {exc}"])
    if model is not None:
        try:
            _onnx_rows(report, model, sizes, args.seconds_per_cell, args.trt_ep, target)
        except ImportError as exc:
            report.row(["ONNX Runtime", "-", "-", "-", "-", f"skipped: {exc}"])
    if args.trt_engine is not None:
        _tensorrt_rows(report, args.trt_engine, sizes, args.seconds_per_cell)
    _torch_rows(report, sizes, args.seconds_per_cell, target)
    return model


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run every section that this machine allows; 0 also where there is no GPU."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prepare", action="store_true", help="write the carried YOLOv5x graph (here, tools extra)"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    )
    parser.add_argument(
        "--seconds-per-cell", type=float, default=1.0, help="timed seconds per table cell"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(ENGINE_BATCHES))
    parser.add_argument(
        "--onnx", type=Path, help="YOLOv5x ONNX to use instead of the carried graph"
    )
    parser.add_argument(
        "--trt-ep",
        action="store_true",
        help="also ONNX Runtime's TensorRT EP (builds an engine: minutes)",
    )
    parser.add_argument(
        "--trt-engine", type=Path, help="also time this TensorRT engine (TensorRT runtime)"
    )
    parser.add_argument(
        "--e2e-seconds",
        type=float,
        default=20.0,
        help="measured seconds of the gRPC run; 0 skips it",
    )
    parser.add_argument("--e2e-streams", type=int, default=16, help="concurrent camera streams")
    parser.add_argument(
        "--e2e-window-frames", type=int, default=4, help="frames in flight per stream"
    )
    parser.add_argument(
        "--e2e-max-batch", type=int, default=16, help="batching.max_batch_size of the server"
    )
    parser.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="run every section on the CPU, tiny: checks the script, numbers mean nothing",
    )
    args = parser.parse_args(argv)
    if args.prepare:
        print(f"wrote {prepare()}")
        return 0
    report = Report()
    target = CPU_SMOKE if args.smoke_cpu else GPU
    device = "CPU (smoke run)" if args.smoke_cpu else cuda_device()
    if device is None:
        report.line("no CUDA GPU: nothing measured")
        if args.out_dir is not None:
            report.write(args.out_dir)
        return 0
    report.line(f"# Cloud service on {device}")
    started = time.perf_counter()
    decode_section(report, args.seconds_per_cell, target)
    model = engine_section(report, args, target)
    if args.e2e_seconds > 0:
        from bench.cloud.gpu_cloud_e2e import e2e_section

        e2e_section(report, args, model, target)
    report.line(f"\n(total {time.perf_counter() - started:.0f} s)")
    if args.out_dir is not None:
        print(f"wrote {report.write(args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
