"""Trajectories on a flat ground plane seen by a pinhole camera: depth sets size and speed.

An object moves through ground waypoints `(x_m, z_m)` (metres across and away from the camera)
at a speed per leg, pausing where told (a stop, a loiter). Legs are straight or smoothed with a
Catmull-Rom spline. `sample_track` turns a plan into per-frame image states: the foot point,
the sprite height (far objects are small and slow), heading, walking phase and image speed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from testbed.scenes.sprites import PERSON, SpriteStyle, aspect_ratio

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_SPLINE_SAMPLES_PER_LEG = 24
_STOPPED_PX_PER_FRAME = 0.05  # slower than this keeps the previous heading
_STRIDE_PER_HEIGHT = 0.8  # one full walking cycle covers this many body heights


@dataclass(frozen=True)
class GroundCamera:
    """Pinhole camera `camera_height_m` above flat ground, looking level at the horizon row."""

    width_px: int
    height_px: int
    horizon_y_px: float
    focal_px: float
    camera_height_m: float

    def project(self, x_m: FloatArray, z_m: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Ground point(s) to image foot point(s) `(u, v)` in pixels."""
        u = self.width_px / 2.0 + self.focal_px * x_m / z_m
        v = self.horizon_y_px + self.focal_px * self.camera_height_m / z_m
        return u, v

    def ground_point(self, u_px: float, v_px: float) -> tuple[float, float]:
        """The ground point `(x_m, z_m)` seen at image pixel `(u, v)` (below the horizon)."""
        if v_px <= self.horizon_y_px:
            raise ValueError(f"row {v_px} is not below the horizon row {self.horizon_y_px}")
        z_m = self.focal_px * self.camera_height_m / (v_px - self.horizon_y_px)
        return (u_px - self.width_px / 2.0) * z_m / self.focal_px, z_m

    def depth_at_row(self, v_px: float) -> float:
        """Distance in metres of the ground seen at image row `v_px`."""
        return self.ground_point(self.width_px / 2.0, v_px)[1]

    def x_at_column(self, u_px: float, z_m: float) -> float:
        """Ground `x_m` seen at image column `u_px` at depth `z_m`."""
        return (u_px - self.width_px / 2.0) * z_m / self.focal_px


@dataclass(frozen=True)
class Waypoint:
    """A ground point; `speed_mps` is the speed of the leg that leaves it, `pause_s` a stop here."""

    x_m: float
    z_m: float
    speed_mps: float = 1.4
    pause_s: float = 0.0


@dataclass(frozen=True)
class TrackPlan:
    """One object: identity, look, when it starts (may be before frame 0) and where it goes."""

    track_id: int
    style: SpriteStyle
    start_frame: int
    waypoints: tuple[Waypoint, ...]
    smooth: bool = True


@dataclass(frozen=True, eq=False)
class TrackStates:
    """Per-frame state of one track over a scene's frames (arrays of length `n_frames`)."""

    present: BoolArray
    u_px: FloatArray
    v_px: FloatArray
    z_m: FloatArray
    height_px: FloatArray
    speed_px_per_frame: FloatArray
    heading_rad: FloatArray
    flip: BoolArray
    phase_rad: FloatArray


def _catmull_rom(points: FloatArray, samples: int) -> list[FloatArray]:
    """Dense points of each leg of a Catmull-Rom spline through `points` (ends duplicated)."""
    padded = np.vstack([points[:1], points, points[-1:]])
    t = np.linspace(0.0, 1.0, samples)[:, None]
    legs = []
    for i in range(1, len(padded) - 2):
        p0, p1, p2, p3 = padded[i - 1], padded[i], padded[i + 1], padded[i + 2]
        legs.append(
            0.5
            * (
                2 * p1
                + (-p0 + p2) * t
                + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t**2
                + (-p0 + 3 * p1 - 3 * p2 + p3) * t**3
            )
        )
    return legs


def _legs(plan: TrackPlan) -> list[FloatArray]:
    points = np.array([(w.x_m, w.z_m) for w in plan.waypoints], dtype=np.float64)
    if plan.smooth and len(points) > 2:
        return _catmull_rom(points, _SPLINE_SAMPLES_PER_LEG)
    return [points[i : i + 2] for i in range(len(points) - 1)]


