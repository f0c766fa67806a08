"""`Detector`: frames in, `Detections` in source pixels out (letterbox, infer, decode, NMS)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType

import numpy as np
import numpy.typing as npt

from detection.config import DetectorConfig
from detection.decode import decode_yolo
from detection.detections import Detections
from detection.errors import DetectionError
from detection.letterbox import LetterboxInfo, letterbox_batch
from detection.nms import batched_nms, nms
from detection.runtimes.base import Runtime, create_runtime

logger = logging.getLogger(__name__)


class InvalidImageError(DetectionError, ValueError):
    """A frame handed to the detector is not a BGR `uint8 (H, W, 3)` array."""


class ModelConfigError(DetectionError, ValueError):
    """The detector config does not fit the loaded model (e.g. its input size)."""


def _check_images(images: Sequence[npt.NDArray[np.uint8]]) -> None:
    for i, image in enumerate(images):
        if not isinstance(image, np.ndarray):
            raise InvalidImageError(f"image {i}: expected numpy array, got {type(image).__name__}")
        if image.dtype != np.uint8:
            raise InvalidImageError(f"image {i}: expected dtype uint8, got {image.dtype}")
        if image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
            raise InvalidImageError(f"image {i}: expected shape (H, W, 3) BGR, got {image.shape}")


def _resolve_input_shape(runtime: Runtime, config: DetectorConfig) -> tuple[int, int]:
    spec = runtime.input_spec
    if spec.height is None or spec.width is None:
        if config.input_size is None:
            raise ModelConfigError(
                f"the {runtime.name} model has a dynamic input size; set input_size (h, w)"
            )
        return config.input_size
    model_size = (spec.height, spec.width)
    if config.input_size is not None and config.input_size != model_size:
        raise ModelConfigError(
            f"input_size {config.input_size} does not match the model's fixed size {model_size}"
        )
    return model_size


class Detector:
    """A YOLO model behind any `Runtime`, with the pre- and post-processing around it."""

    def __init__(self, runtime: Runtime, config: DetectorConfig) -> None:
        self._runtime = runtime
        self._config = config
        self._input_shape = _resolve_input_shape(runtime, config)
        self._num_classes = len(config.class_names) or None
        logger.info(
            "detector on %s, input %s, confidence >= %s, IoU %s",
            runtime.name,
            self._input_shape,
            config.confidence_threshold,
            config.iou_threshold,
        )

    @classmethod
    def from_config(cls, config: DetectorConfig) -> Detector:
        """Load the runtime named in `config` and wrap it."""
        runtime = create_runtime(config.runtime)
        try:
            return cls(runtime, config)
        except Exception:
            runtime.close()
            raise

    @property
    def input_shape(self) -> tuple[int, int]:
        """Model input (height, width) the frames are letterboxed to."""
        return self._input_shape

    @property
    def config(self) -> DetectorConfig:
        """The config this detector was built from."""
        return self._config

    def detect(
        self,
        images: Sequence[npt.NDArray[np.uint8]],
        *,
        scale_up: bool | Sequence[bool] = True,
    ) -> list[Detections]:
        """Detect objects in BGR `uint8 (H, W, 3)` frames; boxes in each frame's own pixels.

        `scale_up` (one flag, or one per image): whether an image smaller than the model input
        is enlarged to fit it (the default, for whole frames) or run at its native scale, centred
        on the padding (False: crops such as escalated regions, so objects keep the size the
        model learned them at). Images larger than the input always shrink to fit.
        """
        if len(images) == 0:
            return []
        _check_images(images)
        batch, infos = letterbox_batch(images, self._input_shape, scale_up=scale_up)
        output = self._infer(batch)
        candidates = decode_yolo(
            output,
            self._input_shape,
            self._config.confidence_threshold,
            self._config.box_units,
            num_classes=self._num_classes,
        )
        return [self._postprocess(c, info) for c, info in zip(candidates, infos, strict=True)]

    def _infer(self, batch: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        size = self._runtime.input_spec.max_batch_size or batch.shape[0]
        parts = [self._runtime.infer(batch[i : i + size]) for i in range(0, batch.shape[0], size)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _postprocess(self, candidates: Detections, info: LetterboxInfo) -> Detections:
        if len(candidates) == 0:
            return candidates
        top = np.argsort(-candidates.confidence, kind="stable")[: self._config.max_nms_candidates]
        candidates = candidates[top]
        if self._config.class_agnostic_nms:
            keep = nms(candidates.xyxy, candidates.confidence, self._config.iou_threshold)
        else:
            keep = batched_nms(
                candidates.xyxy,
                candidates.confidence,
                candidates.class_id,
                self._config.iou_threshold,
            )
        kept = candidates[keep[: self._config.max_detections]]
        return Detections(
            xyxy=info.to_source(kept.xyxy), confidence=kept.confidence, class_id=kept.class_id
        )

    def close(self) -> None:
        """Release the runtime."""
        self._runtime.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Detector(runtime={self._runtime.name!r}, input_shape={self._input_shape})"
