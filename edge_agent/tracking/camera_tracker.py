"""`CameraTracker`: one camera's DeepSORT tracker together with its appearance embedder.

The pipeline, the tracking evaluation and the benchmarks all drive tracking through this class,
so the way embeddings are computed (every box, or only the ones matching needs) lives in one place.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.embedders import Embedder, NoEmbedder
from edge_agent.tracking.tracker import DeepSortTracker


class CameraTracker:
    """Tracks the detections of one camera, frame after frame."""

    def __init__(self, tracker: DeepSortTracker, embedder: Embedder | None = None) -> None:
        self.tracker = tracker
        self.embedder: Embedder = embedder if embedder is not None else NoEmbedder()
        self.embedded_boxes = 0  # boxes the embedder was run on, for metrics and benchmarks

    @classmethod
    def from_config(
        cls, config: TrackerConfig, confidence_threshold: float, embedder: Embedder | None = None
    ) -> CameraTracker:
        """A tracker with the `tracker:` settings and the given embedder (none: IoU only)."""
        return cls(DeepSortTracker.from_config(config, confidence_threshold), embedder)

    def update(self, frame: npt.NDArray[np.uint8], detections: Detections) -> Detections:
        """Advance one frame; returns `detections` with `tracker_id` filled in (-1: untracked)."""
        embeddings = None
        if len(detections) and not isinstance(self.embedder, NoEmbedder):
            embeddings = self.embedder.embed(frame, detections.xyxy)
            self.embedded_boxes += len(detections)
        return self.tracker.update(detections, embeddings)
