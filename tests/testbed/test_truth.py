"""The hand-verified truth (`bench/data/truth/`) and the scorer against it
(`bench.models.truth`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.models import real_footage, truth
from bench.models.truth import (
    ClipTruth,
    TruthBox,
    TruthError,
    load_truth,
    parse_truth,
    score_frames,
)
from detection.detections import Detections

NAMES = ["person", "bicycle", "car", "motorcycle", "bus", "truck", "dog"]


def _doc(boxes: list[Any], **extra: Any) -> dict[str, Any]:
    return {"clip": "t", "frame_size": [100, 80], "frames": {"0": boxes}, **extra}


def _det(rows: Sequence[tuple[float, float, float, float, float, int]]) -> Detections:
    a = np.asarray(rows, dtype=np.float64).reshape(-1, 6)
    return Detections(a[:, :4].astype(np.float32), a[:, 4].astype(np.float32), a[:, 5].astype(int))


def _clip(*boxes: TruthBox) -> ClipTruth:
    return ClipTruth("t", 100, 80, {0: tuple(boxes)})


def test_the_committed_truth_files_load_and_hold_enough_boxes() -> None:
    files = sorted(truth.TRUTH_DIR.glob("*.json"))
    assert files, "no truth files"
    total = 0
    for path in files:
        clip = load_truth(path)
        assert clip.clip == path.stem and clip.frames
        total += clip.boxes()
        for boxes in clip.frames.values():
            for box in boxes:
                # `small` follows the documented rule: height < SMALL_HEIGHT_PX
                height = box.xyxy[3] - box.xyxy[1]
                if box.label != truth.IGNORE:
                    assert box.small == (height < truth.SMALL_HEIGHT_PX), (path, box)
    assert total >= 600


def test_a_perfect_detector_scores_one_and_flags_are_reported() -> None:
    clip = _clip(
        TruthBox((10, 10, 20, 40), "person", small=True, far=True),
        TruthBox((40, 10, 60, 70), "person", occluded=True),
        TruthBox((60, 50, 95, 75), "car"),
    )
    rows = [(10, 10, 20, 40, 0.9, 0), (40, 10, 60, 70, 0.8, 0), (60, 50, 95, 75, 0.7, 5)]
    found = {0: _det(rows)}
    scores = score_frames(clip, found, NAMES)
    person, vehicles = scores["person"], scores["vehicles"]
    assert (person.recall, person.precision, person.f1, person.ap50) == (1.0, 1.0, 1.0, 1.0)
    # class-agnostic inside the vehicle group: a `truck` detection finds the `car`
    assert vehicles.true_positives == 1 and vehicles.ap50 == 1.0
    assert person.flag_recall("small") == 1.0 and person.flag_recall("occluded") == 1.0
    assert math.isnan(vehicles.flag_recall("small"))
    assert truth.mean_ap50(scores) == 1.0


def test_misses_duplicates_and_wrong_places_count() -> None:
    small = TruthBox((10, 10, 20, 40), "person", small=True)
    clip = _clip(small, TruthBox((40, 10, 60, 70), "person"))
    found = {0: _det([(40, 10, 60, 70, 0.9, 0), (41, 11, 60, 70, 0.8, 0), (80, 0, 90, 10, 0.7, 0)])}
    person = score_frames(clip, found, NAMES)["person"]
    assert (person.true_positives, person.false_positives, person.truth) == (1, 2, 2)
    assert person.recall == 0.5 and person.precision == pytest.approx(1 / 3)
    assert person.f1 == pytest.approx(2 / (3 + 2))
    assert person.flag_recall("small") == 0.0
    # one hit at the top of the ranking, then nothing: AP = recall 0.5 at precision 1
    assert person.ap50 == pytest.approx(51 / 101)


def test_detections_inside_an_ignore_region_are_neither_hits_nor_false_positives() -> None:
    clip = _clip(TruthBox((0, 0, 50, 50), "ignore"), TruthBox((60, 10, 80, 70), "person"))
    found = {
        0: _det(
            [
                (5, 5, 20, 40, 0.9, 0),  # inside the crowd blob
                (60, 10, 80, 70, 0.8, 0),
                (40, 40, 70, 79, 0.7, 2),  # a vehicle mostly outside it: a false positive
            ]
        )
    }
    scores = score_frames(clip, found, NAMES)
    assert scores["person"].ignored == 1 and scores["person"].precision == 1.0
    assert scores["vehicles"].false_positives == 1 and math.isnan(scores["vehicles"].recall)
    assert scores["vehicles"].f1 == 0.0 and math.isnan(scores["vehicles"].ap50)


def test_other_classes_and_frames_outside_the_truth_are_not_scored() -> None:
    clip = _clip(TruthBox((10, 10, 20, 40), "person"))
    found = {0: _det([(60, 10, 80, 70, 0.9, 6)]), 5: _det([(0, 0, 9, 9, 0.9, 0)])}
    person = score_frames(clip, found, NAMES)["person"]
    assert person.false_positives == 0 and person.recall == 0.0 and person.ap50 == 0.0


def test_tallies_add_up_over_clips() -> None:
    clip = _clip(TruthBox((10, 10, 20, 40), "person"))
    hit = score_frames(clip, {0: _det([(10, 10, 20, 40, 0.9, 0)])}, NAMES)["person"]
    miss = score_frames(clip, {0: _det([])}, NAMES)["person"]
    both = hit + miss
    assert both.truth == 2 and both.recall == 0.5 and both.flagged["small"] == [0, 0]


def test_a_truth_frame_without_detections_is_refused_by_name() -> None:
    with pytest.raises(TruthError, match=r"no detections for the truth's frames \[0\]"):
        score_frames(_clip(), {}, NAMES)


def test_a_truth_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    box = {"xyxy": [1, 2, 30, 40], "class": "car", "occluded": True, "source": "added"}
    path.write_text(json.dumps(_doc([box])))
    clip = load_truth(path)
    assert clip.path == path and clip.width == 100
    (only,) = clip.frames[0]
    assert only == TruthBox((1.0, 2.0, 30.0, 40.0), "car", occluded=True, source="added")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "must be a JSON object"),
        ({"frame_size": [1, 1], "frames": {"0": []}}, "`clip` must be"),
        ({"clip": "t", "frame_size": [0, 1], "frames": {"0": []}}, "`frame_size` must be"),
        ({"clip": "t", "frame_size": [9, 9], "frames": {}}, "`frames` must be a non-empty"),
        ({"clip": "t", "frame_size": [9, 9], "frames": {"x": []}}, "frame key 'x'"),
        ({"clip": "t", "frame_size": [9, 9], "frames": {"0": {}}}, "frame 0: must be a list"),
        (_doc(["box"]), "frame 0, box 0: a box must be an object"),
        (_doc([{"xyxy": [1, 2, 3], "class": "car"}]), "xyxy must be 4 numbers"),
        (_doc([{"xyxy": [5, 2, 3, 9], "class": "car"}]), "x2 > x1"),
        (_doc([{"xyxy": [1, 2, 300, 9], "class": "car"}]), "outside the 100x80 frame"),
        (_doc([{"xyxy": [1, 2, 3, 9], "class": "dog"}]), "class must be one of"),
        (_doc([{"xyxy": [1, 2, 3, 9], "class": "car", "small": "yes"}]), "small must be true"),
        (_doc([{"xyxy": [1, 2, 3, 9], "class": "car", "source": "ai"}]), "source must be one"),
        (_doc([{"xyxy": [1, 2, 3, 9], "class": "car", "colour": 1}]), "unknown keys"),
    ],
)
def test_malformed_truth_is_refused_with_where_and_why(document: Any, message: str) -> None:
    with pytest.raises(TruthError, match=message):
        parse_truth(document, "t.json")


def test_unreadable_truth_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TruthError, match="cannot read the truth file"):
        load_truth(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TruthError, match="not valid JSON"):
        load_truth(bad)
    assert truth.clip_truth("missing", tmp_path) is None


def test_real_footage_scores_the_truth_frames_it_read_and_refuses_a_wrong_frame_size(
    tmp_path: Path,
) -> None:
    frames = [np.zeros((576, 768, 3), np.uint8)] * 2
    clip = real_footage.Clip("vtest", "two frames", frames, indices=[0, 5])
    (scored,) = real_footage.clip_truths([clip], truth.TRUTH_DIR).values()
    assert list(scored.frames) == [0]  # frame 5 is not a truth frame; 10 was not read
    wrong = real_footage.Clip("vtest", "small", [np.zeros((10, 10, 3), np.uint8)])
    with pytest.raises(SystemExit, match="frame_size 768x576 is not the clip's 10x10"):
        real_footage.clip_truths([wrong], truth.TRUTH_DIR)
    assert real_footage.clip_truths([clip], tmp_path) == {}  # no truth file: not scored
