"""Scenario presets: everything a scene needs, decided from a seed, in one `ScenarioSpec`.

Presets: `quiet` (a few objects), `crowded` (many, overlapping), `small_far` (a wide camera and
objects far away, mostly under 32x32 px at 640x360) and `events` (a zone, a directed line and
scripted tracks with known events; see `testbed.scenes.events`). Same preset, seed and size give
the same spec, hence the same frames and ground truth.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testbed.scenes.background import BACKGROUND_SEGMENTS, BackgroundSpec, load_background
from testbed.scenes.events import LineSpec, ZoneSpec, events_layout
from testbed.scenes.motion import GroundCamera, TrackPlan, plan_duration_frames, random_crossing
from testbed.scenes.render import Effects, SceneRenderer
from testbed.scenes.sprites import CAR, CLASS_NAMES, FORKLIFT, PERSON, TRUCK, random_style

logger = logging.getLogger(__name__)

PRESETS: tuple[str, ...] = ("quiet", "crowded", "small_far", "events")
DEFAULT_WIDTH_PX = 640
DEFAULT_HEIGHT_PX = 360
DEFAULT_FPS = 25.0
DEFAULT_FRAMES = 250

_SPEED_RANGE_MPS: dict[int, tuple[float, float]] = {
    PERSON: (0.8, 1.8),
    CAR: (3.0, 8.0),
    TRUCK: (2.5, 6.0),
    FORKLIFT: (1.2, 3.0),
}


@dataclass(frozen=True)
class ScenarioSpec:
    """A complete, serialisable description of one scene."""

    name: str
    preset: str
    seed: int
    width_px: int
    height_px: int
    fps: float
    n_frames: int
    camera: GroundCamera
    background: BackgroundSpec
    effects: Effects
    tracks: tuple[TrackPlan, ...]
    zones: tuple[ZoneSpec, ...] = ()
    lines: tuple[LineSpec, ...] = ()
    loiter_dwell_s: float | None = None
    class_names: tuple[str, ...] = field(default=CLASS_NAMES)

    def to_json(self) -> dict[str, Any]:
        """The spec as plain JSON types (tuples become lists).

        `background.still` is written only when set, so specs from before it existed keep their
        JSON (and the scene caches keyed by it stay valid).
        """
        document = dataclasses.asdict(self)
        if not self.background.still:
            del document["background"]["still"]
        return document


@dataclass(frozen=True)
class CrowdParams:
    """How a random preset fills its scene.

    `mean_concurrent_objects`: objects on screen on average; `class_weights`: relative frequency
    per class id; `depth_range_m`: distances objects walk or drive at; camera: `focal_frac_width`
    (focal length / image width), `horizon_frac_height` (horizon row / image height),
    `camera_height_m`.
    """

    mean_concurrent_objects: float
    class_weights: tuple[float, float, float, float]
    depth_range_m: tuple[float, float]
    focal_frac_width: float = 0.8
    horizon_frac_height: float = 0.2
    camera_height_m: float = 6.0
    stop_probability: float = 0.25
    stop_range_s: tuple[float, float] = (1.0, 4.0)
    speed_change_range: tuple[float, float] = (0.6, 1.4)


PRESET_PARAMS: dict[str, CrowdParams] = {
    "quiet": CrowdParams(3.0, (0.45, 0.25, 0.1, 0.2), (12.0, 40.0)),
    "crowded": CrowdParams(16.0, (0.55, 0.2, 0.07, 0.18), (11.0, 35.0)),
    "small_far": CrowdParams(
        8.0,
        (0.5, 0.3, 0.03, 0.17),
        (38.0, 75.0),
        focal_frac_width=0.55,
        horizon_frac_height=0.3,
        camera_height_m=8.0,
    ),
}


def _camera(params: CrowdParams, width: int, height: int) -> GroundCamera:
    return GroundCamera(
        width_px=width,
        height_px=height,
        horizon_y_px=params.horizon_frac_height * height,
        focal_px=params.focal_frac_width * width,
        camera_height_m=params.camera_height_m,
    )


def _background(rng: np.random.Generator) -> BackgroundSpec:
    names = sorted(BACKGROUND_SEGMENTS)
    return BackgroundSpec(
        segment=names[int(rng.integers(len(names)))],
        crop_x_fraction=round(float(rng.uniform(0.0, 1.0)), 3),
        mirror=bool(rng.random() < 0.5),
    )


def _effects(rng: np.random.Generator, n_frames: int, *, defocus: bool = True) -> Effects:
    """Noise always; a slow dimming or a sudden light switch; sometimes a defocused span."""
    keys: tuple[tuple[int, float], ...] = ()
    roll = rng.random()
    if roll < 0.5:  # clouds: gradual dimming and recovery
        mid, low = int(rng.integers(n_frames // 4, 3 * n_frames // 4 + 1)), rng.uniform(0.55, 0.8)
        keys = ((0, 1.0), (mid, round(float(low), 3)), (n_frames - 1, 1.0))
    elif roll < 0.75:  # a light switched: sudden change
        at, gain = int(rng.integers(1, max(2, n_frames))), round(float(rng.uniform(0.6, 1.3)), 3)
        keys = ((0, 1.0), (at - 1, 1.0), (at, gain), (n_frames, gain))
    windows: tuple[tuple[int, int, float], ...] = ()
    if defocus and rng.random() < 0.3:
        first = int(rng.integers(0, max(1, n_frames - 10)))
        windows = (
            (first, first + int(rng.integers(8, 26)), round(float(rng.uniform(0.8, 2.0)), 2)),
        )
    return Effects(
        noise_sigma_levels=round(float(rng.uniform(1.0, 4.0)), 2),
        lighting_keyframes=keys,
        defocus_windows=windows,
    )


def _random_tracks(
    rng: np.random.Generator, params: CrowdParams, camera: GroundCamera, n_frames: int, fps: float
) -> tuple[TrackPlan, ...]:
    """Tracks until their time on screen adds up to `mean_concurrent_objects` x `n_frames`.

    Each track starts at a uniform time between "already leaving at frame 0" and the last frame,
    so scenes start populated and some tracks are still on screen at the end.
    """
    weights = np.asarray(params.class_weights, np.float64)
    weights /= weights.sum()
    plans: list[TrackPlan] = []
    budget = params.mean_concurrent_objects * n_frames
    while budget > 0:
        class_id = int(rng.choice(len(weights), p=weights))
        plan = random_crossing(
            rng,
            camera,
            random_style(class_id, rng),
            track_id=len(plans) + 1,
            start_frame=0,
            depth_range_m=params.depth_range_m,
            speed_range_mps=_SPEED_RANGE_MPS[class_id],
            stop_probability=params.stop_probability,
            stop_range_s=params.stop_range_s,
            speed_change_range=params.speed_change_range,
        )
        duration = plan_duration_frames(plan, fps)
        start = int(rng.integers(-duration + 1, n_frames))
        plans.append(dataclasses.replace(plan, start_frame=start))
        budget -= min(start + duration, n_frames) - max(start, 0)
    return tuple(plans)


def make_scenario(
    preset: str,
    seed: int,
    *,
    n_frames: int | None = None,
    width_px: int = DEFAULT_WIDTH_PX,
    height_px: int = DEFAULT_HEIGHT_PX,
    fps: float = DEFAULT_FPS,
    static_camera: bool = False,
) -> ScenarioSpec:
    """The spec of preset `preset` for `seed` (deterministic).

    `static_camera`: the same scene (objects, effects, background framing) on a still
    background, named `<preset>-s<seed>-static`.
    """
    spec = _make_scenario(preset, seed, n_frames, width_px, height_px, fps)
    if not static_camera:
        return spec
    return dataclasses.replace(
        spec,
        name=f"{spec.name}-static",
        background=dataclasses.replace(spec.background, still=True),
    )


def _make_scenario(
    preset: str,
    seed: int,
    n_frames: int | None,
    width_px: int,
    height_px: int,
    fps: float,
) -> ScenarioSpec:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {PRESETS}")
    if width_px < 32 or height_px < 32 or width_px % 2 or height_px % 2:
        raise ValueError(f"size must be even and >= 32 px, got {width_px}x{height_px}")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    rng = np.random.default_rng((seed, PRESETS.index(preset)))
    name = f"{preset}-s{seed}"
    if preset == "events":
        layout = events_layout(rng, width_px, height_px, fps)
        frames = n_frames if n_frames is not None else layout.n_frames
        return ScenarioSpec(
            name=name, preset=preset, seed=seed, width_px=width_px, height_px=height_px,
            fps=fps, n_frames=frames, camera=layout.camera, background=_background(rng),
            effects=_effects(rng, frames, defocus=False), tracks=layout.tracks,
            zones=layout.zones, lines=layout.lines, loiter_dwell_s=layout.loiter_dwell_s,
        )  # fmt: skip
    frames = n_frames if n_frames is not None else DEFAULT_FRAMES
    if frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {frames}")
    params = PRESET_PARAMS[preset]
    camera = _camera(params, width_px, height_px)
    background = _background(rng)
    effects = _effects(rng, frames)
    tracks = _random_tracks(rng, params, camera, frames, fps)
    return ScenarioSpec(
        name=name, preset=preset, seed=seed, width_px=width_px, height_px=height_px, fps=fps,
        n_frames=frames, camera=camera, background=background, effects=effects, tracks=tracks,
    )  # fmt: skip


def build_renderer(spec: ScenarioSpec, cache_dir: Path) -> SceneRenderer:
    """A renderer for `spec`, with its background decoded from clips cached in `cache_dir`."""
    background = load_background(spec.background, spec.width_px, spec.height_px, cache_dir)
    return SceneRenderer(
        spec.camera,
        spec.tracks,
        background,
        spec.effects,
        n_frames=spec.n_frames,
        fps=spec.fps,
        seed=spec.seed,
    )
