"""Wiring of the cloud service from its config: engine -> frame processor -> servicer -> server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from cloud_service.config import CloudServiceConfig
from cloud_service.jpeg import BgrImage, JpegLimits
from cloud_service.processor import BatchDetector, DetectorFrameProcessor, ModelInfo
from cloud_service.server import DrainingServer, create_server, serve_until_signalled
from cloud_service.servicer import InferenceServicer
from detection.detections import Detections
from detection.detector import Detector

logger = logging.getLogger(__name__)


class SerializedDetector:
    """Lets many gRPC worker threads share one detector: calls run one at a time.

    Interpreters such as LiteRT's are not thread-safe, and on one accelerator concurrent calls
    gain nothing over a batch.
    """

    def __init__(self, detector: BatchDetector) -> None:
        self._detector = detector
        self._lock = threading.Lock()

    def detect(self, images: Sequence[BgrImage]) -> list[Detections]:
        """Detect on `images` while holding the lock."""
        with self._lock:
            return self._detector.detect(images)


@dataclass
class CloudService:
    """A built, not yet started service: the server, its bound port and the engine it owns."""

    server: DrainingServer
    port: int
    detector: Detector

    def close(self) -> None:
        """Release the engine (call after the server has stopped)."""
        self.detector.close()


def build_service(config: CloudServiceConfig) -> CloudService:
    """Load the engine and bind the server described by `config`."""
    detector = Detector.from_config(config.engine)
    model = ModelInfo(
        name=config.model_name,
        version=config.model_version,
        class_names=tuple(config.engine.class_names),
    )
    processor = DetectorFrameProcessor(
        SerializedDetector(detector), model, limits=JpegLimits.from_config(config.decoder)
    )
    servicer = InferenceServicer(processor, max_stream_batch_frames=config.batching.max_batch_size)
    server, port = create_server(config.server, servicer)
    return CloudService(server=server, port=port, detector=detector)


def serve(config: CloudServiceConfig) -> None:
    """Run the service until SIGTERM / SIGINT, then drain for the configured grace period."""
    service = build_service(config)
    logger.info("cloud service: %s (port %s)", config.summary(), service.port)
    try:
        serve_until_signalled(service.server, config.server.grace_period_s)
    finally:
        service.close()
