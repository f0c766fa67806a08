"""`RuleEngine`: turns one camera's tracked detections, frame by frame, into rule events.

Each tracked object is anchored at the bottom-centre of its box (where it touches the ground).
The engine keeps each track's place (zones inside, last anchor off each line) and hands what a
frame changed to one evaluator per rule, found by the rule's `kind` in
`edge_agent.rules.registry`; each kind's conventions are in its evaluator's module. They follow
the scene generator's ground truth (`testbed.scenes.events`).

* `retract` withdraws an instantaneous event (same id and time as its `start`) when the track's
  class changes, within `retract_window_s`, to one its rule does not accept (a cloud answer
  corrected the edge), or when the cloud found no object where the track was (`withdraw`); an
  active loiter of such a track ends.

Rule filters are checked when an event fires: `classes` on the class of that frame's detection
(the tracker reports its track's voted class), `min_confidence` on the track's best confidence so
far (as Frigate's top score), so a crossing seen on a frame where an occluded object scores low is
not lost. The geometric state of a track is kept regardless, so a filtered frame never hides a
later crossing. `cooldown_s` holds back `start` events of a rule for the same track (per zone for
occupancy); `end` events are never held back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from detection.detections import Detections
from edge_agent.config.camera import CameraConfig
from edge_agent.config.geometry import Point
from edge_agent.config.rules import RuleBase
from edge_agent.rules.context import RuleContext
from edge_agent.rules.evaluator import RuleEvaluator
from edge_agent.rules.events import (
    NO_TRACK,
    Box,
    Direction,
    LineCounts,
    Phase,
    RuleEvent,
    RuleKind,
)
from edge_agent.rules.geometry import bottom_centres, points_in_polygon
from edge_agent.rules.registry import evaluator_for
from edge_agent.rules.state import Line, TrackState, Zone

__all__ = [
    "NO_TRACK",
    "Box",
    "Direction",
    "LineCounts",
    "Phase",
    "RuleEngine",
    "RuleEvent",
    "RuleKind",
]

_RAISED_KEPT = 32  # `start` events remembered per track, for retraction


class RuleEngine:
    """Rules of one camera, fed once per frame with its tracked detections.

    `frame_size` is `(width, height)` in pixels, used to resolve normalised zones and lines;
    `class_names` maps `class_id` to the names rules filter on; tracks not seen for more than
    `track_timeout_s` are forgotten (ending their loiter events).
    """

    def __init__(
        self,
        camera: CameraConfig,
        *,
        frame_size: tuple[int, int],
        class_names: Sequence[str],
        track_timeout_s: float = 2.0,
        retract_window_s: float = 30.0,
    ) -> None:
        width, height = frame_size
        if width <= 0 or height <= 0:
            raise ValueError(f"frame size must be positive, got {width}x{height}")
        if track_timeout_s < 0:
            raise ValueError(f"track_timeout_s must be >= 0, got {track_timeout_s}")
        self.camera = camera.name
        self.frame_size = (width, height)
        self.class_names = tuple(class_names)
        self.track_timeout_s = track_timeout_s
        self.retract_window_s = retract_window_s
        self._context = RuleContext(
            camera.name,
            self.frame_size,
            self.class_names,
            {z.name: Zone.from_config(z, self.frame_size) for z in camera.zones},
            {line.name: Line.from_config(line, self.frame_size) for line in camera.lines},
        )
        self._tracks = self._context.tracks
        self._lines = tuple(self._context.lines.values())
        self._evaluators: list[RuleEvaluator] = [
            evaluator_for(rule, self._context) for rule in camera.rules
        ]
        self._by_rule = {evaluator.rule.name: evaluator for evaluator in self._evaluators}
        self._last_timestamp_s: float | None = None

    @property
    def track_ids(self) -> list[int]:
        """Ids of the tracks currently remembered."""
        return sorted(self._tracks)

    def zone_counts(self) -> dict[str, int]:
        """Per zone of the camera, how many remembered tracks (any class) are inside it now.

        As of the last frame: a track counts until it is forgotten (`track_timeout_s` after it was
        last seen, or withdrawn), at the place it was last seen, as `zone_occupancy` counts.
        """
        return {
            name: sum(1 for track in self._tracks.values() if track.inside.get(name, False))
            for name in self._context.zones
        }

    def update(
        self,
        detections: Detections,
        timestamp_s: float,
        origins: Mapping[int, Box] | None = None,
    ) -> list[RuleEvent]:
        """Events raised by one frame; detections without a track (`tracker_id < 0`) are ignored.

        Timestamps must not go backwards. A track id seen twice in one frame keeps its first box.
        `origins` gives, per track id, the box where the tracker first saw the track (before it
        was confirmed): a track new to the rules starts from there, so one confirmed only after
        it walked into a zone or over a line still enters or crosses it (now). Without an
        origin a new track starts where it is and enters nothing.
        """
        if self._last_timestamp_s is not None and timestamp_s < self._last_timestamp_s:
            raise ValueError(
                f"timestamp went backwards: {timestamp_s} after {self._last_timestamp_s}"
            )
        self._last_timestamp_s = timestamp_s
        events: list[RuleEvent] = []
        for evaluator in self._evaluators:
            events += evaluator.begin_frame(timestamp_s)
        tracked = np.flatnonzero(detections.tracker_id >= 0)
        _, first = np.unique(detections.tracker_id[tracked], return_index=True)
        rows = tracked[np.sort(first)]
        anchors = bottom_centres(detections.xyxy[rows])
        inside = {
            name: points_in_polygon(anchors, zone.points) if len(rows) else np.zeros(0, bool)
            for name, zone in self._context.zones.items()
        }
        for k, row in enumerate(rows):
            anchor = (float(anchors[k, 0]), float(anchors[k, 1]))
            in_zones = {name: bool(flags[k]) for name, flags in inside.items()}
            origin = None if origins is None else origins.get(int(detections.tracker_id[row]))
            events += self._update_track(
                detections, int(row), anchor, in_zones, timestamp_s, origin
            )
        events += self._forget(timestamp_s)
        for evaluator in self._evaluators:
            events += evaluator.end_frame(timestamp_s)
        return events

    def _update_track(
        self,
        detections: Detections,
        row: int,
        anchor: Point,
        in_zones: dict[str, bool],
        timestamp_s: float,
        origin: Box | None = None,
    ) -> list[RuleEvent]:
        track_id = int(detections.tracker_id[row])
        x1, y1, x2, y2 = (float(v) for v in detections.xyxy[row])
        box = (x1, y1, x2, y2)
        class_id = int(detections.class_id[row])
        confidence = float(detections.confidence[row])
        track = self._tracks.get(track_id)
        is_new = track is None
        if track is None:
            track = TrackState(track_id, class_id, confidence, box, timestamp_s)
            self._tracks[track_id] = track
        changed_class = [] if is_new else self._class_changed(track, class_id, timestamp_s)
        track.class_id, track.box = class_id, box
        track.confidence = max(track.confidence, confidence)
        track.last_seen_s = timestamp_s
        if is_new and origin is not None:
            (x, y), zones = bottom_centres(origin)[0], self._context.zones.items()
            born_in = {name: bool(points_in_polygon([(x, y)], z.points)[0]) for name, z in zones}
            track.move((float(x), float(y)), born_in, self._lines, timestamp_s, is_new=True)
            is_new = False
        change = track.move(anchor, in_zones, self._lines, timestamp_s, is_new=is_new)
        events: list[RuleEvent] = []
        for evaluator in self._evaluators:
            events += evaluator.observe_track(track, change, timestamp_s)
        track.raised += [e for e in events if e.phase == "start"]
        del track.raised[:-_RAISED_KEPT]
        return changed_class + events

    def _class_changed(
        self, track: TrackState, class_id: int, timestamp_s: float
    ) -> list[RuleEvent]:
        """Withdraw what the track raised under a class its rule no longer accepts.

        The tracker reports a track's voted class, which a cloud answer can overturn: a recent
        instantaneous event is sent again as `retract` (same id and time as its `start`), an
        active loiter ends now.
        """
        return self._retract(
            track,
            timestamp_s,
            lambda rule: self._context.matches(rule, class_id, track.confidence),
            class_id,
        )

    def _retract(
        self,
        track: TrackState,
        timestamp_s: float,
        still_holds: Callable[[RuleBase], bool],
        class_id: int,
    ) -> list[RuleEvent]:
        """Hand the track's recent `start`s whose rule no longer `still_holds` back to their
        evaluator to withdraw; the track's class becomes `class_id`."""
        events: list[RuleEvent] = []
        kept: list[RuleEvent] = []
        for raised in track.raised:
            evaluator = self._by_rule[raised.rule]
            recent = timestamp_s - raised.timestamp_s <= self.retract_window_s
            if still_holds(evaluator.rule) or not recent:
                kept.append(raised)
            else:
                events += evaluator.retract_start(track, raised, class_id, timestamp_s)
        track.raised = kept
        return events

    def withdraw(self, track_ids: Iterable[int]) -> list[RuleEvent]:
        """The cloud found no object where these tracks were: retract their recent
        instantaneous events, end their loiters and forget them (zone occupancy is recounted
        on the next frame). Stamped with the last frame's time; unknown ids are ignored."""
        timestamp_s = self._last_timestamp_s
        if timestamp_s is None:
            return []
        events: list[RuleEvent] = []
        for track_id in track_ids:
            track = self._tracks.get(int(track_id))
            if track is None:
                continue
            events += self._retract(track, timestamp_s, lambda _rule: False, track.class_id)
            events += self._drop([track], timestamp_s)
        return events

    def _forget(self, timestamp_s: float) -> list[RuleEvent]:
        stale = [
            t for t in self._tracks.values() if timestamp_s - t.last_seen_s > self.track_timeout_s
        ]
        return self._drop(stale, timestamp_s)

    def _drop(self, tracks: list[TrackState], timestamp_s: float) -> list[RuleEvent]:
        events: list[RuleEvent] = []
        for track in tracks:
            for evaluator in self._evaluators:
                events += evaluator.forget_track(track, timestamp_s)
            del self._tracks[track.track_id]
            self._context.forget_cooldowns(track.track_id)
        return events

    def finish(self, timestamp_s: float) -> list[RuleEvent]:
        """End every lasting event (stream over): forget all tracks, end loiter and occupancy,
        and send the totals of the open line-count intervals."""
        events = self._drop(list(self._tracks.values()), timestamp_s)
        for evaluator in self._evaluators:
            events += evaluator.end_frame(timestamp_s)
        for evaluator in self._evaluators:
            events += evaluator.finish(timestamp_s)
        return events
