"""Compositing: sprites over the background in depth order, with exact boxes and visibility.

Each frame is a pure function of the scene and the frame index, so any frame can be rendered
alone (the dataset samples every Nth frame). Objects are drawn far to near; an id buffer records
which object owns each pixel, so visibility is the fraction of an object's solid pixels that are
neither covered by nearer objects nor outside the frame. After compositing come the camera
effects: lighting gain, defocus blur and Gaussian sensor noise (no JPEG anywhere).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from testbed.scenes.background import Background
from testbed.scenes.motion import GroundCamera, TrackPlan, TrackStates, sample_track
from testbed.scenes.sprites import ByteImage, Sprite, SpriteBank

logger = logging.getLogger(__name__)

_NO_OWNER = -1
_NOISE_TILES = 4
_NOISE_PAD_PX = 32


@dataclass(frozen=True)
class Effects:
    """Camera effects of a scene.

    `noise_sigma_levels`: std-dev of Gaussian sensor noise in grey levels (0 = none).
    `lighting_keyframes`: `(frame, gain)` pairs, gain interpolated linearly between them (two
    keyframes one frame apart make a sudden switch); empty = constant 1.
    `defocus_windows`: `(first_frame, stop_frame, sigma_px)` spans blurred as a whole.
    `motion_blur_exposure`: fraction of the frame interval the shutter is open; an object moving
    faster than `min_motion_blur_px` per exposure is smeared along its motion.
    """

    noise_sigma_levels: float = 2.0
    lighting_keyframes: tuple[tuple[int, float], ...] = ()
    defocus_windows: tuple[tuple[int, int, float], ...] = ()
    motion_blur_exposure: float = 0.5
    min_motion_blur_px: int = 3


@dataclass(frozen=True, eq=False)
class FrameTruth:
    """Ground truth of one frame: per object track id, class, box `(x, y, w, h)`, visibility.

    Boxes are 0-based pixel coordinates of the object's drawn pixels, clipped to the frame
    (`x + w` is exclusive). Visibility is in [0, 1]; fully occluded objects stay with 0.
    """

    track_id: npt.NDArray[np.int64]
    class_id: npt.NDArray[np.int64]
    box_xywh: npt.NDArray[np.int64]
    visibility: npt.NDArray[np.float32]

    def __len__(self) -> int:
        return int(self.track_id.shape[0])


@dataclass(frozen=True)
class _Placed:
    index: int
    sprite: Sprite
    frame_slice: tuple[slice, slice]
    sprite_slice: tuple[slice, slice]


class SceneRenderer:
    """Renders frames and their ground truth for tracks over a background."""

    def __init__(
        self,
        camera: GroundCamera,
        plans: Sequence[TrackPlan],
        background: Background,
        effects: Effects,
        *,
        n_frames: int,
        fps: float,
        seed: int,
    ) -> None:
        self.camera = camera
        self.plans = tuple(plans)
        self.n_frames = n_frames
        self.fps = fps
        self.effects = effects
        self._seed = seed
        self._background = background
        self._states: list[TrackStates] = [
            sample_track(plan, camera, n_frames, fps) for plan in self.plans
        ]
        self._banks = [SpriteBank(plan.style) for plan in self.plans]
        self._owner = np.full((camera.height_px, camera.width_px), _NO_OWNER, np.int16)
        frames = np.arange(n_frames)
        if effects.lighting_keyframes:
            keys = sorted(effects.lighting_keyframes)
            self._gain = np.interp(frames, [k for k, _ in keys], [g for _, g in keys])
        else:
            self._gain = np.ones(n_frames)
        self._noise = self._noise_tiles(np.random.default_rng((seed, 0x5E)))

    def _noise_tiles(self, rng: np.random.Generator) -> npt.NDArray[np.int16]:
        sigma = self.effects.noise_sigma_levels
        shape = (
            _NOISE_TILES,
            self.camera.height_px + _NOISE_PAD_PX,
            self.camera.width_px + _NOISE_PAD_PX,
            3,
        )
        if sigma <= 0:
            return np.zeros((0, 1, 1, 3), np.int16)
        noise: npt.NDArray[np.float32] = np.rint(rng.standard_normal(shape, np.float32) * sigma)
        return noise.astype(np.int16)

    def render(self, index: int) -> tuple[ByteImage, FrameTruth]:
        """Frame `index` (0-based) as BGR uint8 `(h, w, 3)` and its ground truth."""
        if not 0 <= index < self.n_frames:
            raise IndexError(f"frame {index} outside 0..{self.n_frames - 1}")
        image = self._background.frame(index).copy()
        placed = self._composite(image, index)
        truth = self._truth(placed)
        return self._camera_effects(image, index), truth

    def _sprite_for(self, i: int, index: int) -> Sprite:
        st = self._states[i]
        blur_px = 0
        if self.effects.motion_blur_exposure > 0:
            length = st.speed_px_per_frame[index] * self.effects.motion_blur_exposure
            if length >= self.effects.min_motion_blur_px:
                blur_px = 2 * math.ceil(length / 2)  # even steps: fewer renders to cache
        return self._banks[i].get(
            float(st.height_px[index]),
            phase=float(st.phase_rad[index]),
            flip=bool(st.flip[index]),
            blur_px=blur_px,
            blur_angle_rad=float(st.heading_rad[index]),
        )

    def _composite(self, image: ByteImage, index: int) -> list[_Placed]:
        height, width = image.shape[:2]
        present = [i for i, st in enumerate(self._states) if st.present[index]]
        # Far to near; ties broken by track order so the result never depends on set order.
        present.sort(key=lambda i: (-self._states[i].z_m[index], i))
        owner = self._owner
        owner.fill(_NO_OWNER)
        placed: list[_Placed] = []
        for i in present:
            sprite = self._sprite_for(i, index)
            st = self._states[i]
            x0 = round(st.u_px[index] - sprite.anchor_xy[0])
            y0 = round(st.v_px[index] - sprite.anchor_xy[1])
            fx0, fy0 = max(x0, 0), max(y0, 0)
            fx1, fy1 = min(x0 + sprite.width, width), min(y0 + sprite.height, height)
            if fx0 >= fx1 or fy0 >= fy1:
                continue
            fs = (slice(fy0, fy1), slice(fx0, fx1))
            ss = (slice(fy0 - y0, fy1 - y0), slice(fx0 - x0, fx1 - x0))
            roi = image[fs]
            blended = roi.astype(np.float32)
            blended *= sprite.one_minus_alpha[ss]
            blended += sprite.premul[ss]
            blended += 0.5
            roi[...] = blended.astype(np.uint8)
            owner[fs][sprite.solid[ss]] = len(placed)
            placed.append(_Placed(i, sprite, fs, ss))
        return placed

    def _truth(self, placed: list[_Placed]) -> FrameTruth:
        rows: list[tuple[int, int, int, int, int, int, float]] = []
        for k, p in enumerate(placed):
            drawn = p.sprite.drawn[p.sprite_slice]
            y0, x0 = p.frame_slice[0].start, p.frame_slice[1].start
            if drawn.shape != p.sprite.drawn.shape:  # cut by the border: re-tighten the box
                cols = np.flatnonzero(drawn.any(axis=0))
                rws = np.flatnonzero(drawn.any(axis=1))
                if cols.size == 0:
                    continue
                bx, by = x0 + int(cols[0]), y0 + int(rws[0])
                bw, bh = int(cols[-1] - cols[0]) + 1, int(rws[-1] - rws[0]) + 1
            else:
                bx, by, bw, bh = x0, y0, drawn.shape[1], drawn.shape[0]
            mine = self._owner[p.frame_slice] == k
            visible = np.count_nonzero(mine & p.sprite.solid[p.sprite_slice])
            plan = self.plans[p.index]
            vis = visible / p.sprite.solid_count
            rows.append((plan.track_id, plan.style.class_id, bx, by, bw, bh, vis))
        rows.sort()
        table = np.array([r[:6] for r in rows], np.int64).reshape(-1, 6)
        return FrameTruth(
            track_id=table[:, 0],
            class_id=table[:, 1],
            box_xywh=table[:, 2:6],
            visibility=np.array([r[6] for r in rows], np.float32),
        )

    def _camera_effects(self, image: ByteImage, index: int) -> ByteImage:
        gain = float(self._gain[index])
        if gain != 1.0:
            image = np.asarray(cv2.convertScaleAbs(image, alpha=gain), np.uint8)
        for first, stop, sigma_px in self.effects.defocus_windows:
            if first <= index < stop and sigma_px > 0:
                image = np.asarray(cv2.GaussianBlur(image, (0, 0), sigma_px), np.uint8)
        if self._noise.shape[0]:
            rng = np.random.default_rng((self._seed, index))
            tile = int(rng.integers(_NOISE_TILES))
            dy, dx = (int(v) for v in rng.integers(0, _NOISE_PAD_PX, size=2))
            h, w = image.shape[:2]
            noise = self._noise[tile, dy : dy + h, dx : dx + w]
            image = np.asarray(cv2.add(image, noise, dtype=cv2.CV_8U), np.uint8)
        return image
