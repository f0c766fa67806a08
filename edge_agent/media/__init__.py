"""Pictures of what the agent saw: annotated frames for snapshots, clips and the status page."""

from edge_agent.media.draw import annotate, pixel_points
from edge_agent.media.store import MediaStats, MediaStore

__all__ = ["MediaStats", "MediaStore", "annotate", "pixel_points"]
