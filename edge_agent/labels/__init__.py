"""Escalated frames kept with the cloud's answers, per camera, as training data (`labels:`)."""

from edge_agent.labels.records import LabelImage, label_images
from edge_agent.labels.store import LabelStore

__all__ = ["LabelImage", "LabelStore", "label_images"]
