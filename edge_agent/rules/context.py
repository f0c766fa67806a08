"""`RuleContext`: what every rule evaluator of one camera shares (places, tracks, cool-downs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edge_agent.config.rules import RuleBase
from edge_agent.rules.events import NO_TRACK, Direction, LineCounts, Phase, RuleEvent, RuleKind
from edge_agent.rules.state import Line, TrackState, Zone


class RuleContext:
    """One camera's places and remembered tracks, the class filter and the cool-down table.

    The engine owns the tracks (adds, moves and forgets them); evaluators read them and use the
    helpers here to filter, hold back and build events.
    """

    def __init__(
        self,
        camera: str,
        frame_size: tuple[int, int],
        class_names: Sequence[str],
        zones: Mapping[str, Zone],
        lines: Mapping[str, Line],
    ) -> None:
        """Context of camera `camera`, whose frames are `frame_size` `(width, height)` pixels."""
        self.camera = camera
        self.frame_size = frame_size
        self.class_names = tuple(class_names)
        self.zones = dict(zones)
        self.lines = dict(lines)
        self.tracks: dict[int, TrackState] = {}
        self._last_fired: dict[tuple[str, int], float] = {}  # (rule, track or NO_TRACK) -> time

    def zone(self, rule: RuleBase, name: str) -> Zone:
        """The zone `rule` names; `ValueError` if the camera has none of that name."""
        if name not in self.zones:
            raise ValueError(f"rule {rule.name!r} refers to unknown zone {name!r}")
        return self.zones[name]

    def line(self, rule: RuleBase, name: str) -> Line:
        """The line `rule` names; `ValueError` if the camera has none of that name."""
        if name not in self.lines:
            raise ValueError(f"rule {rule.name!r} refers to unknown line {name!r}")
        return self.lines[name]

    def label(self, class_id: int) -> str | None:
        """The name of `class_id`, None where the class names do not cover it."""
        return self.class_names[class_id] if 0 <= class_id < len(self.class_names) else None

    def matches(self, rule: RuleBase, class_id: int, confidence: float) -> bool:
        """Whether an object of `class_id`, best confidence `confidence`, passes `rule`'s filter."""
        if confidence < rule.min_confidence:
            return False
        if not rule.classes:
            return True
        label = self.label(class_id)
        return label is not None and label in rule.classes

    def cooled(self, rule: RuleBase, key: int, timestamp_s: float) -> bool:
        """Whether `rule` may fire for `key` (a track, or NO_TRACK) now; records it if so."""
        last = self._last_fired.get((rule.name, key))
        if last is not None and timestamp_s - last < rule.cooldown_s:
            return False
        self._last_fired[(rule.name, key)] = timestamp_s
        return True

    def forget_cooldowns(self, track_id: int) -> None:
        """Drop the cool-downs of a forgotten track."""
        for key in [k for k in self._last_fired if k[1] == track_id]:
            del self._last_fired[key]

    def event(
        self,
        rule: RuleBase,
        kind: RuleKind,
        track: TrackState | None,
        timestamp_s: float,
        *,
        phase: Phase = "start",
        zone: str | None = None,
        line: str | None = None,
        direction: Direction | None = None,
        count: int | None = None,
        line_counts: LineCounts | None = None,
    ) -> RuleEvent:
        """An event of `rule` about `track` (None: about a place) on this camera."""
        return RuleEvent(
            rule=rule.name,
            kind=kind,
            camera=self.camera,
            track_id=track.track_id if track else NO_TRACK,
            class_id=track.class_id if track else NO_TRACK,
            timestamp_s=timestamp_s,
            box=track.box if track else None,
            phase=phase,
            direction=direction,
            zone=zone,
            line=line,
            count=count,
            label=self.label(track.class_id) if track else None,
            frame_size=self.frame_size,
            line_counts=line_counts,
        )
