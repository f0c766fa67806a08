"""The cloud engine: a `Detector` on the configured runtime, with what the batcher needs.

The runtime comes from `DetectorConfig.runtime`: ONNX Runtime with its execution providers in
order of preference (TensorRT EP, CUDA EP, CPU; unavailable ones are skipped), or a TensorRT
engine. `Engine.supported_batch_sizes()` tells the batcher which batch sizes run without
padding; `warm_up()` runs dummy batches at start so the first request does not pay for lazy
initialisation (CUDA context, cuDNN algorithm search, TensorRT EP engine builds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from cloud_service.config import TtaConfig
from cloud_service.decoders import BgrImage
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.letterbox import PAD_VALUE
from detection.runtimes.base import Runtime, create_runtime
from detection.runtimes.config import OnnxRuntimeConfig
from detection.slicing import SlicedDetector, SlicingConfig, merge_detections

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
# ONNX Runtime providers for an NVIDIA GPU, best first; the CPU provider stays as the fallback.
GPU_PROVIDERS: tuple[str, ...] = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    CPU_PROVIDER,
)


def available_onnx_providers() -> list[str]:
    """Execution providers of the installed ONNX Runtime (empty if it is not installed)."""
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def _log_provider_fallback(config: OnnxRuntimeConfig) -> None:
    available = available_onnx_providers()
    wanted_gpu = [p for p in config.providers if p != CPU_PROVIDER]
    missing = [p for p in wanted_gpu if p not in available]
    if wanted_gpu and len(missing) == len(wanted_gpu):
        logger.warning(
            "ONNX Runtime has none of the GPU providers %s (available: %s); the engine runs on %s",
            missing,
            available,
            [p for p in config.providers if p in available] or "no provider",
        )
    elif missing:
        logger.info("ONNX Runtime providers %s not available; using the next ones", missing)


def _dynamic_batch(runtime: Runtime) -> bool:
    """Whether the runtime accepts any batch size up to its `max_batch_size`."""
    if runtime.input_spec.max_batch_size is None:
        return True
    # TensorRT reports its profile's max for a dynamic engine too; the flag tells them apart.
    flag = getattr(runtime, "dynamic_batch", getattr(runtime, "_dynamic_batch", False))
    return bool(flag)


class Engine:
    """A detector plus its batch sizes and warm-up; `detect` makes it a `BatchDetector`.

    With `slicing` enabled, `detect` runs whole frames as native-scale tiles too
    (`detection.slicing.SlicedDetector`); batch sizes stay counted in frames. With `tta.flip`,
    each batch runs a second time mirrored and the two answers are merged per frame.
    """

    def __init__(
        self,
        runtime: Runtime,
        config: DetectorConfig,
        *,
        max_batch_size: int,
        slicing: SlicingConfig | None = None,
        tta: TtaConfig | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.detector = Detector(runtime, config)
        self.sliced: SlicedDetector | None = (
            SlicedDetector(self.detector, slicing)
            if slicing is not None and slicing.enabled
            else None
        )
        self.tta = tta or TtaConfig()
        self.runtime_name = runtime.name
        self._runtime = runtime
        self._max_batch_size = max_batch_size

    def supported_batch_sizes(self) -> list[int]:
        """Batch sizes that run unpadded: 1..max for a dynamic batch, else the fixed size.

        The max of a dynamic engine is the smaller of its own limit (TensorRT profile) and the
        batcher's `max_batch_size`; a fixed-batch engine runs its one size (smaller batches are
        zero-padded to it, larger ones split).
        """
        engine_max = self._runtime.input_spec.max_batch_size
        if not _dynamic_batch(self._runtime):
            return [int(engine_max or 1)]
        limit = (
            self._max_batch_size if engine_max is None else min(engine_max, self._max_batch_size)
        )
        return list(range(1, limit + 1))

    def warm_up(self, batch_sizes: Sequence[int] | None = None) -> dict[int, float]:
        """Run one blank batch of each size (default: smallest and largest supported); ms each."""
        sizes = self.supported_batch_sizes()
        chosen = sorted(set(batch_sizes if batch_sizes is not None else (sizes[0], sizes[-1])))
        height, width = self.detector.input_shape
        blank = np.full((height, width, 3), PAD_VALUE, dtype=np.uint8)
        timings_ms: dict[int, float] = {}
        for size in chosen:
            started = time.perf_counter()
            self.detector.detect([blank] * size)
            timings_ms[size] = (time.perf_counter() - started) * 1000.0
            logger.info(
                "warm-up on %s: batch %s in %.1f ms", self.runtime_name, size, timings_ms[size]
            )
        return timings_ms

    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """Detections per image (boxes in each image's pixels); `scale_up` False per image keeps
        small images (region crops) at their own scale instead of enlarging them; with slicing,
        whole frames larger than the model input also run as tiles; with `tta.flip`, mirrored
        too (see `flip_merged`)."""
        found = self._detect(images, scale_up)
        if not self.tta.flip:
            return found
        mirrors = [np.ascontiguousarray(image[:, ::-1]) for image in images]
        mirrored = self._detect(mirrors, scale_up)
        return [
            flip_merged(plain, other, image.shape[1], self.tta.merge_iou)
            for plain, other, image in zip(found, mirrored, images, strict=True)
        ]

    def _detect(
        self, images: Sequence[BgrImage], scale_up: bool | Sequence[bool]
    ) -> list[Detections]:
        if self.sliced is not None:
            return self.sliced.detect(images, scale_up=scale_up)
        return self.detector.detect(images, scale_up=scale_up)

    @property
    def answered_version(self) -> str | None:
        """The model version that answered the last call, where the runtime knows it (a
        Triton model under its version policy); None otherwise."""
        version = getattr(self._runtime, "answered_version", None)
        return version if isinstance(version, str) else None

    def close(self) -> None:
        """Release the runtime."""
        self.detector.close()


def flip_merged(plain: Detections, mirrored: Detections, width: int, iou: float) -> Detections:
    """One frame's answer from its own detections and those of its mirror image (`width` pixels
    wide): the mirror's boxes are flipped back, and of same-class boxes overlapping above `iou`
    the more confident is kept (greedy NMS)."""
    xyxy = mirrored.xyxy.copy()
    xyxy[:, 0] = width - mirrored.xyxy[:, 2]
    xyxy[:, 2] = width - mirrored.xyxy[:, 0]
    back = Detections(xyxy, mirrored.confidence, mirrored.class_id)
    return merge_detections(Detections.concatenate([plain, back]), "nms", "iou", iou)


def create_engine(
    config: DetectorConfig,
    *,
    max_batch_size: int,
    slicing: SlicingConfig | None = None,
    tta: TtaConfig | None = None,
) -> Engine:
    """Load the runtime that `config.runtime` names; `max_batch_size` caps dynamic batches.

    `slicing` (when enabled) wraps the detector in sliced inference; `tta.flip` detects each
    frame mirrored too.
    """
    if isinstance(config.runtime, OnnxRuntimeConfig):
        _log_provider_fallback(config.runtime)
    runtime = create_runtime(config.runtime)
    try:
        engine = Engine(runtime, config, max_batch_size=max_batch_size, slicing=slicing, tta=tta)
    except Exception:
        runtime.close()
        raise
    sizes = engine.supported_batch_sizes()
    logger.info(
        "engine %s: batch sizes %s..%s (%s)",
        runtime.name,
        sizes[0],
        sizes[-1],
        "dynamic" if len(sizes) > 1 or _dynamic_batch(runtime) else "fixed",
    )
    return engine
