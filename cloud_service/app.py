"""Wiring of the cloud service from its config: engine, processor, batcher, servicer, server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from cloud_service.batching import DynamicBatcher
from cloud_service.config import BatchingConfig, CloudServiceConfig
from cloud_service.decoders.base import Decoder
from cloud_service.decoders.factory import create_decoder
from cloud_service.engines import Engine, create_engine
from cloud_service.jpeg import BgrImage
from cloud_service.metrics import MetricsExporter, ServiceMetrics, start_metrics_exporter
from cloud_service.processor import (
    DetectorFrameProcessor,
    ModelInfo,
    ScaleAwareDetector,
)
from cloud_service.server import (
    DrainingServer,
    ServerBindError,
    create_server,
    serve_until_signalled,
)
from cloud_service.servicer import InferenceServicer
from detection.detections import Detections
from detection.detector import Detector
from detection.model_metadata import model_file_of, model_identity

logger = logging.getLogger(__name__)


class SerializedDetector:
    """Lets many gRPC worker threads share one detector: calls run one at a time.

    Interpreters such as LiteRT's are not thread-safe, and on one accelerator concurrent calls
    gain nothing over a batch.
    """

    def __init__(self, detector: ScaleAwareDetector) -> None:
        self._detector = detector
        self._lock = threading.Lock()

    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """Detect on `images` while holding the lock (`scale_up`: see `Engine.detect`)."""
        with self._lock:
            return self._detector.detect(images, scale_up=scale_up)


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
    """A built service: the server (not started), its port, the batcher and engine it owns."""

    server: DrainingServer
    port: int
    batcher: DynamicBatcher
    metrics: ServiceMetrics
    engine: Engine
    decoder: Decoder

    def close(self) -> None:
        """Stop the batcher, release the engine and the decoder's threads (after the server)."""
        self.batcher.stop(0.0)
        self.engine.close()
        self.decoder.close()


def batching_for(engine: Engine, config: BatchingConfig) -> BatchingConfig:
    """`config`, fitted to an engine that takes one fixed batch size (a fixed TensorRT profile,
    a fixed-batch ONNX): batches are formed at that size when enough frames wait."""
    sizes = engine.supported_batch_sizes()
    if len(sizes) != 1 or config.preferred_batch_sizes or sizes[0] > config.max_batch_size:
        return config
    return config.model_copy(update={"preferred_batch_sizes": sizes, "max_batch_size": sizes[0]})


def model_info(config: CloudServiceConfig, detector: Detector) -> ModelInfo:
    """What answers report about the model: `model_name` / `model_version` from the config, else
    from the model's metadata (else its file stem and "1"); class names from the detector (the
    config's `engine.class_names`, else the model's own)."""
    found = model_file_of(config.engine.runtime)
    name, version = model_identity(
        detector.metadata,
        found[1] if found is not None else None,
        config.model_name,
        config.model_version,
    )
    return ModelInfo(name=name, version=version, class_names=detector.class_names)


def build_service(config: CloudServiceConfig) -> CloudService:
    """Load and warm up the engine, then bind the server described by `config`.

    With `config.slicing` enabled the engine also runs whole frames as native-scale tiles.
    """
    engine = create_engine(
        config.engine, max_batch_size=config.batching.max_batch_size, slicing=config.slicing
    )
    warm_up_ms = engine.warm_up()
    logger.info("engine warm-up (batch size: ms): %s", warm_up_ms)
    model = model_info(config, engine.detector)
    logger.info(
        "serving model %s:%s (%d classes)", model.name, model.version, len(model.class_names)
    )
    decoder = create_decoder(config.decoder)
    processor = DetectorFrameProcessor(SerializedDetector(engine), model, decoder=decoder)
    metrics = ServiceMetrics(max_stream_labels=config.metrics.max_stream_labels)
    batcher = DynamicBatcher(processor, batching_for(engine, config.batching), metrics=metrics)
    servicer = InferenceServicer(
        batcher,
        max_stream_inflight_frames=config.batching.max_stream_inflight_frames,
        max_streams=config.server.max_frame_streams,
        metrics=metrics,
    )
    try:
        server, port = create_server(config.server, servicer)
    except Exception:
        engine.close()
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
    )


def _start_exporter(metrics: ServiceMetrics, config: CloudServiceConfig) -> MetricsExporter:
    host, port = config.metrics.listen_host, config.metrics.listen_port
    try:
        return start_metrics_exporter(metrics, host, port)
    except OSError as exc:
        raise ServerBindError(f"cannot bind metrics on {host}:{port}: {exc}") from exc


def serve(config: CloudServiceConfig) -> None:
    """Run the service until SIGTERM / SIGINT, then drain for the configured grace period."""
    service = build_service(config)
    logger.info("cloud service: %s (port %s)", config.summary(), service.port)
    exporter: MetricsExporter | None = None
    try:
        if config.metrics.enabled:
            exporter = _start_exporter(service.metrics, config)
        serve_until_signalled(service.server, config.server.grace_period_s)
    finally:
        service.close()
        if exporter is not None:
            exporter.close()
