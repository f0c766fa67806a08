"""JPEG decoder throughput: images/s of each decoder at 720p and 1080p, q85, batches of 16.

    python -m bench.cloud.jpeg_decoders [--seconds-per-cell 2] [--batch-images 16] [--threads 1 2]

CPU rows: every codec installed here (simplejpeg, PyTurboJPEG, OpenCV) through `CpuDecoder`
with 1 and 2 threads. GPU rows (NVJPEG through nvImageCodec / torchvision) only where a CUDA GPU
exists: `device` keeps the images on the GPU, `host` copies them back as BGR arrays.
The frames are ultralytics' `zidane.jpg` (1280x720, a real photo) and the same upscaled to
1920x1080, re-encoded at the chosen quality; a synthetic scene where ultralytics is absent.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from cloud_service.decoders import CpuDecoder, JpegLimits, create_codec
from detection.errors import RuntimeUnavailableError

RESOLUTIONS = {"720p": (1280, 720), "1080p": (1920, 1080)}
LIMITS = JpegLimits(max_jpeg_bytes=64 * 1024 * 1024, max_image_pixels=100_000_000)


def _source_image() -> tuple[np.ndarray[Any, Any], str]:
    spec = importlib.util.find_spec("ultralytics")
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / "assets" / "zidane.jpg"
        image = cv2.imread(str(path))
        if image is not None:
            return image, "zidane.jpg"
    rng = np.random.default_rng(0)  # smooth gradients, shapes and sensor noise
    y, x = np.mgrid[0:720, 0:1280].astype(np.float32)
    image = np.stack([x / 5, y / 3, (x + y) / 8], axis=-1) % 255
    for _ in range(60):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        centre = (int(rng.integers(0, 1280)), int(rng.integers(0, 720)))
        cv2.circle(image, centre, int(rng.integers(10, 120)), colour, -1)
    image = image + rng.normal(0, 4, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), "synthetic scene"


def sample_jpegs(quality: int = 85) -> tuple[dict[str, bytes], str]:
    """{"720p": jpeg, "1080p": jpeg} at `quality`, and where the picture came from."""
    image, source = _source_image()
    jpegs = {}
    for name, (width, height) in RESOLUTIONS.items():
        frame = cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)
        ok, encoded = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise RuntimeError(f"cv2.imencode failed at {name}")
        jpegs[name] = bytes(encoded)
    return jpegs, source


def images_per_s(run_batch: Callable[[], object], batch_images: int, seconds: float) -> float:
    """Images per second of `run_batch` (one warm-up, then batches for at least `seconds`)."""
    run_batch()
    batches, started = 0, time.perf_counter()
    while True:
        run_batch()
        batches += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and batches >= 3:
            return batches * batch_images / elapsed


def cpu_rows(
    jpegs: dict[str, bytes], batch_images: int, threads: Sequence[int], seconds: float
) -> list[tuple[str, str, str, float]]:
    """(decoder, resolution, threads, images/s) for every CPU codec installed here."""
    rows = []
    for codec_name in ("simplejpeg", "turbojpeg", "opencv"):
        try:
            create_codec(codec_name)
        except RuntimeUnavailableError as exc:
            print(f"<!-- {codec_name} skipped: {exc} -->")
            continue
        for resolution, jpeg in jpegs.items():
            for count in threads:
                codec = create_codec(codec_name)
                decoder = CpuDecoder(codec, limits=LIMITS, threads=count)
                run = partial(decoder.decode_batch, [jpeg] * batch_images)
                rate = images_per_s(run, batch_images, seconds)
                decoder.close()
                rows.append((f"cpu/{codec_name}", resolution, str(count), rate))
    return rows


def _on_device(torch: Any, decoder: Any, batch: list[bytes]) -> None:
    decoder.decode_batch_device(batch)
    torch.cuda.synchronize()


def gpu_rows(
    jpegs: dict[str, bytes], batch_images: int, seconds: float
) -> list[tuple[str, str, str, float]]:
    """NVJPEG rows (device and host output); empty without a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    from cloud_service.decoders.factory import create_gpu_decoder

    rows = []
    for backend in ("nvimgcodec", "torchvision"):
        try:
            decoder = create_gpu_decoder(backend, limits=LIMITS)
        except RuntimeUnavailableError as exc:
            print(f"<!-- {backend} skipped: {exc} -->")
            continue
        for resolution, jpeg in jpegs.items():
            batch = [jpeg] * batch_images
            rate = images_per_s(partial(_on_device, torch, decoder, batch), batch_images, seconds)
            rows.append((f"{decoder.name} (device)", resolution, "-", rate))
            rate = images_per_s(partial(decoder.decode_batch, batch), batch_images, seconds)
            rows.append((f"{decoder.name} (host)", resolution, "-", rate))
        decoder.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table (markdown) to stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds-per-cell", type=float, default=2.0)
    parser.add_argument("--batch-images", type=int, default=16)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quality", type=int, default=85)
    args = parser.parse_args(argv)
    jpegs, source = sample_jpegs(args.quality)
    sizes = ", ".join(f"{name} {len(data) // 1024} KiB" for name, data in jpegs.items())
    print(f"JPEG q{args.quality} from {source} ({sizes}); batches of {args.batch_images}\n")
    rows = cpu_rows(jpegs, args.batch_images, args.threads, args.seconds_per_cell)
    rows += gpu_rows(jpegs, args.batch_images, args.seconds_per_cell)
    print("| decoder | resolution | threads | images/s | ms/image |")
    print("|---|---|---|---|---|")
    for decoder, resolution, threads, rate in rows:
        print(f"| {decoder} | {resolution} | {threads} | {rate:.0f} | {1000 / rate:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
