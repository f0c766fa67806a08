"""The `events` preset: a zone, a directed line, scripted tracks, and the events they must raise.

Scripted tracks (at 640x360; scaled with the frame size) move along image rows, so their image
speed is constant and the frames of their events can be worked out by hand:
1. a person walks left to right through the zone (enter, exit, too quick to loiter) and crosses
   the line inward;
2. a car drives right to left below the zone and crosses the line outward;
3. a person walks into the zone, stands longer than the dwell time (loiter) and walks back out;
4. a forklift crosses the line outward, stops, reverses and crosses inward;
5. a far truck passes above the line's end: it crosses the infinite line but not the segment,
   so it raises nothing;
6. a person walks right to left: crosses the line outward, then through the zone.

`expected_events` derives events from ground-truth boxes alone (the bottom-centre of each box, as
the rules engine sees a tracked detection). Conventions: a zone event fires on the first frame a
track is seen on the other side; a track first seen inside a zone does not `enter`, and one that
vanishes inside does not `exit`; `loiter` fires once per stay, on the first frame with
`(frame - enter_frame) / fps >= dwell_s`. A line `in_side` is as seen looking from its first point
to its second in the image (y down): `left` is where the cross product is negative; crossing
toward `in_side` is `in`. Frames are 1-based, as in `gt.txt`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from testbed.scenes.motion import GroundCamera, TrackPlan, Waypoint
from testbed.scenes.sprites import CAR, CLASS_NAMES, FORKLIFT, PERSON, TRUCK, random_style

logger = logging.getLogger(__name__)

Point = tuple[float, float]

# Geometry at the reference size; scaled to the scene's size.
REFERENCE_SIZE_PX = (640, 360)
EVENTS_FRAMES = 360
LOITER_DWELL_S = 5.0
_ZONE_PX: tuple[Point, ...] = ((60.0, 230.0), (300.0, 230.0), (320.0, 330.0), (40.0, 330.0))
_LINE_PX: tuple[Point, Point] = ((480.0, 140.0), (480.0, 350.0))
_HORIZON_FRAC_HEIGHT = 0.2
_FOCAL_FRAC_WIDTH = 0.8
_CAMERA_HEIGHT_M = 6.0


@dataclass(frozen=True)
class ZoneSpec:
    """A named polygon in pixels; an object is inside when its box's bottom-centre is."""

    name: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class LineSpec:
    """A named directed segment in pixels; `in_side` as in the edge agent's `LineConfig`."""

    name: str
    points: tuple[Point, Point]
    in_side: Literal["left", "right"]


@dataclass(frozen=True)
class ScriptedLeg:
    """One straight move along an image row: to column `to_u_px` at `speed_mps`, then a pause."""

    to_u_px: float
    speed_mps: float
    pause_s: float = 0.0


@dataclass(frozen=True)
class ScriptedTrack:
    """A track on image row `row_px` starting at column `from_u_px` on frame `start_frame`."""

    track_id: int
    class_id: int
    row_px: float
    from_u_px: float
    start_frame: int
    legs: tuple[ScriptedLeg, ...]


# In reference pixels; see the module docstring for what each one is for.
SCRIPTED_TRACKS: tuple[ScriptedTrack, ...] = (
    ScriptedTrack(1, PERSON, 300.0, -20.0, 0, (ScriptedLeg(680.0, 2.0),)),
    ScriptedTrack(2, CAR, 345.0, 760.0, 20, (ScriptedLeg(-120.0, 5.0),)),
    ScriptedTrack(
        3, PERSON, 280.0, -20.0, 0, (ScriptedLeg(180.0, 1.6, 7.0), ScriptedLeg(-20.0, 1.6))
    ),
    ScriptedTrack(
        4, FORKLIFT, 200.0, 690.0, 30, (ScriptedLeg(400.0, 1.8, 1.5), ScriptedLeg(700.0, 1.8))
    ),
    ScriptedTrack(5, TRUCK, 125.0, 690.0, 0, (ScriptedLeg(-60.0, 6.0),)),
    ScriptedTrack(6, PERSON, 250.0, 662.0, 60, (ScriptedLeg(-20.0, 2.0),)),
)


@dataclass(frozen=True)
class EventsLayout:
    """What the `events` preset adds to a scene."""

    camera: GroundCamera
    zones: tuple[ZoneSpec, ...]
    lines: tuple[LineSpec, ...]
    tracks: tuple[TrackPlan, ...]
    loiter_dwell_s: float
    n_frames: int


def events_camera(width_px: int, height_px: int) -> GroundCamera:
    """The camera of the events preset at the given size."""
    return GroundCamera(
        width_px=width_px,
        height_px=height_px,
        horizon_y_px=_HORIZON_FRAC_HEIGHT * height_px,
        focal_px=_FOCAL_FRAC_WIDTH * width_px,
        camera_height_m=_CAMERA_HEIGHT_M,
    )


def scripted_plan(
    track: ScriptedTrack, camera: GroundCamera, rng: np.random.Generator, scale: Point
) -> TrackPlan:
    """The ground plan of a scripted track at the camera's size (looks drawn from `rng`)."""
    sx, sy = scale
    row = track.row_px * sy
    points = [track.from_u_px * sx] + [leg.to_u_px * sx for leg in track.legs]
    waypoints = []
    for i, u_px in enumerate(points):
        x_m, z_m = camera.ground_point(u_px, row)
        leg_from = track.legs[i] if i < len(track.legs) else None
        previous = track.legs[i - 1] if i > 0 else None
        waypoints.append(
            Waypoint(
                x_m,
                z_m,
                speed_mps=leg_from.speed_mps if leg_from else 1.0,
                pause_s=previous.pause_s if previous else 0.0,
            )
        )
    # The last waypoint's pause is the last leg's; drop it so tracks end where they leave.
    last = waypoints[-1]
    waypoints[-1] = Waypoint(last.x_m, last.z_m, last.speed_mps, 0.0)
    style = random_style(track.class_id, rng)
    return TrackPlan(track.track_id, style, track.start_frame, tuple(waypoints), smooth=False)


