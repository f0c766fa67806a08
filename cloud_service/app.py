"""Wiring of the cloud service from its config: engine, processor, batcher, servicer, server."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cloud_service.batching import DynamicBatcher
from cloud_service.config import BatchingConfig, CloudServiceConfig, DecoderConfig
from cloud_service.decoders.base import BgrImage, Decoder
from cloud_service.decoders.factory import create_decoder
from cloud_service.decoders.video import VideoLimits, VideoSessions
from cloud_service.engines import Engine, create_engine
from cloud_service.metrics import MetricsExporter, ServiceMetrics, start_metrics_exporter
from cloud_service.models import ModelInfo, ModelTable, ServedModel, TrafficSplit
from cloud_service.processor import DetectorFrameProcessor
from cloud_service.server import (
    DrainingServer,
    ServerBindError,
    create_server,
    serve_until_signalled,
)
from cloud_service.servicer import InferenceServicer
from configkit.signals import set_on_signals
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.model_metadata import model_file_of, model_identity
from detection.runtimes.config import TritonConfig

logger = logging.getLogger(__name__)


class SerializedDetector:
    """Lets many gRPC worker threads share one detector: calls run one at a time.

    Interpreters such as LiteRT's are not thread-safe, and on one accelerator concurrent calls
    gain nothing over a batch.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """Detect on `images` while holding the lock (`scale_up`: see `Engine.detect`)."""
        with self._lock:
            return self.engine.detect(images, scale_up=scale_up)


class BatcherDrainingServer(DrainingServer):
    """A `DrainingServer` whose `stop` first makes the batcher drain within the same grace.

    New frames are then answered UNAVAILABLE while queued ones finish and stream to their callers.
    """

    def __init__(self, server: DrainingServer, batcher: DynamicBatcher) -> None:
        super().__init__(server, server.health)
        self._batcher = batcher

    def stop(self, grace: float | None) -> threading.Event:
        """Drain the batcher for `grace` seconds while the gRPC server drains its calls."""
        self._batcher.begin_drain(grace or 0.0)
        return super().stop(grace)


@dataclass
class CloudService:
    """A built service: the server (not started), its port, the batcher and the models it owns.

    `engine` is the stable engine it started with; `models` holds what answers now (`reload`
    swaps it).
    """

    server: DrainingServer
    port: int
    batcher: DynamicBatcher
    metrics: ServiceMetrics
    engine: Engine
    decoder: Decoder
    models: ModelTable
    config: CloudServiceConfig

    def reload(self, config: CloudServiceConfig) -> bool:
        """Load the models of `config` and swap them in without dropping a frame.

        Only the model sections change live (`engine`, `candidate`, `slicing`, `model_name`,
        `model_version`); other changes are logged as needing a restart. The new models are
        loaded and warmed up while the old ones keep answering; a load that fails leaves the old
        ones in place (logged). Returns whether the models were swapped.
        """
        if _model_sections(config) == _model_sections(self.config):
            logger.info("reload: the model sections are unchanged")
            _warn_restart_needed(self.config, config)
            return False
        try:
            stable, candidate, split = build_models(config)
        except Exception:
            logger.exception("reload: loading the new models failed; the old ones keep answering")
            return False
        self.models.replace(stable, candidate, split)
        _warn_restart_needed(self.config, config)
        self.config = self.config.model_copy(
            update={name: getattr(config, name) for name in _MODEL_SECTIONS}
        )
        return True

    def close(self) -> None:
        """Stop the batcher, release the models and the decoder's threads (after the server)."""
        self.batcher.stop(0.0)
        self.models.close()
        self.decoder.close()


_MODEL_SECTIONS = ("engine", "candidate", "slicing", "tta", "model_name", "model_version")


def _model_sections(config: CloudServiceConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in _MODEL_SECTIONS}


