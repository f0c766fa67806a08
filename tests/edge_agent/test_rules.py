"""Rules engine: geometry, each rule kind and its registry, filters, cooldown, line and zone
counts, and the events preset."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

from detection.detections import Detections
from edge_agent.alerts.payload import EventIds, event_id, event_payload
from edge_agent.config import CameraConfig
from edge_agent.config.rules import RULE_PLACES, RuleConfig
from edge_agent.rules import (
    EVALUATORS,
    NO_TRACK,
    LineCounts,
    RuleEngine,
    RuleEvent,
    bottom_centres,
    crossing_direction,
    points_in_polygon,
    segments_intersect,
    side_of_line,
)
from testbed.scenes.background import BackgroundSpec
from testbed.scenes.events import expected_events
from testbed.scenes.render import Effects
from testbed.scenes.scenario import build_renderer, make_scenario
from testbed.scenes.writer import mot_rows

CLASSES = ("person", "car", "truck", "forklift")
SQUARE = [(100.0, 100.0), (200.0, 100.0), (200.0, 200.0), (100.0, 200.0)]
# A vertical line at x=300 drawn downward: its left (looking from first to second) is x > 300.
LINE = ((300.0, 0.0), (300.0, 400.0))

# ---------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("point", "inside"),
    [
        ((150.0, 150.0), True),
        ((99.0, 150.0), False),
        ((201.0, 150.0), False),
        ((150.0, 99.0), False),
        ((150.0, 250.0), False),
        ((101.0, 199.0), True),
    ],
)
def test_points_in_square(point: tuple[float, float], inside: bool) -> None:
    assert points_in_polygon([point], SQUARE).tolist() == [inside]


def test_points_in_concave_polygon_vectorised() -> None:
    # A "U": the notch (140..160, 100..180) is outside.
    u_shape = [(100, 100), (140, 100), (140, 180), (160, 180), (160, 100), (200, 100),
               (200, 200), (100, 200)]  # fmt: skip
    points = np.array([[120, 150], [150, 150], [150, 190], [180, 120], [250, 150]], float)
    assert points_in_polygon(points, u_shape).tolist() == [True, False, True, True, False]
    assert points_in_polygon(np.empty((0, 2)), u_shape).shape == (0,)


def test_points_in_polygon_rejects_degenerate_input() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        points_in_polygon([(0.0, 0.0)], [(0.0, 0.0), (1.0, 1.0)])
    with pytest.raises(ValueError, match="shape"):
        points_in_polygon(np.zeros((2, 3)), SQUARE)


@pytest.mark.parametrize(
    ("point", "sign"),
    [((350.0, 10.0), -1), ((250.0, 10.0), 1), ((300.0, 999.0), 0)],
)
def test_side_of_line_is_negative_on_the_left_in_image_coordinates(
    point: tuple[float, float], sign: int
) -> None:
    assert np.sign(side_of_line([point], *LINE)).tolist() == [sign]


@pytest.mark.parametrize(
    ("start", "end", "meets"),
    [
        ((250.0, 50.0), (350.0, 60.0), True),  # through the segment
        ((250.0, -50.0), (350.0, -40.0), False),  # crosses the infinite line above its end
        ((250.0, 50.0), (290.0, 60.0), False),  # stops short
        ((250.0, 400.0), (350.0, 400.0), True),  # touches the end point
    ],
)
def test_segments_intersect(
    start: tuple[float, float], end: tuple[float, float], meets: bool
) -> None:
    assert segments_intersect([start], [end], *LINE).tolist() == [meets]


@pytest.mark.parametrize(
    ("before", "after", "in_side", "direction"),
    [
        ((250.0, 50.0), (350.0, 50.0), "left", "in"),
        ((350.0, 50.0), (250.0, 50.0), "left", "out"),
        ((250.0, 50.0), (350.0, 50.0), "right", "out"),
        ((350.0, 50.0), (250.0, 50.0), "right", "in"),
        ((250.0, 50.0), (300.0, 50.0), "left", None),  # onto the line is not across it
        ((250.0, 500.0), (350.0, 500.0), "left", None),  # below the segment's end
        ((250.0, 50.0), (260.0, 50.0), "left", None),
    ],
)
def test_crossing_direction(
    before: tuple[float, float],
    after: tuple[float, float],
    in_side: Any,
    direction: str | None,
) -> None:
    assert crossing_direction(before, after, *LINE, in_side) == direction


def test_bottom_centres() -> None:
    assert bottom_centres([[10, 20, 30, 60], [0, 0, 1, 1]]).tolist() == [[20, 60], [0.5, 1]]


# ---------------------------------------------------------------- engine helpers


def _camera(rules: list[dict[str, Any]], *, normalized: bool = False) -> CameraConfig:
    scale = (1 / 640, 1 / 480) if normalized else (1.0, 1.0)
    units = "normalized" if normalized else "pixel"
    return CameraConfig.model_validate(
        {
            "name": "cam-1",
            "url": "/tmp/video.mp4",
            "zones": [
                {"name": "zone-a", "units": units,
                 "points": [[x * scale[0], y * scale[1]] for x, y in SQUARE]}
            ],
            "lines": [
                {"name": "line-a", "units": units, "in_side": "left",
                 "points": [[x * scale[0], y * scale[1]] for x, y in LINE]}
            ],
            "rules": [{"cooldown_s": 0.0, "min_confidence": 0.3, **r} for r in rules],
        }
    )  # fmt: skip


def _engine(rules: list[dict[str, Any]], **kwargs: Any) -> RuleEngine:
    normalized = kwargs.pop("normalized", False)
    return RuleEngine(
        _camera(rules, normalized=normalized),
        frame_size=(640, 480),
        class_names=CLASSES,
        **kwargs,
    )


Obj = tuple[int, float, float] | tuple[int, float, float, int, float]


def _dets(objects: Sequence[Obj]) -> Detections:
    """Boxes 10 px wide, 20 tall, whose bottom-centre is `(x, y)`: (track, x, y[, class, conf])."""
    rows = [(*o, 0, 0.9)[:5] if len(o) == 3 else o for o in objects]
    return Detections(
        xyxy=np.array([[x - 5, y - 20, x + 5, y] for _, x, y, *_ in rows], np.float32),
        confidence=np.array([r[4] for r in rows], np.float32),
        class_id=np.array([r[3] for r in rows], np.int64),
        tracker_id=np.array([r[0] for r in rows], np.int64),
    )


def _run(engine: RuleEngine, frames: Sequence[Sequence[Obj]], dt: float = 0.1) -> list[RuleEvent]:
    events: list[RuleEvent] = []
    for i, objects in enumerate(frames):
        events += engine.update(_dets(objects), i * dt)
    return events


def _summary(events: list[RuleEvent]) -> list[tuple[Any, ...]]:
    return [(e.kind, e.phase, e.track_id, round(e.timestamp_s, 3)) for e in events]


# ---------------------------------------------------------------- rules


@pytest.mark.parametrize("normalized", [False, True])
def test_zone_enter_and_exit_fire_on_the_frame_of_the_change(normalized: bool) -> None:
    engine = _engine(
        [{"name": "in", "kind": "zone_enter", "zone": "zone-a"},
         {"name": "out", "kind": "zone_exit", "zone": "zone-a"}],
        normalized=normalized,
    )  # fmt: skip
    xs = [80, 90, 110, 150, 190, 210, 220]
    events = _run(engine, [[(7, x, 150)] for x in xs])
    assert _summary(events) == [("zone_enter", "start", 7, 0.2), ("zone_exit", "start", 7, 0.5)]
    enter = events[0]
    assert (enter.rule, enter.camera, enter.zone, enter.line) == ("in", "cam-1", "zone-a", None)
    assert enter.class_id == 0 and enter.box == (105.0, 130.0, 115.0, 150.0)


@pytest.mark.parametrize(
    ("class_names", "class_id", "label"),
    [(CLASSES, 0, "person"), (CLASSES, 3, "forklift"), (CLASSES, 9, None), ((), 0, None)],
    ids=["first", "last", "beyond-the-names", "no-names"],
)
def test_events_carry_the_class_label_and_the_frame_size(
    class_names: tuple[str, ...], class_id: int, label: str | None
) -> None:
    engine = RuleEngine(
        _camera([{"name": "in", "kind": "zone_enter", "zone": "zone-a"}]),
        frame_size=(640, 480),
        class_names=class_names,
    )
    (event,) = _run(engine, [[(7, x, 150, class_id, 0.9)] for x in (80, 150)])
    assert (event.class_id, event.label, event.frame_size) == (class_id, label, (640, 480))


def test_occupancy_events_have_the_frame_size_but_no_label() -> None:
    engine = _engine(
        [{"name": "crowd", "kind": "zone_occupancy", "zone": "zone-a", "min_objects": 1}]
    )
    (event,) = _run(engine, [[(1, 150, 150)]])
    assert (event.kind, event.label, event.frame_size) == ("zone_occupancy", None, (640, 480))


def test_first_seen_inside_raises_no_enter_and_vanishing_inside_no_exit() -> None:
    engine = _engine(
        [{"name": "in", "kind": "zone_enter", "zone": "zone-a"},
         {"name": "out", "kind": "zone_exit", "zone": "zone-a"}],
        track_timeout_s=0.25,
    )  # fmt: skip
    frames: list[list[Obj]] = [[(1, 150, 150)], [(1, 160, 150)], [], [], [], [], []]
    assert _run(engine, frames) == []
    assert engine.track_ids == []  # forgotten after the timeout


def _box(x: float, y: float) -> tuple[float, float, float, float]:
    """The `_dets` box whose bottom-centre is `(x, y)`."""
    return (x - 5, y - 20, x + 5, y)


@pytest.mark.parametrize(
    ("born_at", "expected"),
    [
        ((80.0, 150.0), [("zone_enter", "start", 4, 0.0)]),  # born outside: it walked in
        ((120.0, 150.0), []),  # born inside: first seen inside, as without an origin
        (None, []),
    ],
)
def test_a_track_confirmed_inside_enters_from_where_it_was_born(
    born_at: tuple[float, float] | None, expected: list[tuple[Any, ...]]
) -> None:
    """The tracker confirms a track frames after its first detection; a slow box that skips
    frames confirms one already inside a zone near the frame edge. Its birth box decides."""
    engine = _engine([{"name": "in", "kind": "zone_enter", "zone": "zone-a"}])
    origins = {} if born_at is None else {4: _box(*born_at)}
    events = engine.update(_dets([(4, 150, 150)]), 0.0, origins)
    events += engine.update(_dets([(4, 160, 150)]), 0.1, {4: _box(10.0, 150.0)})  # known now
    assert _summary(events) == expected


def test_a_track_confirmed_past_a_line_crossed_it_from_where_it_was_born() -> None:
    engine = _engine([{"name": "x", "kind": "line_cross", "line": "line-a"}])
    (event,) = engine.update(_dets([(2, 320, 100)]), 0.5, {2: _box(280.0, 100.0)})
    assert (event.direction, event.timestamp_s) == ("in", 0.5)
    assert engine.update(_dets([(3, 320, 100)]), 0.6, {3: _box(310.0, 100.0)}) == []


@pytest.mark.parametrize(
    ("xs", "wanted", "expected"),
    [
        ([250, 280, 320, 340], "both", [("in", 0.2)]),
        ([340, 320, 280, 250], "both", [("out", 0.2)]),
        ([250, 320, 280], "both", [("in", 0.1), ("out", 0.2)]),
        ([250, 320, 280], "in", [("in", 0.1)]),
        ([250, 320, 280], "out", [("out", 0.2)]),
        ([250, 300, 300, 340], "both", [("in", 0.3)]),  # pausing on the line
        ([250, 300, 290], "both", []),  # touching the line and going back
    ],
)
def test_line_cross_directions(xs: list[float], wanted: str, expected: list[Any]) -> None:
    engine = _engine([{"name": "x", "kind": "line_cross", "line": "line-a", "direction": wanted}])
    events = _run(engine, [[(3, x, 100)] for x in xs])
    assert [(e.direction, round(e.timestamp_s, 3)) for e in events] == expected
    assert all(e.line == "line-a" and e.zone is None for e in events)


def test_line_cross_beyond_the_segment_end_is_ignored() -> None:
    engine = _engine([{"name": "x", "kind": "line_cross", "line": "line-a"}])
    assert _run(engine, [[(3, 250, 450)], [(3, 350, 450)]]) == []


def test_loiter_starts_after_the_dwell_and_ends_on_leaving() -> None:
    engine = _engine([{"name": "stay", "kind": "loiter", "zone": "zone-a", "dwell_s": 0.3}])
    xs = [90, 110, 120, 130, 140, 150, 210]  # enters at 0.1 s, leaves at 0.6 s
    events = _run(engine, [[(5, x, 150)] for x in xs])
    assert _summary(events) == [("loiter", "start", 5, 0.4), ("loiter", "end", 5, 0.6)]


def test_loiter_ends_when_the_track_is_forgotten_inside() -> None:
    engine = _engine(
        [{"name": "stay", "kind": "loiter", "zone": "zone-a", "dwell_s": 0.2}], track_timeout_s=0.15
    )
    frames: list[list[Obj]] = [[(5, 90, 150)], [(5, 110, 150)], [(5, 120, 150)],
                               [(5, 130, 150)], [], [], []]  # fmt: skip
    events = _run(engine, frames)
    assert _summary(events) == [("loiter", "start", 5, 0.3), ("loiter", "end", 5, 0.5)]
    assert events[1].box == events[0].box  # the last box seen


def test_loiter_counts_from_first_sighting_when_first_seen_inside() -> None:
    engine = _engine([{"name": "stay", "kind": "loiter", "zone": "zone-a", "dwell_s": 0.2}])
    events = _run(engine, [[(5, 150, 150)]] * 4)
    assert _summary(events) == [("loiter", "start", 5, 0.2)]
    assert _summary(engine.finish(1.0)) == [("loiter", "end", 5, 1.0)]


def test_occupancy_starts_updates_and_ends_around_the_threshold() -> None:
    engine = _engine(
        [{"name": "busy", "kind": "zone_occupancy", "zone": "zone-a", "min_objects": 2}]
    )
    frames: list[list[Obj]] = [
        [(1, 150, 150), (2, 50, 150)],
        [(1, 150, 150), (2, 120, 150)],  # 2 inside: start
        [(1, 150, 150), (2, 120, 150), (3, 130, 130)],  # 3: update
        [(1, 150, 150), (2, 120, 150), (3, 130, 130)],  # unchanged: nothing
        [(1, 150, 150), (2, 250, 150), (3, 250, 130)],  # 1: end
    ]
    events = _run(engine, frames)
    assert [(e.phase, e.count, round(e.timestamp_s, 3)) for e in events] == [
        ("start", 2, 0.1),
        ("update", 3, 0.2),
        ("end", 1, 0.4),
    ]
    assert all(e.track_id == -1 and e.box is None and e.zone == "zone-a" for e in events)


def test_occupancy_cooldown_holds_back_a_restart() -> None:
    engine = _engine(
        [{"name": "busy", "kind": "zone_occupancy", "zone": "zone-a", "min_objects": 1,
          "cooldown_s": 0.25}]
    )  # fmt: skip
    xs = [150, 250, 150, 250, 250, 150]
    events = _run(engine, [[(1, x, 150)] for x in xs])
    assert [(e.phase, round(e.timestamp_s, 3)) for e in events] == [
        ("start", 0.0),
        ("end", 0.1),
        ("start", 0.5),  # 0.2 was within the cool-down
    ]


def test_cooldown_is_per_rule_and_track() -> None:
    engine = _engine([{"name": "in", "kind": "zone_enter", "zone": "zone-a", "cooldown_s": 0.35}])
    xs = [90, 110, 90, 110, 90, 110, 90, 110]  # enters at 0.1, 0.3, 0.5, 0.7 s
    frames = [[(1, x, 150), (2, x, 160)] for x in xs]
    events = _run(engine, frames)
    assert sorted(_summary(events)) == [
        ("zone_enter", "start", 1, 0.1),
        ("zone_enter", "start", 1, 0.5),
        ("zone_enter", "start", 2, 0.1),
        ("zone_enter", "start", 2, 0.5),
    ]


def test_class_and_confidence_filters() -> None:
    engine = _engine(
        [{"name": "cars", "kind": "line_cross", "line": "line-a", "classes": ["car", "truck"],
          "min_confidence": 0.5}]
    )  # fmt: skip
    frames: list[list[Obj]] = [
        [(1, 250, 50, 0, 0.9), (2, 250, 60, 1, 0.9), (3, 250, 70, 1, 0.4), (4, 250, 80, 2, 0.6)],
        [(1, 350, 50, 0, 0.9), (2, 350, 60, 1, 0.9), (3, 350, 70, 1, 0.4), (4, 350, 80, 2, 0.6)],
    ]
    events = _run(engine, frames)
    assert [(e.track_id, e.class_id) for e in events] == [(2, 1), (4, 2)]


@pytest.mark.parametrize(
    ("kind", "xs", "confidences", "window_s", "expected"),
    [
        # the score passing the filter comes a frame after the crossing: stamped at the crossing
        ("zone_enter", [80, 150, 160], [0.4, 0.4, 0.8], 1.0, [0.1]),
        ("zone_exit", [150, 250, 260], [0.4, 0.4, 0.8], 1.0, [0.1]),
        ("line_cross", [250, 350, 360], [0.4, 0.4, 0.8], 1.0, [0.1]),
        # went back before it was sure: nothing
        ("zone_enter", [80, 150, 80], [0.4, 0.4, 0.8], 1.0, []),
        ("zone_exit", [150, 250, 150], [0.4, 0.4, 0.8], 1.0, []),
        ("line_cross", [250, 350, 250], [0.4, 0.4, 0.8], 1.0, [0.2]),  # only the way back
        # sure too late, or the rule does not wait
        ("zone_enter", [80, 150, 160, 170], [0.4, 0.4, 0.4, 0.8], 0.15, []),
        ("zone_enter", [80, 150, 160], [0.4, 0.4, 0.8], 0.0, []),
        # sure on the crossing frame: as before
        ("zone_enter", [80, 150, 160], [0.4, 0.8, 0.8], 1.0, [0.1]),
    ],
)
def test_a_crossing_waits_for_the_track_to_pass_min_confidence(
    kind: str, xs: list[float], confidences: list[float], window_s: float, expected: list[float]
) -> None:
    """A box slower than its camera samples an object's score on fewer frames: the frame that
    passes `min_confidence` can come after the crossing, which then fires stamped when it
    happened, if the track is still across within `confirm_within_s`."""
    place = {"line": "line-a"} if kind == "line_cross" else {"zone": "zone-a"}
    engine = _engine(
        [{"name": "r", "kind": kind, "min_confidence": 0.6, "confirm_within_s": window_s, **place}]
    )
    frames: list[list[Obj]] = [[(7, x, 150, 0, c)] for x, c in zip(xs, confidences, strict=True)]
    events = _run(engine, frames)
    assert [round(e.timestamp_s, 3) for e in events] == expected
    assert all(e.kind == kind and e.track_id == 7 and e.phase == "start" for e in events)


def test_a_held_crossing_of_the_wrong_class_never_fires() -> None:
    engine = _engine(
        [{"name": "r", "kind": "zone_enter", "zone": "zone-a", "classes": ["car"],
          "min_confidence": 0.6}]
    )  # fmt: skip
    frames: list[list[Obj]] = [[(7, 80, 150, 0, 0.4)], [(7, 150, 150, 0, 0.4)],
                               [(7, 160, 150, 0, 0.9)]]  # fmt: skip
    assert _run(engine, frames) == []


def test_a_held_crossing_is_dropped_with_its_forgotten_track() -> None:
    engine = _engine(
        [{"name": "r", "kind": "zone_enter", "zone": "zone-a", "min_confidence": 0.6,
          "confirm_within_s": 5.0}],
        track_timeout_s=0.15,
    )  # fmt: skip
    frames: list[list[Obj]] = [[(7, 80, 150, 0, 0.4)], [(7, 150, 150, 0, 0.4)], [], [],
                               [(7, 160, 150, 0, 0.9)]]  # fmt: skip
    assert _run(engine, frames) == []  # forgotten at 0.4 s: back at 0.4 s it is first seen inside


def test_untracked_detections_are_ignored_and_time_must_not_go_back() -> None:
    engine = _engine([{"name": "in", "kind": "zone_enter", "zone": "zone-a"}])
    assert _run(engine, [[(-1, 50, 150)], [(-1, 150, 150)]]) == []
    assert engine.track_ids == []
    with pytest.raises(ValueError, match="backwards"):
        engine.update(Detections.empty(), 0.0)


def test_events_are_frozen() -> None:
    event = RuleEvent("r", "zone_enter", "cam", 1, 0, 0.0, (0.0, 0.0, 1.0, 1.0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.track_id = 2  # type: ignore[misc]


# ---------------------------------------------------------------- against the scene generator


def test_events_preset_ground_truth_matches_the_generator_expectations() -> None:
    plain = BackgroundSpec("plain", plain_bgr=(0, 0, 0))
    spec = dataclasses.replace(
        make_scenario("events", 7), background=plain, effects=Effects(noise_sigma_levels=0.0)
    )
    assert spec.loiter_dwell_s is not None
    (zone,), (line,) = spec.zones, spec.lines
    camera = CameraConfig.model_validate(
        {
            "name": "events",
            "url": "/tmp/events.mp4",
            "zones": [{"name": zone.name, "units": "pixel", "points": list(zone.points)}],
            "lines": [{"name": line.name, "units": "pixel", "points": list(line.points),
                       "in_side": line.in_side}],
            "rules": [
                {"name": "enter", "kind": "zone_enter", "zone": zone.name, "cooldown_s": 0},
                {"name": "exit", "kind": "zone_exit", "zone": zone.name, "cooldown_s": 0},
                {"name": "loiter", "kind": "loiter", "zone": zone.name, "cooldown_s": 0,
                 "dwell_s": spec.loiter_dwell_s},
                {"name": "cross", "kind": "line_cross", "line": line.name, "cooldown_s": 0},
            ],
        }
    )  # fmt: skip
    engine = RuleEngine(
        camera,
        frame_size=(spec.width_px, spec.height_px),
        class_names=spec.class_names,
        track_timeout_s=1.0,
    )
    renderer = build_renderer(spec, Path("/nonexistent"))  # a plain background reads no clip
    rows = []
    got = []
    for index in range(spec.n_frames):
        _, truth = renderer.render(index)
        rows += mot_rows(index, truth)
        xywh = truth.box_xywh.astype(np.float32)
        detections = Detections(
            xyxy=np.column_stack([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]]),
            confidence=np.ones(len(truth), np.float32),
            class_id=truth.class_id,
            tracker_id=truth.track_id,
        )
        for e in engine.update(detections, index / spec.fps):
            if e.phase == "start":
                got.append((e.track_id, e.kind, e.zone or e.line, e.direction, index + 1))
    want = [
        (e["track_id"], e["kind"], e.get("zone", e.get("line")), e.get("direction"), e["frame"])
        for e in expected_events(
            rows, spec.zones, spec.lines, loiter_dwell_s=spec.loiter_dwell_s, fps=spec.fps
        )
    ]
    kinds = {k for _, k, *_ in want}
    assert {"zone_enter", "zone_exit", "line_cross", "loiter"} <= kinds
    assert sorted(g[:4] for g in got) == sorted(w[:4] for w in want)
    for g, w in zip(sorted(got), sorted(want), strict=True):
        assert abs(g[4] - w[4]) <= 1, (g, w)


def test_a_class_correction_retracts_recent_events_and_ends_a_loiter() -> None:
    camera = CameraConfig.model_validate(
        {
            "name": "cam",
            "url": "/x.mp4",
            "zones": [
                {"name": "z", "units": "pixel", "points": [[0, 0], [100, 0], [100, 100], [0, 100]]}
            ],
            "rules": [
                {"name": "enter", "kind": "zone_enter", "zone": "z", "classes": ["person"]},
                {
                    "name": "stay",
                    "kind": "loiter",
                    "zone": "z",
                    "dwell_s": 1.0,
                    "classes": ["person"],
                },
            ],
        }
    )
    engine = RuleEngine(camera, frame_size=(200, 200), class_names=["person", "car"])

    def frame(x: float, class_id: int, t: float) -> list[RuleEvent]:
        dets = Detections(
            np.array([[x, 40.0, x + 10.0, 60.0]]),
            np.array([0.9]),
            np.array([class_id]),
            np.array([7]),
        )
        return engine.update(dets, t)

    ids = EventIds("a")
    assert frame(150.0, 0, 0.0) == []
    (enter,) = frame(50.0, 0, 0.1)
    (loiter,) = frame(50.0, 0, 1.2)
    assert (enter.kind, loiter.kind) == ("zone_enter", "loiter")
    enter_id, loiter_id = ids.id_for(enter), ids.id_for(loiter)
    corrected = frame(50.0, 1, 1.5)  # the cloud says: a car
    assert sorted((e.kind, e.phase) for e in corrected) == [
        ("loiter", "end"),
        ("zone_enter", "retract"),
    ]
    retract = next(e for e in corrected if e.phase == "retract")
    end = next(e for e in corrected if e.phase == "end")
    assert retract.timestamp_s == enter.timestamp_s and retract.class_id == 1
    assert (enter.label, retract.label, end.label) == ("person", "car", "car")  # follows class
    assert ids.id_for(retract) == enter_id and ids.id_for(end) == loiter_id
    assert frame(50.0, 1, 3.0) == []  # nothing more for a car


def test_a_track_the_cloud_withdrew_retracts_its_events_and_leaves_the_zone_count() -> None:
    engine = _engine(
        [
            {"name": "enter", "kind": "zone_enter", "zone": "zone-a"},
            {"name": "stay", "kind": "loiter", "zone": "zone-a", "dwell_s": 0.2},
            {"name": "crowd", "kind": "zone_occupancy", "zone": "zone-a", "min_objects": 1},
        ]
    )
    outside, inside = (1, 50.0, 50.0), (1, 150.0, 150.0)
    raised = _run(engine, [[outside], [inside], [inside], [inside], [inside]])
    starts = [e for e in raised if e.phase == "start"]
    assert {e.kind for e in starts} == {"zone_enter", "loiter", "zone_occupancy"}
    withdrawn = engine.withdraw([1, 99])  # 99: never seen, ignored
    enter = next(e for e in starts if e.kind == "zone_enter")
    assert _summary(withdrawn) == [
        ("zone_enter", "retract", 1, round(enter.timestamp_s, 3)),
        ("loiter", "end", 1, 0.4),
    ]
    assert engine.track_ids == []
    # The next frame recounts the zone without the withdrawn object.
    assert _summary(engine.update(Detections.empty(), 0.5)) == [("zone_occupancy", "end", -1, 0.5)]


def test_withdraw_before_any_frame_or_after_the_window_raises_nothing() -> None:
    engine = _engine([{"name": "enter", "kind": "zone_enter", "zone": "zone-a"}])
    assert engine.withdraw([1]) == []
    engine = _engine(
        [{"name": "enter", "kind": "zone_enter", "zone": "zone-a"}], retract_window_s=0.05
    )
    _run(engine, [[(1, 50.0, 50.0)], [(1, 150.0, 150.0)], [(1, 150.0, 150.0)]])
    assert engine.withdraw([1]) == []  # the enter is older than the retraction window


# ---------------------------------------------------------------- registry, line and zone counts

RULE_SAMPLES: dict[str, dict[str, Any]] = {
    "zone_enter": {"zone": "zone-a"},
    "zone_exit": {"zone": "zone-a"},
    "zone_occupancy": {"zone": "zone-a", "min_objects": 1},
    "line_cross": {"line": "line-a"},
    "loiter": {"zone": "zone-a", "dwell_s": 1.0},
    "count_line": {"line": "line-a"},
}


def test_the_registry_has_an_evaluator_for_every_rule_kind() -> None:
    kinds = {model.model_fields["kind"].default for model in get_args(get_args(RuleConfig)[0])}
    assert set(EVALUATORS) == set(RULE_SAMPLES) == set(RULE_PLACES) == kinds


@pytest.mark.parametrize("kind", sorted(RULE_SAMPLES))
def test_every_kind_is_built_from_its_config_and_checks_its_place(kind: str) -> None:
    camera = _camera([{"name": "r", "kind": kind, **RULE_SAMPLES[kind]}])
    RuleEngine(camera, frame_size=(640, 480), class_names=CLASSES)
    place = RULE_PLACES[kind]
    without_places = camera.model_copy(update={f"{place}s": []})
    with pytest.raises(ValueError, match=f"rule 'r' refers to unknown {place} '{place}-a'"):
        RuleEngine(without_places, frame_size=(640, 480), class_names=CLASSES)


def _stepping(
    n_frames: int, paths: dict[tuple[int, int], list[tuple[int, float]]]
) -> list[list[Obj]]:
    """Frames of tracks walking along y=100: `(track, class): [(from frame, x), ...]`."""
    return [
        [
            (track, [x for start, x in steps if start <= i][-1], 100.0, class_id, 0.9)
            for (track, class_id), steps in paths.items()
        ]
        for i in range(n_frames)
    ]


def _counts(events: list[RuleEvent]) -> list[tuple[Any, ...]]:
    return [(e.phase, round(e.timestamp_s, 3), e.line_counts) for e in events]


def test_count_line_totals_each_direction_per_interval_for_the_wanted_classes() -> None:
    engine = _engine(
        [{"name": "count", "kind": "count_line", "line": "line-a", "classes": ["person"],
          "interval_s": 1.0}]
    )  # fmt: skip
    frames = _stepping(
        21,  # 0.0 .. 2.0 s: the frame at 2.0 s closes the second interval
        {
            (1, 0): [(0, 250), (1, 350), (15, 250)],  # in at 0.1 s, out at 1.5 s
            (2, 0): [(0, 350), (2, 250)],  # out at 0.2 s
            (3, 1): [(0, 250), (1, 350), (12, 250)],  # a car: not counted
            (4, 0): [(0, 250), (12, 350)],  # in at 1.2 s
            (5, 0): [(0, 250), (16, 350)],  # in at 1.6 s
        },
    )
    events = _run(engine, frames)
    assert _counts(events) == [
        ("update", 1.0, LineCounts(start_s=0.0, interval_s=1.0, in_count=1, out_count=1)),
        ("update", 2.0, LineCounts(start_s=1.0, interval_s=1.0, in_count=2, out_count=1)),
    ]
    assert all(
        (e.kind, e.rule, e.line, e.zone, e.track_id, e.box, e.label, e.count, e.frame_size)
        == ("count_line", "count", "line-a", None, NO_TRACK, None, None, None, (640, 480))
        for e in events
    )
    assert _counts(engine.finish(2.0)) == [("update", 2.0, LineCounts(2.0, 1.0, 0, 0))]


def test_count_line_payload_and_event_id_per_interval() -> None:
    engine = _engine([{"name": "count", "kind": "count_line", "line": "line-a", "interval_s": 60}])
    events = _run(engine, _stepping(3, {(1, 0): [(0, 250), (1, 350)]}))
    (first,) = engine.update(Detections.empty(), 60.0)
    (second,) = engine.finish(61.0)
    assert events == []
    ids = EventIds("a")
    first_id, second_id = ids.id_for(first), ids.id_for(second)
    assert first_id == event_id("a", "cam-1", "count", NO_TRACK, 0.0, "line-a") != second_id
    assert second_id == event_id("a", "cam-1", "count", NO_TRACK, 60.0, "line-a")
    assert EventIds("a").id_for(first) == first_id  # a resend keeps its id
    body = event_payload(first, "a", first_id)
    assert {k: body[k] for k in ("phase", "kind", "line", "track_id", "count", "timestamp")} == {
        "phase": "update", "kind": "count_line", "line": "line-a", "track_id": None,
        "count": None, "timestamp": "1970-01-01T00:01:00.000Z",
    }  # fmt: skip
    assert list(body)[-3:] == ["counts", "interval_s", "interval_start"]
    assert (body["counts"], body["interval_s"], body["interval_start"]) == (
        {"in": 1, "out": 0},
        60.0,
        "1970-01-01T00:00:00.000Z",
    )
    enter = RuleEvent("r", "zone_enter", "cam", 1, 0, 0.0, (0.0, 0.0, 1.0, 1.0))
    assert not {"counts", "interval_s", "interval_start"} & set(event_payload(enter, "a", "id"))


def test_count_line_sends_the_partial_interval_when_the_stream_ends() -> None:
    engine = _engine([{"name": "count", "kind": "count_line", "line": "line-a"}])  # 60 s
    assert engine.finish(0.0) == []  # no frame: no interval
    _run(engine, _stepping(5, {(1, 0): [(0, 350), (2, 250)], (2, 2): [(0, 250), (3, 350)]}))
    assert _counts(engine.finish(0.45)) == [("update", 0.45, LineCounts(0.0, 60.0, 1, 1))]
    assert engine.finish(0.5) == []  # sent once


def test_count_line_reports_the_intervals_it_saw_frames_of_zeros_included() -> None:
    engine = _engine([{"name": "count", "kind": "count_line", "line": "line-a", "interval_s": 1}])
    events = []
    for t in (0.1, 1.1, 3.5):  # nothing crosses; no frame in [2, 3)
        events += engine.update(_dets([(1, 250, 100)]), t)
    assert _counts(events) == [
        ("update", 1.1, LineCounts(0.0, 1.0, 0, 0)),
        ("update", 3.5, LineCounts(1.0, 1.0, 0, 0)),
    ]


def test_count_line_cooldown_holds_back_counting_the_same_track_again() -> None:
    engine = _engine(
        [{"name": "count", "kind": "count_line", "line": "line-a", "cooldown_s": 0.25}]
    )
    _run(engine, [[(1, x, 100), (2, x, 120)] for x in (250, 350, 250, 350, 350, 250)])
    # each track crosses at 0.1 s (in), 0.2 (out), 0.3 (in), 0.5 (out): 0.2 and 0.3 are within
    # 0.25 s of the last one counted
    (event,) = engine.finish(0.5)
    assert event.line_counts == LineCounts(0.0, 60.0, in_count=2, out_count=2)


def test_zone_counts_follow_tracks_in_and_out_of_each_zone() -> None:
    engine = _engine([], track_timeout_s=0.25)
    assert engine.zone_counts() == {"zone-a": 0}
    inside, outside = 150.0, 50.0
    counts = []
    frames: list[list[Obj]] = [
        [(1, inside, 150), (2, outside, 150), (3, inside, 160, 1, 0.9)],  # any class counts
        [(1, inside, 150), (2, inside, 150), (3, inside, 160, 1, 0.9)],  # 2 enters
        [(1, outside, 150), (2, inside, 150)],  # 1 leaves; 3 unseen, still remembered
        [(2, inside, 150)],
        [(2, inside, 150)],  # 3 forgotten after 0.25 s
    ]
    for i, objects in enumerate(frames):
        engine.update(_dets(objects), i * 0.1)
        counts.append(engine.zone_counts()["zone-a"])
    assert counts == [2, 3, 2, 2, 1]
    engine.withdraw([2])
    assert engine.zone_counts() == {"zone-a": 0}
