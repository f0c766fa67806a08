"""Focus crops packed into mosaics: each crop's boxes come back in its own pixels."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from detection.detections import Detections
from detection.letterbox import PAD_VALUE
from edge_agent.pipeline.mosaic import detect_packed, pack, packing, runs_for, unpack

Image = npt.NDArray[np.uint8]


class BlobDetector:
    """Boxes every white blob of its images (connected components): a detector whose answer
    is known from the picture."""

    input_shape = (320, 416)

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int]]] = []

    def detect(self, images: Sequence[Image]) -> list[Detections]:
        self.calls.append([(int(i.shape[0]), int(i.shape[1])) for i in images])
        out = []
        for image in images:
            white = np.all(image == 255, axis=2).astype(np.uint8)
            n, _, stats, _ = cv2.connectedComponentsWithStats(white)
            boxes = [(x, y, x + w, y + h) for x, y, w, h, _ in stats[1:n]]
            xyxy = np.array(boxes, dtype=np.float32).reshape(-1, 4)
            out.append(Detections(xyxy, np.full(len(boxes), 0.9), np.zeros(len(boxes))))
        return out


def _crop(height: int, width: int, box: tuple[int, int, int, int]) -> Image:
    crop = np.zeros((height, width, 3), np.uint8)
    x1, y1, x2, y2 = box
    crop[y1:y2, x1:x2] = 255
    return crop


def test_each_crops_boxes_come_back_in_its_own_pixels() -> None:
    boxes = [(40, 40, 80, 120), (10, 100, 30, 140), (100, 20, 180, 60), (0, 0, 20, 20)]
    sizes = [(160, 160), (200, 200), (240, 320), (160, 160)]
    crops = [_crop(h, w, b) for (h, w), b in zip(sizes, boxes, strict=True)]
    detector = BlobDetector()
    found = detect_packed(detector, crops, 2)
    assert detector.calls == [[(320, 416)]]  # four crops, one detector run at its input
    for box, result in zip(boxes, found, strict=True):
        assert len(result) == 1
        # back at the crop's scale, within the resize's rounding
        assert result.xyxy[0] == pytest.approx(np.array(box, np.float32), abs=2.5)


def test_a_crop_alone_in_its_run_goes_as_it_is_and_one_a_side_is_each_crop_alone() -> None:
    crops = [_crop(100, 100, (10, 10, 30, 30)) for _ in range(5)]
    detector = BlobDetector()
    found = detect_packed(detector, crops, 2)
    for result in found:  # in crop pixels, within the resize's rounding
        assert len(result) == 1
        assert result.xyxy[0] == pytest.approx(np.array([10.0, 10.0, 30.0, 30.0]), abs=1.0)
    # four in a mosaic; the fifth alone, for the detector to scale up to its whole input
    assert detector.calls == [[(320, 416), (100, 100)]]
    detector.calls.clear()
    assert [len(r) for r in detect_packed(detector, crops, 1)] == [1] * 5
    assert detector.calls == [[(100, 100)] * 5]  # each crop as it is
    assert [runs_for(n, 2) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert [runs_for(n, 1) for n in (0, 3)] == [0, 3]


def test_a_box_belongs_to_the_crop_its_centre_is_on_clipped_to_it() -> None:
    crops = [_crop(160, 160, (0, 0, 1, 1)), _crop(160, 160, (0, 0, 1, 1))]
    mosaics, cells = pack(crops, (320, 416), 2)
    assert len(mosaics) == 1 and [(c.x0, c.y0) for c in cells] == [(0, 0), (208, 0)]
    assert np.all(mosaics[0][200:, :] == PAD_VALUE)  # no crop in the lower half
    # a box centred on the first crop that spills past its edge (scale 1: 160 px crops)
    spill = Detections(np.array([[100.0, 10.0, 200.0, 50.0]]), np.array([0.8]), np.array([0]))
    first, second = unpack([spill], cells)
    assert first.xyxy.tolist() == [[100.0, 10.0, 160.0, 50.0]] and len(second) == 0


def test_a_mosaic_needs_room_for_its_cells() -> None:
    with pytest.raises(ValueError, match="per_side"):
        pack([], (320, 416), 0)
    with pytest.raises(ValueError, match="no room"):
        pack([], (3, 3), 4)


def test_crops_are_packed_only_as_much_as_the_runs_to_spare_need() -> None:
    assert packing(6, None, 2) == (1, 6)  # no limit known: each alone
    assert packing(6, 6, 2) == (1, 6)
    assert packing(6, 2, 2) == (2, 6)  # two runs of up to four
    assert packing(6, 1, 2) == (2, 4)
    assert packing(6, 1, 3) == (3, 6)
    assert packing(6, 0, 2) == (2, 0)
    assert packing(6, 1, 1) == (1, 1)  # never packed
    assert packing(0, 1, 2) == (1, 0)