def sample_track(plan: TrackPlan, camera: GroundCamera, n_frames: int, fps: float) -> TrackStates:
    """Per-frame image states of `plan` for frames `0..n_frames-1` at `fps`."""
    if len(plan.waypoints) < 2:
        raise ValueError(f"track {plan.track_id} needs at least 2 waypoints")
    legs = _legs(plan)
    path = np.vstack([legs[0][:1]] + [leg[1:] for leg in legs])
    steps = np.hypot(*np.diff(path, axis=0).T)
    cum = np.concatenate([[0.0], np.cumsum(steps)])
    # Time knots: pause at each waypoint, then travel its leg at its speed.
    knots_t, knots_s, t, s = [0.0], [0.0], 0.0, 0.0
    for waypoint, leg in zip(plan.waypoints, [*legs, None], strict=True):
        if waypoint.pause_s > 0:
            t += waypoint.pause_s
            knots_t.append(t)
            knots_s.append(s)
        if leg is not None:
            length = float(np.hypot(*np.diff(leg, axis=0).T).sum())
            if waypoint.speed_mps <= 0:
                raise ValueError(f"track {plan.track_id}: speed_mps must be > 0")
            t += length / waypoint.speed_mps
            s += length
            knots_t.append(t)
            knots_s.append(s)
    frames = np.arange(n_frames, dtype=np.float64)
    time_s = (frames - plan.start_frame) / fps
    present = (time_s >= 0.0) & (time_s <= knots_t[-1])
    arc = np.interp(time_s, knots_t, knots_s)
    arc = np.minimum(arc, cum[-1])
    x_m = np.interp(arc, cum, path[:, 0])
    z_m = np.interp(arc, cum, path[:, 1])
    u, v = camera.project(x_m, z_m)
    height = camera.focal_px * plan.style.height_m / z_m
    du = np.gradient(u) if n_frames > 1 else np.zeros(n_frames)
    dv = np.gradient(v) if n_frames > 1 else np.zeros(n_frames)
    speed = np.hypot(du, dv)
    moving = np.abs(du) > _STOPPED_PX_PER_FRAME
    last_moving = np.maximum.accumulate(np.where(moving, np.arange(n_frames), 0))
    flip = (du < 0)[last_moving]
    stride_m = _STRIDE_PER_HEIGHT * plan.style.height_m
    phase = (2 * math.pi / stride_m) * arc if plan.style.class_id == PERSON else np.zeros(n_frames)
    return TrackStates(
        present=present,
        u_px=u,
        v_px=v,
        z_m=z_m,
        height_px=height,
        speed_px_per_frame=speed,
        heading_rad=np.arctan2(dv, du),
        flip=flip,
        phase_rad=phase,
    )


def half_width_m(style: SpriteStyle) -> float:
    """Half the object's drawn width in metres (what must leave the frame for it to be gone)."""
    return 0.5 * style.height_m * aspect_ratio(style)


def random_crossing(
    rng: np.random.Generator,
    camera: GroundCamera,
    style: SpriteStyle,
    *,
    track_id: int,
    start_frame: int,
    depth_range_m: tuple[float, float],
    speed_range_mps: tuple[float, float],
    stop_probability: float,
    stop_range_s: tuple[float, float],
    speed_change_range: tuple[float, float],
) -> TrackPlan:
    """A plan that enters across the left or right border, wanders, and leaves across one.

    Depth changes between waypoints (scale changes), each leg gets its own speed
    (`speed_change_range` multiplies the base speed) and an inner waypoint is a stop with
    `stop_probability`. Most tracks leave on the far side; some turn back.
    """
    z_lo, z_hi = depth_range_m
    margin_m = half_width_m(style) + 0.5

    def border_point(side: int, z_m: float) -> tuple[float, float]:
        u_edge = 0.0 if side < 0 else float(camera.width_px)
        x_m = camera.x_at_column(u_edge, z_m) + side * (margin_m + 0.02 * z_m)
        return x_m, z_m

    enter_side = -1 if rng.random() < 0.5 else 1
    exit_side = -enter_side if rng.random() < 0.85 else enter_side
    base_speed = float(rng.uniform(*speed_range_mps))
    n_inner = int(rng.integers(1, 3))
    points = [border_point(enter_side, float(rng.uniform(z_lo, z_hi)))]
    for k in range(n_inner):
        z_m = float(rng.uniform(z_lo, z_hi))
        frac = (k + 1) / (n_inner + 1) if exit_side != enter_side else float(rng.uniform(0.2, 0.6))
        u_frac = frac if enter_side < 0 else 1.0 - frac
        u_px = camera.width_px * float(np.clip(u_frac + rng.normal(0, 0.08), 0.05, 0.95))
        points.append((camera.x_at_column(u_px, z_m), z_m))
    points.append(border_point(exit_side, float(rng.uniform(z_lo, z_hi))))
    waypoints = []
    for i, (x_m, z_m) in enumerate(points):
        inner = 0 < i < len(points) - 1
        stop = inner and rng.random() < stop_probability
        pause = float(rng.uniform(*stop_range_s)) if stop else 0.0
        speed = base_speed * float(rng.uniform(*speed_change_range))
        waypoints.append(Waypoint(x_m, z_m, speed_mps=speed, pause_s=pause))
    return TrackPlan(track_id, style, start_frame, tuple(waypoints), smooth=True)


def plan_duration_frames(plan: TrackPlan, fps: float) -> int:
    """How many frames the plan lasts from its start frame to its last waypoint."""
    total_s = sum(w.pause_s for w in plan.waypoints)
    for waypoint, leg in zip(plan.waypoints, _legs(plan), strict=False):
        total_s += float(np.hypot(*np.diff(leg, axis=0).T).sum()) / waypoint.speed_mps
    return math.ceil(total_s * fps)
