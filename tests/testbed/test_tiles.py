"""Tiling a YOLO dataset at native scale: label clipping and the dataset layout."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from testbed.tiles import tile_dataset, tile_labels


@pytest.mark.parametrize(
    ("box", "origin", "expected"),
    [
        # fully inside: moved to tile coordinates, normalised by the tile size
        ((1, 110, 20, 150, 60), (100, 0), ["1 0.093750 0.125000 0.125000 0.125000"]),
        # cut by the tile's left edge: only the visible part is kept
        ((0, 90, 0, 130, 40), (100, 0), ["0 0.046875 0.062500 0.093750 0.125000"]),
        # outside: dropped
        ((2, 0, 0, 50, 50), (100, 0), []),
        # a 1 px sliver inside the tile: dropped
        ((3, 99, 0, 101, 40), (100, 0), []),
    ],
)
def test_tile_labels(
    box: tuple[int, int, int, int, int], origin: tuple[int, int], expected: list[str]
) -> None:
    boxes = np.array([box], dtype=np.float64)
    assert tile_labels(boxes, *origin, tile_px=320) == expected


def _write_dataset(root: Path) -> Path:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        image = np.zeros((360, 640, 3), np.uint8)
        image[100:140, 300:340] = 255
        cv2.imwrite(str(root / "images" / split / "a.jpg"), image)
        # the white square, as a YOLO label of the 640x360 frame
        (root / "labels" / split / "a.txt").write_text("2 0.5 0.333333 0.0625 0.111111\n")
    data = {"path": str(root), "train": "images/train", "val": "images/val", "names": {2: "x"}}
    (root / "data.yaml").write_text(yaml.safe_dump(data))
    return root / "data.yaml"


def test_tiles_keep_native_scale_and_val_stays_whole(tmp_path: Path) -> None:
    src = _write_dataset(tmp_path / "src")
    out_yaml = tile_dataset(src, tmp_path / "tiles", tile_px=320, tiles_per_image=4, seed=0)
    out = yaml.safe_load(out_yaml.read_text())
    assert out["path"] == str((tmp_path / "tiles").resolve()) and "test" not in out
    tiles = sorted((tmp_path / "tiles" / "images" / "train").glob("*.jpg"))
    assert len(tiles) == 4
    for tile_path in tiles:
        tile = cv2.imread(str(tile_path))
        assert tile.shape == (320, 320, 3)
        label = tmp_path / "tiles" / "labels" / "train" / f"{tile_path.stem}.txt"
        for line in label.read_text().splitlines():
            cls, cx, cy, w, h = (float(v) for v in line.split())
            assert cls == 2
            x1, y1 = int((cx - w / 2) * 320), int((cy - h / 2) * 320)
            x2, y2 = int((cx + w / 2) * 320), int((cy + h / 2) * 320)
            # the label sits on the white pixels of the tile (native scale: no resizing)
            assert tile[y1 + 1 : y2 - 1, x1 + 1 : x2 - 1].mean() > 200
    assert (tmp_path / "tiles" / "images" / "val" / "a.jpg").is_file()
