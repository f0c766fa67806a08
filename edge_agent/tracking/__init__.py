"""Per-camera multi-object tracking: DeepSORT (Kalman + appearance cascade + IoU) with a
ByteTrack-style second pass (`DeepSortTracker`, `Track`), and the same tracker with the cloud's
evidence about its tracks (`FusedTracker`, `CloudTrack`, `CloudEvidence`) that fusion drives.
Pure algorithms, no I/O."""

from edge_agent.tracking.camera_tracker import CameraTracker
from edge_agent.tracking.cloud_evidence import CloudEvidence, CloudTerms, CloudTrack
from edge_agent.tracking.cnn_embedder import MobileNetV2Embedder
from edge_agent.tracking.embedders import (
    Embedder,
    HistogramEmbedder,
    NoEmbedder,
    build_embedder,
)
from edge_agent.tracking.fused_tracker import FusedTracker
from edge_agent.tracking.kalman import CHI2INV95, KalmanFilter, xyah_to_xyxy, xyxy_to_xyah
from edge_agent.tracking.matching import (
    Assignment,
    cosine_cost,
    gate_cost_matrix,
    iou_cost,
    linear_assignment,
    matching_cascade,
)
from edge_agent.tracking.track import Track, TrackState
from edge_agent.tracking.tracker import DeepSortTracker

__all__ = [
    "CHI2INV95",
    "Assignment",
    "CameraTracker",
    "CloudEvidence",
    "CloudTerms",
    "CloudTrack",
    "DeepSortTracker",
    "Embedder",
    "FusedTracker",
    "HistogramEmbedder",
    "KalmanFilter",
    "MobileNetV2Embedder",
    "NoEmbedder",
    "Track",
    "TrackState",
    "build_embedder",
    "cosine_cost",
    "gate_cost_matrix",
    "iou_cost",
    "linear_assignment",
    "matching_cascade",
    "xyah_to_xyxy",
    "xyxy_to_xyah",
]
