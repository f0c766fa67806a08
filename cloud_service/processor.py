"""`DetectorFrameProcessor`: decode, check deadlines and run a detector on a batch of requests."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import grpc

from cloud_service.convert import detections_to_proto, status_to_proto
from cloud_service.decoders import BgrImage, CpuDecoder, Decoder, JpegLimits
from cloud_service.decoders.video import VideoDecoder
from cloud_service.frames import FrameRejected, PreparedFrame, keep_reference, prepare_frames
from cloud_service.models import ModelInfo, ModelTable, ScaleAwareDetector, ServedModel
from detection.detections import Detections
from detection.errors import InferenceUnavailableError
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_to_seconds

logger = logging.getLogger(__name__)


class BatchDetector(Protocol):
    """Anything that detects objects on a batch of BGR images (boxes in each image's pixels)."""

    def detect(self, images: Sequence[BgrImage]) -> list[Detections]:
        """One `Detections` per image, in order."""
        ...


def accepts_scale_up(detector: BatchDetector) -> bool:
    """Whether `detector.detect` takes a `scale_up` keyword (or any keyword, `**kwargs`)."""
    try:
        parameters = inspect.signature(detector.detect).parameters.values()
    except (TypeError, ValueError):  # builtins or C callables without a signature
        return False
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(
        (p.name == "scale_up" and p.kind in keyword) or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in parameters
    )


@dataclass
class PreparedBatch:
    """A batch between `prepare` and `finish`: a result per request, decoded frames by index."""

    results: list[pb.FrameResult]
    frames: dict[int, PreparedFrame] = field(default_factory=dict)
    started: float = 0.0  # perf_counter() when preparing began


def empty_result(request: pb.FrameRequest) -> pb.FrameResult:
    """A result echoing the identity fields of `request`, status OK, nothing else set."""
    result = pb.FrameResult(
        agent_id=request.agent_id,
        camera_id=request.camera_id,
        frame_id=request.frame_id,
        request_id=request.request_id,
        status=status_to_proto(grpc.StatusCode.OK),
    )
    if request.HasField("capture_time"):
        result.capture_time.CopyFrom(request.capture_time)
    return result


def error_result(request: pb.FrameRequest, code: grpc.StatusCode, message: str) -> pb.FrameResult:
    """A result for `request` carrying a per-frame error status."""
    result = empty_result(request)
    result.status.CopyFrom(status_to_proto(code, message))
    return result


class DetectorFrameProcessor:
    """Processes a batch of requests with one detector call; one result per request, in order.

    Frames past their deadline get DEADLINE_EXCEEDED and are neither decoded nor detected (a video
    packet is decoded all the same, since later packets of its session reference it); frames
    with bad JPEG, video or regions get INVALID_ARGUMENT, a video packet whose reference is
    missing FAILED_PRECONDITION with `keyframe_required`; a detector failure gives INTERNAL to
    the frames of that call only. Deadlines are wall-clock (`clock`, default `time.time`).

    The JPEGs of all live frames go to `decoder` in one batch call. Without a `decoder`, a
    one-thread CPU decoder with `limits` is used; a `decoder` carries its own limits.

    Whole frames and region crops go to the detector in one call; region crops are run at native
    scale (`scale_up=False` for them, see `ScaleAwareDetector`), whole frames are letterboxed as
    before.
    """

    def __init__(
        self,
        detector: BatchDetector | ModelTable,
        model: ModelInfo | None = None,
        *,
        decoder: Decoder | None = None,
        limits: JpegLimits | None = None,
        videos: VideoDecoder | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if decoder is not None and limits is not None and limits != decoder.limits:
            raise ValueError(f"limits {limits} differ from the decoder's {decoder.limits}")
        if isinstance(detector, ModelTable):
            self._models = detector
        else:
            if model is None:
                raise ValueError("a detector needs its ModelInfo")
            self._models = ModelTable(ServedModel(_scale_aware(detector), model))
        self._decoder: Decoder = (
            decoder if decoder is not None else CpuDecoder(limits=limits or JpegLimits())
        )
        self._videos = videos
        self._clock = clock

    @property
    def videos(self) -> VideoDecoder | None:
        """The video uplink decoders (None: this processor takes JPEG only)."""
        return self._videos

    @property
    def models(self) -> ModelTable:
        """The models answering (swap them with `models.replace`)."""
        return self._models

    def process(self, requests: Sequence[pb.FrameRequest]) -> list[pb.FrameResult]:
        """Decode, detect and build one `FrameResult` per request (same order)."""
        return self.finish(self.prepare(requests))

    def skip(self, requests: Sequence[pb.FrameRequest]) -> list[bool]:
        """Frames that will not be answered (they expired in the batcher's queue): decode their
        video packets all the same, in order, so the next packets of their sessions still find
        their reference. Per request, whether its session needs a keyframe now."""
        return [keep_reference(request, self._videos) for request in requests]

    def prepare(self, requests: Sequence[pb.FrameRequest]) -> PreparedBatch:
        """Stage 1: reject late frames and decode the others (no detector call).

        A pipelined batcher can prepare the next batch while `finish` runs the current one.
        """
        results = [empty_result(request) for request in requests]
        batch = PreparedBatch(results=results, started=time.perf_counter())
        now = self._clock()
        live: list[int] = []
        for index, request in enumerate(requests):
            if request.HasField("deadline") and timestamp_to_seconds(request.deadline) <= now:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                self._reject(batch.results[index], code, "deadline passed")
                # a video packet is decoded all the same: later packets of its session need it
                batch.results[index].keyframe_required = keep_reference(request, self._videos)
            else:
                live.append(index)
        frames = prepare_frames([requests[i] for i in live], self._decoder, self._videos)
        for index, outcome in zip(live, frames, strict=True):
            if isinstance(outcome, FrameRejected):
                self._reject(batch.results[index], outcome.code, outcome.message)
                batch.results[index].keyframe_required = outcome.keyframe_required
            else:
                batch.frames[index] = outcome
        return batch

    def finish(self, batch: PreparedBatch) -> list[pb.FrameResult]:
        """Stage 2: one detector call on the decoded frames; the results with their timings."""
        results, prepared = batch.results, batch.frames
        inference_ms = self._detect(prepared, results)
        total_ms = (time.perf_counter() - batch.started) * 1000.0
        for index, result in enumerate(results):
            frame = prepared.get(index)
            result.timings.decode_time_ms = frame.decode_time_ms if frame else 0.0
            result.timings.inference_time_ms = inference_ms if frame else 0.0
            result.timings.total_time_ms = total_ms
        return results

    def _reject(self, result: pb.FrameResult, code: grpc.StatusCode, message: str) -> None:
        logger.debug(
            "frame %s/%s rejected: %s %s", result.camera_id, result.frame_id, code.name, message
        )
        result.status.CopyFrom(status_to_proto(code, message))

    def _detect(self, prepared: dict[int, PreparedFrame], results: list[pb.FrameResult]) -> float:
        """Run each model once on the images of its frames; fill results; return the time."""
        if not prepared:
            return 0.0
        indices = list(prepared)
        frames = [(results[i].agent_id, results[i].camera_id, results[i].frame_id) for i in indices]
        chosen = self._models.checkout(frames)
        try:
            groups: dict[int, tuple[ServedModel, list[int]]] = {}
            for index, model in zip(indices, chosen, strict=True):
                groups.setdefault(id(model), (model, []))[1].append(index)
            return sum(
                self._detect_with(model, {i: prepared[i] for i in group}, results)
                for model, group in groups.values()
            )
        finally:
            self._models.release(chosen)

    def _detect_with(
        self, model: ServedModel, prepared: dict[int, PreparedFrame], results: list[pb.FrameResult]
    ) -> float:
        images = [image for frame in prepared.values() for image in frame.images]
        if not images:
            return 0.0
        scale_up = [mapping.scale_up for frame in prepared.values() for mapping in frame.mappings]
        started = time.perf_counter()
        try:
            found = model.detector.detect(images, scale_up=scale_up)
            version = model.version()
            if len(found) != len(images):
                raise RuntimeError(
                    f"detector returned {len(found)} results for {len(images)} images"
                )
        except InferenceUnavailableError as exc:
            logger.warning("engine unavailable for a batch of %s images: %s", len(images), exc)
            for index in prepared:
                self._reject(results[index], grpc.StatusCode.UNAVAILABLE, f"engine: {exc}")
            return (time.perf_counter() - started) * 1000.0
        except Exception:
            logger.exception("detector failed on a batch of %s images", len(images))
            for index in prepared:
                self._reject(results[index], grpc.StatusCode.INTERNAL, "detector failed")
            return (time.perf_counter() - started) * 1000.0
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        cursor = 0
        for index, frame in prepared.items():
            result = results[index]
            for image_index, mapping in enumerate(frame.mappings):
                boxes = frame.to_source(image_index, found[cursor])
                cursor += 1
                result.detections.extend(
                    detections_to_proto(boxes, model.info.class_names, mapping.region_index)
                )
            result.model_name = model.info.name
            result.model_version = version
        return elapsed_ms


class _PlainDetector:
    """A `BatchDetector` without `scale_up` as a `ScaleAwareDetector`: region crops are then
    enlarged to the model input like whole frames (warned once)."""

    def __init__(self, detector: BatchDetector) -> None:
        self._detector = detector
        self._warned = False

    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """`detector.detect(images)`, ignoring `scale_up`."""
        upscaled = scale_up is False or (not isinstance(scale_up, bool) and not all(scale_up))
        if upscaled and not self._warned:
            self._warned = True
            logger.warning(
                "%s.detect takes no scale_up: region crops are enlarged to the model input "
                "like whole frames, which hurts their accuracy",
                type(self._detector).__name__,
            )
        return self._detector.detect(images)


def _scale_aware(detector: BatchDetector) -> ScaleAwareDetector:
    """`detector` itself when its `detect` takes `scale_up`, else wrapped."""
    if accepts_scale_up(detector):
        return cast(ScaleAwareDetector, detector)
    return _PlainDetector(detector)