def events_layout(
    rng: np.random.Generator, width_px: int, height_px: int, fps: float
) -> EventsLayout:
    """Zone, line and scripted tracks at the given size; styles vary with `rng`."""
    sx, sy = width_px / REFERENCE_SIZE_PX[0], height_px / REFERENCE_SIZE_PX[1]
    camera = events_camera(width_px, height_px)
    zone = ZoneSpec("zone-a", tuple((x * sx, y * sy) for x, y in _ZONE_PX))
    (ax, ay), (bx, by) = _LINE_PX
    line = LineSpec("line-a", ((ax * sx, ay * sy), (bx * sx, by * sy)), "left")
    tracks = tuple(scripted_plan(t, camera, rng, (sx, sy)) for t in SCRIPTED_TRACKS)
    frames = round(EVENTS_FRAMES * fps / 25.0)
    return EventsLayout(camera, (zone,), (line,), tracks, LOITER_DWELL_S, frames)


def point_in_polygon(x: float, y: float, polygon: Sequence[Point]) -> bool:
    """Even-odd rule; a point exactly on an edge may fall either way."""
    inside = False
    n = len(polygon)
    for i in range(n):
        (x0, y0), (x1, y1) = polygon[i], polygon[(i + 1) % n]
        if (y0 > y) != (y1 > y) and x < x0 + (y - y0) * (x1 - x0) / (y1 - y0):
            inside = not inside
    return inside


def _cross(a: Point, b: Point, p: Point) -> float:
    return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])


def _segments_intersect(p: Point, q: Point, a: Point, b: Point) -> bool:
    d1, d2 = _cross(a, b, p), _cross(a, b, q)
    d3, d4 = _cross(p, q, a), _cross(p, q, b)
    return d1 * d2 <= 0 and d3 * d4 <= 0


@dataclass(frozen=True)
class _Observation:
    frame: int
    point: Point


def _observations(gt_rows: Iterable[Sequence[float]]) -> dict[int, tuple[int, list[_Observation]]]:
    """Per track id: its class and bottom-centre points by frame, from MOT rows."""
    tracks: dict[int, tuple[int, list[_Observation]]] = {}
    for frame, track_id, x, y, w, h, _conf, class_id, *_rest in gt_rows:
        entry = tracks.setdefault(int(track_id), (int(class_id), []))
        entry[1].append(_Observation(int(frame), (x + w / 2.0, y + h)))
    for _, obs in tracks.values():
        obs.sort(key=lambda o: o.frame)
    return tracks


def _zone_events(
    track_id: int, cls: str, obs: list[_Observation], zone: ZoneSpec, dwell_s: float, fps: float
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    was_inside: bool | None = None
    entered: int | None = None
    loitered = False
    for o in obs:
        inside = point_in_polygon(o.point[0], o.point[1], zone.points)
        base = {"track_id": track_id, "class": cls, "zone": zone.name, "frame": o.frame}
        if was_inside is not None and inside != was_inside:
            events.append({**base, "kind": "zone_enter" if inside else "zone_exit"})
            entered, loitered = (o.frame, False) if inside else (None, False)
        if inside and entered is not None and not loitered:
            if (o.frame - entered) / fps >= dwell_s:
                events.append({**base, "kind": "loiter", "dwell_s": dwell_s})
                loitered = True
        was_inside = inside
    return events


def _line_events(
    track_id: int, cls: str, obs: list[_Observation], line: LineSpec
) -> list[dict[str, Any]]:
    a, b = line.points
    in_sign = -1.0 if line.in_side == "left" else 1.0
    events: list[dict[str, Any]] = []
    last: _Observation | None = None  # last observation strictly on one side
    for o in obs:
        side = _cross(a, b, o.point)
        if side == 0:
            continue
        if last is not None:
            last_side = _cross(a, b, last.point)
            if (side > 0) != (last_side > 0) and _segments_intersect(last.point, o.point, a, b):
                direction = "in" if (side > 0) == (in_sign > 0) else "out"
                events.append(
                    {"track_id": track_id, "class": cls, "line": line.name, "frame": o.frame,
                     "kind": "line_cross", "direction": direction}
                )  # fmt: skip
        last = o
    return events


def expected_events(
    gt_rows: Iterable[Sequence[float]],
    zones: Sequence[ZoneSpec],
    lines: Sequence[LineSpec],
    *,
    loiter_dwell_s: float,
    fps: float,
) -> list[dict[str, Any]]:
    """Events implied by MOT ground-truth rows `(frame, id, x, y, w, h, conf, class, vis)`."""
    events: list[dict[str, Any]] = []
    for track_id, (class_id, obs) in sorted(_observations(gt_rows).items()):
        cls = CLASS_NAMES[class_id]
        for zone in zones:
            events += _zone_events(track_id, cls, obs, zone, loiter_dwell_s, fps)
        for line in lines:
            events += _line_events(track_id, cls, obs, line)
    events.sort(key=lambda e: (e["frame"], e["track_id"], e["kind"]))
    return events