def _warn_restart_needed(old: CloudServiceConfig, new: CloudServiceConfig) -> None:
    changed = [
        name
        for name in type(new).model_fields
        if name not in _MODEL_SECTIONS and getattr(old, name) != getattr(new, name)
    ]
    if changed:
        logger.warning("reload: %s changed; these take effect on a restart", ", ".join(changed))


def batching_for(engine: Engine, config: BatchingConfig) -> BatchingConfig:
    """`config`, fitted to an engine that takes one fixed batch size (a fixed TensorRT profile,
    a fixed-batch ONNX): batches are formed at that size when enough frames wait."""
    sizes = engine.supported_batch_sizes()
    if len(sizes) != 1 or config.preferred_batch_sizes or sizes[0] > config.max_batch_size:
        return config
    return config.model_copy(update={"preferred_batch_sizes": sizes, "max_batch_size": sizes[0]})


def model_info(
    config: CloudServiceConfig,
    detector: Detector,
    *,
    engine: DetectorConfig | None = None,
    name: str | None = None,
    version: str | None = None,
) -> ModelInfo:
    """What answers report about the model: `model_name` / `model_version` from the config, else
    from the model's metadata (else its file stem and "1"); class names from the detector (the
    config's `engine.class_names`, else the model's own). `engine`, `name` and `version` stand
    for the config's own for another model (the candidate)."""
    runtime = (engine or config.engine).runtime
    found = model_file_of(runtime)
    stem = found[1] if found is not None else None
    if isinstance(runtime, TritonConfig):
        stem = Path(runtime.model_name)
    model_name, model_version = model_identity(
        detector.metadata,
        stem,
        name if engine is not None else config.model_name,
        version if engine is not None else config.model_version,
    )
    return ModelInfo(name=model_name, version=model_version, class_names=detector.class_names)


def _served(engine: Engine, info: ModelInfo, configured_version: str | None) -> ServedModel:
    """`engine` as a served model; answers report the version the engine says answered
    (Triton's) unless the config names the version itself."""
    return ServedModel(
        detector=SerializedDetector(engine),
        info=info,
        answered_version=(
            (lambda: engine.answered_version) if configured_version is None else lambda: None
        ),
        close=engine.close,
    )


def _load_engine(config: CloudServiceConfig, detector_config: DetectorConfig, what: str) -> Engine:
    engine = create_engine(
        detector_config,
        max_batch_size=config.batching.max_batch_size,
        slicing=config.slicing,
        tta=config.tta,
    )
    try:
        warm_up_ms = engine.warm_up()
    except Exception:
        engine.close()
        raise
    logger.info("%s engine warm-up (batch size: ms): %s", what, warm_up_ms)
    return engine


def build_models(
    config: CloudServiceConfig,
) -> tuple[ServedModel, ServedModel | None, TrafficSplit | None]:
    """Load and warm up the stable model and the candidate of `config` (if any)."""
    engine = _load_engine(config, config.engine, "stable")
    stable = _served(engine, model_info(config, engine.detector), config.model_version)
    if config.candidate is None:
        return stable, None, None
    candidate_config = config.candidate
    try:
        candidate_engine = _load_engine(config, candidate_config.engine, "candidate")
    except Exception:
        engine.close()
        raise
    info = model_info(
        config,
        candidate_engine.detector,
        engine=candidate_config.engine,
        name=candidate_config.model_name,
        version=candidate_config.model_version,
    )
    split = TrafficSplit(candidate_config.share, candidate_config.assign_by)
    return stable, _served(candidate_engine, info, candidate_config.model_version), split


