"""Rules: turn tracked detections into zone, line, loiter and occupancy events."""

from edge_agent.rules.engine import RuleEngine, RuleEvent
from edge_agent.rules.geometry import (
    bottom_centres,
    crossing_direction,
    points_in_polygon,
    segments_intersect,
    side_of_line,
)

__all__ = [
    "RuleEngine",
    "RuleEvent",
    "bottom_centres",
    "crossing_direction",
    "points_in_polygon",
    "segments_intersect",
    "side_of_line",
]
