"""The rule evaluators, looked up by the `kind` of a rule's config.

A new kind is one config model (in `edge_agent.config.rules`, added to `RuleConfig`), one
evaluator class with that `kind`, and one entry in `_EVALUATOR_CLASSES` below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from edge_agent.config.rules import RuleBase, RuleConfig
from edge_agent.rules.context import RuleContext
from edge_agent.rules.counting import CountLineEvaluator
from edge_agent.rules.evaluator import EvaluatorBase, RuleEvaluator
from edge_agent.rules.evaluators import (
    LineCrossEvaluator,
    LoiterEvaluator,
    ZoneEnterEvaluator,
    ZoneExitEvaluator,
    ZoneOccupancyEvaluator,
)

EvaluatorFactory = Callable[[RuleBase, RuleContext], RuleEvaluator]
"""Makes the evaluator of one rule (of the factory's kind) on one camera."""

# Any: each class takes the config model of its own kind, which `kind` picks out
_EVALUATOR_CLASSES: tuple[type[EvaluatorBase[Any]], ...] = (
    ZoneEnterEvaluator,
    ZoneExitEvaluator,
    ZoneOccupancyEvaluator,
    LineCrossEvaluator,
    LoiterEvaluator,
    CountLineEvaluator,
)

EVALUATORS: Final[Mapping[str, EvaluatorFactory]] = MappingProxyType(
    {cls.kind: cls for cls in _EVALUATOR_CLASSES}
)
"""Evaluator factory of each rule `kind`."""


def evaluator_for(rule: RuleConfig, context: RuleContext) -> RuleEvaluator:
    """The evaluator of `rule` on the camera of `context`.

    Raises `ValueError` for a kind without an evaluator, or a rule naming a place the camera
    does not have.
    """
    factory = EVALUATORS.get(rule.kind)
    if factory is None:
        raise ValueError(f"rule {rule.name!r} has kind {rule.kind!r}, which has no evaluator")
    return factory(rule, context)