def build_service(config: CloudServiceConfig) -> CloudService:
    """Load and warm up the models, then bind the server described by `config`.

    With `config.slicing` enabled the engines also run whole frames as native-scale tiles; with
    `config.candidate`, a share of the frames goes to the candidate model.
    """
    stable, candidate, split = build_models(config)
    models = ModelTable(stable, candidate, split)
    for model in models.models:
        logger.info(
            "serving model %s:%s (%d classes)",
            model.info.name,
            model.version(),
            len(model.info.class_names),
        )
    engine = cast(SerializedDetector, stable.detector).engine
    decoder = create_decoder(config.decoder)
    metrics = ServiceMetrics(
        max_stream_labels=config.metrics.max_stream_labels,
        stream_label_idle_s=config.metrics.stream_label_idle_s,
    )
    videos = video_sessions(config.decoder, metrics)
    processor = DetectorFrameProcessor(models, decoder=decoder, videos=videos)
    batcher = DynamicBatcher(processor, batching_for(engine, config.batching), metrics=metrics)
    servicer = InferenceServicer(
        batcher,
        max_stream_inflight_frames=config.batching.max_stream_inflight_frames,
        max_streams=config.server.max_frame_streams,
        metrics=metrics,
        uplink_codecs=videos.codecs if videos is not None else (),
    )
    try:
        server, port = create_server(config.server, servicer)
    except Exception:
        models.close()
        decoder.close()
        raise
    batcher.start()
    return CloudService(
        server=BatcherDrainingServer(server, batcher),
        port=port,
        batcher=batcher,
        metrics=metrics,
        engine=engine,
        decoder=decoder,
        models=models,
        config=config,
    )


def video_sessions(config: DecoderConfig, metrics: ServiceMetrics) -> VideoSessions | None:
    """The video uplink decoders of `config.video`; None when no codec is enabled."""
    video = config.video
    if not video.codecs:
        return None
    return VideoSessions(
        VideoLimits.from_config(config), codecs=video.codecs, on_event=metrics.observe_video_packet
    )


def _start_exporter(metrics: ServiceMetrics, config: CloudServiceConfig) -> MetricsExporter:
    host, port = config.metrics.listen_host, config.metrics.listen_port
    try:
        return start_metrics_exporter(metrics, host, port)
    except OSError as exc:
        raise ServerBindError(f"cannot bind metrics on {host}:{port}: {exc}") from exc


def _reload_on_hangup(
    service: CloudService,
    load: Callable[[], CloudServiceConfig],
    hangup: threading.Event,
    stop: threading.Event,
) -> None:
    """Reload the config on each SIGHUP until `stop`; a bad config is logged and ignored."""
    while not stop.is_set():
        if not hangup.wait(0.5):
            continue
        hangup.clear()
        try:
            config = load()
        except Exception as exc:  # a config error must not stop the service
            logger.error("reload: the config was not loaded, nothing changed: %s", exc)
            continue
        service.reload(config)


def startup_line(config: CloudServiceConfig, service: CloudService) -> str:
    """The start-up log line, naming the models as loaded (the name and version a model file
    gives itself), not the config's `<metadata>` placeholders."""
    served = ", ".join(f"{model.info.name}:{model.version()}" for model in service.models.models)
    return f"cloud service: {config.summary(served)} (port {service.port})"


def serve(
    config: CloudServiceConfig, *, reload_config: Callable[[], CloudServiceConfig] | None = None
) -> None:
    """Run the service until SIGTERM / SIGINT, then drain for the configured grace period.

    With `reload_config`, SIGHUP reads the config again and swaps in its models
    (`CloudService.reload`) while serving.
    """
    service = build_service(config)
    logger.info("%s", startup_line(config, service))
    exporter: MetricsExporter | None = None
    stop, hangup = threading.Event(), threading.Event()
    reloader: threading.Thread | None = None
    try:
        if config.metrics.enabled:
            exporter = _start_exporter(service.metrics, config)
        with set_on_signals(hangup, [signal.SIGHUP], what="reloading the models"):
            if reload_config is not None:
                reloader = threading.Thread(
                    target=_reload_on_hangup,
                    args=(service, reload_config, hangup, stop),
                    name="config-reload",
                    daemon=True,
                )
                reloader.start()
            serve_until_signalled(service.server, config.server.grace_period_s, stop_event=stop)
    finally:
        stop.set()
        if reloader is not None:
            reloader.join()
        service.close()
        if exporter is not None:
            exporter.close()
