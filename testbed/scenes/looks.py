"""How a camera renders the world: image transforms applied after a scene is drawn.

The test world's scenes are daylight colour video. Real sites differ: an infrared camera at night
gives a dim, grey, grainy picture; a cheap sensor washes colours out. A `Look` turns a rendered
frame into what such a camera shows, without touching the ground truth (objects stay where they
are), so a model can be scored on a camera unlike its training data. Deterministic per frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from testbed.scenes.sprites import ByteImage

__all__ = ["LOOKS", "Look", "apply_look"]


@dataclass(frozen=True)
class Look:
    """Grey (infrared) or colour; a gain and offset on brightness; sensor noise; contrast."""

    name: str
    grey: bool = False
    gain: float = 1.0
    offset: float = 0.0
    noise_sigma: float = 0.0
    saturation: float = 1.0


LOOKS: dict[str, Look] = {
    "day": Look("day"),
    # a night camera with infrared light: no colour, dark, grainy
    "night-ir": Look("night-ir", grey=True, gain=0.55, offset=12.0, noise_sigma=7.0),
    # dusk without infrared: grey, dim, some grain
    "dim": Look("dim", grey=True, gain=0.75, offset=8.0, noise_sigma=4.0),
    # haze or a dirty dome: low contrast, pale colours
    "haze": Look("haze", gain=0.8, offset=40.0, noise_sigma=3.0, saturation=0.6),
    # an overexposed, washed-out sensor
    "washed": Look("washed", gain=0.6, offset=95.0, noise_sigma=3.0, saturation=0.35),
}


def apply_look(image: ByteImage, look: Look, seed: int) -> ByteImage:
    """`image` (BGR uint8) as the camera of `look` shows it; `seed` draws the frame's noise."""
    frame = image.astype(np.float32)
    if look.saturation != 1.0:
        grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY).astype(np.float32)[:, :, None]
        frame = grey + (frame - grey) * look.saturation
    if look.grey:
        frame = np.repeat(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None], 3, axis=2)
        frame = frame.astype(np.float32)
    frame = frame * look.gain + look.offset
    if look.noise_sigma > 0:
        noise = np.random.default_rng(seed).normal(0.0, look.noise_sigma, frame.shape[:2])
        frame = frame + noise[:, :, None].astype(np.float32)
    result: ByteImage = np.clip(frame + 0.5, 0, 255).astype(np.uint8)
    return result
