"""Pictures of what the agent saw: annotated frames for snapshots, clips and the status page."""

from edge_agent.media.draw import annotate, pixel_points

__all__ = ["annotate", "pixel_points"]
