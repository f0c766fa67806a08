"""Rules: turn tracked detections into zone, line, loiter, occupancy and line-count events."""

from edge_agent.rules.engine import RuleEngine
from edge_agent.rules.evaluator import EvaluatorBase, RuleEvaluator
from edge_agent.rules.events import NO_TRACK, LineCounts, RuleEvent
from edge_agent.rules.geometry import (
    bottom_centres,
    crossing_direction,
    points_in_polygon,
    segments_intersect,
    side_of_line,
)
from edge_agent.rules.registry import EVALUATORS, evaluator_for

__all__ = [
    "EVALUATORS",
    "NO_TRACK",
    "EvaluatorBase",
    "LineCounts",
    "RuleEngine",
    "RuleEvaluator",
    "RuleEvent",
    "bottom_centres",
    "crossing_direction",
    "evaluator_for",
    "points_in_polygon",
    "segments_intersect",
    "side_of_line",
]
