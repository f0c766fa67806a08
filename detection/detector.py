"""`Detector`: frames in, `Detections` in source pixels out (letterbox, infer, decode, NMS).

Class names and box units come from the config where it sets them, else from the model file's
metadata (`detection.model_metadata`); the `classes:` filter is resolved against those names
when the detector is built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType

import numpy as np
import numpy.typing as npt

from detection.class_groups import group_ids, group_nms
from detection.config import DetectorConfig
from detection.decode import BoxUnits, decode_yolo
from detection.detections import Detections
from detection.errors import DetectionError
from detection.errors import ModelConfigError as ModelConfigError  # its home before errors.py
from detection.letterbox import LetterboxInfo, fitted_shape, letterbox_batch, scale_up_flags
from detection.model_metadata import (
    model_file_of,
    resolve_box_units,
    resolve_class_filter,
    resolve_class_names,
)
from detection.nms import batched_nms, nms
from detection.runtimes.base import Runtime, create_runtime, runtime_metadata

logger = logging.getLogger(__name__)


class InvalidImageError(DetectionError, ValueError):
    """A frame handed to the detector is not a BGR `uint8 (H, W, 3)` array."""


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


def _by_shape(runtimes: Sequence[Runtime]) -> dict[tuple[int, int], Runtime]:
    """Shape models by their fixed input (height, width); a dynamic or repeated shape is a
    `ModelConfigError`."""
    found: dict[tuple[int, int], Runtime] = {}
    for runtime in runtimes:
        spec = runtime.input_spec
        if spec.height is None or spec.width is None:
            raise ModelConfigError(
                f"shape_models must have a fixed input size; the {runtime.name} model's is dynamic"
            )
        shape = (spec.height, spec.width)
        if shape in found:
            raise ModelConfigError(f"two shape_models take {shape[1]}x{shape[0]}")
        found[shape] = runtime
    return found


def _model_label(runtime: Runtime, config: DetectorConfig) -> str:
    found = model_file_of(config.runtime)
    return f"the model {found[1].name}" if found is not None else f"the {runtime.name} model"


class Detector:
    """A YOLO model behind any `Runtime`, with the pre- and post-processing around it.

    Raises `ModelConfigError` when the config does not fit the model: input size, a
    `class_names` list of another length than the model's own (metadata `class_names`), a
    `classes:` filter naming an unknown class, or unreadable metadata.
    """

    def __init__(
        self,
        runtime: Runtime,
        config: DetectorConfig,
        shape_runtimes: Sequence[Runtime] = (),
    ) -> None:
        self._runtime = runtime
        self._config = config
        self._input_shape = _resolve_input_shape(runtime, config)
        spec = runtime.input_spec
        self._dynamic = spec.height is None or spec.width is None
        self._by_shape = _by_shape(shape_runtimes)
        self._fit = (self._dynamic or bool(self._by_shape)) and config.letterbox == "fit"
        self._metadata = runtime_metadata(runtime)
        model = _model_label(runtime, config)
        self._class_names = resolve_class_names(config.class_names, self._metadata, model)
        self._box_units: BoxUnits = resolve_box_units(config.box_units, self._metadata)
        kept = resolve_class_filter(config.classes, self._class_names, model)
        self._kept_classes = None if kept is None else np.asarray(kept, dtype=np.int64)
        self._num_classes = len(self._class_names) or None
        self._groups = group_ids(config.class_groups, self._class_names)
        logger.info(
            "detector on %s, input %s%s, %s classes%s, confidence >= %s, IoU %s",
            runtime.name,
            self._input_shape,
            (" (fitted to each frame's shape)" if self._fit else "")
            + "".join(f", {w}x{h} frames on its {h}x{w} model" for h, w in self._by_shape),
            len(self._class_names) or "unnamed",
            f" (keeping {', '.join(config.classes)})" if config.classes else "",
            config.confidence_threshold,
            config.iou_threshold,
        )

    @classmethod
    def from_config(cls, config: DetectorConfig) -> Detector:
        """Load the runtime named in `config` (and its `shape_models`) and wrap them."""
        runtimes = [create_runtime(config.runtime)]
        try:
            runtimes += [create_runtime(shape_model) for shape_model in config.shape_models]
            return cls(runtimes[0], config, runtimes[1:])
        except Exception:
            for runtime in runtimes:
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

    @property
    def class_groups(self) -> tuple[tuple[int, ...], ...]:
        """The config's `class_groups` as class ids of this model (groups it lacks dropped)."""
        return self._groups

    @property
    def class_names(self) -> tuple[str, ...]:
        """Name of each class id: the config's `class_names`, else the model's; may be empty."""
        return self._class_names

    @property
    def kept_class_ids(self) -> tuple[int, ...] | None:
        """Class ids the config's `classes` filter keeps (detections of others are dropped);
        None where it keeps every class."""
        return None if self._kept_classes is None else tuple(int(c) for c in self._kept_classes)

    def class_name(self, class_id: int) -> str:
        """The name of `class_id`, or its number where the classes have no names."""
        if 0 <= class_id < len(self._class_names):
            return self._class_names[class_id]
        return str(class_id)

    @property
    def metadata(self) -> Mapping[str, str]:
        """The model file's metadata (empty where the runtime reads none)."""
        return self._metadata

    @property
    def box_units(self) -> BoxUnits:
        """Units of the model's boxes: the config's, else the model's metadata, else `auto`."""
        return self._box_units

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
        flags = scale_up_flags(scale_up, len(images))
        shapes = self.input_shapes_for(images, flags)
        results: list[Detections | None] = [None] * len(images)
        for shape in dict.fromkeys(shapes):  # one run per input shape, in order of appearance
            members = [i for i, s in enumerate(shapes) if s == shape]
            batch, infos = letterbox_batch(
                [images[i] for i in members], shape, scale_up=[flags[i] for i in members]
            )
            candidates = decode_yolo(
                self._infer(batch, shape),
                shape,
                self._config.confidence_threshold,
                self._box_units,
                num_classes=self._num_classes,
            )
            for i, found, info in zip(members, candidates, infos, strict=True):
                results[i] = self._postprocess(found, info)
        return [r for r in results if r is not None]

    def input_shapes_for(
        self, images: Sequence[npt.NDArray[np.uint8]], scale_up: Sequence[bool]
    ) -> list[tuple[int, int]]:
        """The model input (h, w) each image goes in at: `input_shape`, or with `letterbox:
        fit` on a dynamic-shape model the stride-aligned rectangle that holds it."""
        if not self._fit:
            return [self._input_shape] * len(images)
        shapes = [
            fitted_shape(
                (int(image.shape[0]), int(image.shape[1])), self._input_shape, scale_up=flag
            )
            for image, flag in zip(images, scale_up, strict=True)
        ]
        if self._dynamic:
            return shapes
        # a fixed-shape main model: a fitted shape only where a shape model takes it
        return [shape if shape in self._by_shape else self._input_shape for shape in shapes]

    def _infer(
        self, batch: npt.NDArray[np.float32], shape: tuple[int, int]
    ) -> npt.NDArray[np.float32]:
        runtime = self._by_shape.get(shape, self._runtime)
        size = runtime.input_spec.max_batch_size or batch.shape[0]
        parts = [runtime.infer(batch[i : i + size]) for i in range(0, batch.shape[0], size)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _postprocess(self, candidates: Detections, info: LetterboxInfo) -> Detections:
        if self._kept_classes is not None and len(candidates):
            candidates = candidates[np.isin(candidates.class_id, self._kept_classes)]
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
        if self._groups and not self._config.class_agnostic_nms:
            merged = group_nms(
                candidates.xyxy[keep],
                candidates.confidence[keep],
                candidates.class_id[keep],
                self._groups,
                self._config.class_group_iou,
            )
            keep = keep[merged]
        kept = candidates[keep[: self._config.max_detections]]
        return Detections(
            xyxy=info.to_source(kept.xyxy), confidence=kept.confidence, class_id=kept.class_id
        )

    def close(self) -> None:
        """Release the runtime (and the shape models')."""
        self._runtime.close()
        for runtime in self._by_shape.values():
            runtime.close()

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
