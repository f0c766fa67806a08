"""Pure conversions between `Detections`, statuses, timestamps and the analytics.v1 messages."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cloud_service.convert import (
    detections_from_proto,
    detections_to_proto,
    map_to_source,
    status_code_from_proto,
    status_to_proto,
)
from detection.detections import Detections
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.timestamps import timestamp_from_seconds, timestamp_to_seconds

NAMES = ("person", "car", "bike")


def _dets(rows: list[tuple[float, float, float, float, float, int]]) -> Detections:
    if not rows:
        return Detections.empty()
    array = np.array(rows, dtype=np.float64)
    return Detections(
        array[:, :4].astype(np.float32),
        array[:, 4].astype(np.float32),
        array[:, 5].astype(np.int64),
    )


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [(0.0, 0.0, 1.0, 1.0, 0.5, 0)],
        [(10.25, 20.5, 30.75, 40.0, 0.99, 2), (0.0, 0.0, 0.0, 0.0, 0.0, 1)],
        [(1e4, 2e4, 3e4, 4e4, 1.0, 9)],  # class id without a name
    ],
    ids=["empty", "one", "two", "unnamed-class"],
)
@pytest.mark.parametrize("region_index", [None, 0, 3])
def test_detections_round_trip(
    rows: list[tuple[float, float, float, float, float, int]], region_index: int | None
) -> None:
    original = _dets(rows)

    messages = detections_to_proto(original, NAMES, region_index)
    wire = [pb.Detection.FromString(m.SerializeToString()) for m in messages]
    back = detections_from_proto(wire)

    np.testing.assert_array_equal(back.xyxy, original.xyxy)
    np.testing.assert_array_equal(back.confidence, original.confidence)
    np.testing.assert_array_equal(back.class_id, original.class_id)
    assert list(back.tracker_id) == [-1] * len(rows)
    assert [m.class_name for m in wire] == [
        NAMES[int(c)] if c < len(NAMES) else "" for c in original.class_id
    ]
    for message in wire:
        assert message.HasField("region_index") is (region_index is not None)
        if region_index is not None:
            assert message.region_index == region_index


@pytest.mark.parametrize(
    ("code", "value"),
    [
        (grpc.StatusCode.OK, 0),
        (grpc.StatusCode.INVALID_ARGUMENT, 3),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 4),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 8),
        (grpc.StatusCode.INTERNAL, 13),
        (grpc.StatusCode.UNAVAILABLE, 14),
        (grpc.StatusCode.UNAUTHENTICATED, 16),
    ],
)
def test_status_round_trip(code: grpc.StatusCode, value: int) -> None:
    status = status_to_proto(code, "why")

    assert (status.code, status.message) == (value, "why")
    assert status_code_from_proto(pb.ResultStatus.FromString(status.SerializeToString())) == code


@pytest.mark.parametrize("value", [-1, 17, 1000])
def test_unknown_status_values_are_unknown(value: int) -> None:
    assert status_code_from_proto(pb.ResultStatus(code=value)) == grpc.StatusCode.UNKNOWN


@pytest.mark.parametrize(
    ("seconds", "expected_seconds", "expected_nanos"),
    [
        (0.0, 0, 0),
        (1_700_000_000.5, 1_700_000_000, 500_000_000),
        (1.000000001, 1, 1),
        (-1.25, -2, 750_000_000),
    ],
)
def test_timestamp_round_trip(seconds: float, expected_seconds: int, expected_nanos: int) -> None:
    stamp = timestamp_from_seconds(seconds)

    assert (stamp.seconds, stamp.nanos) == (expected_seconds, expected_nanos)
    assert timestamp_to_seconds(stamp) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    ("box", "kwargs", "expected"),
    [
        ((1, 2, 3, 4), {"scale_x": 2.0, "scale_y": 3.0}, (2, 6, 6, 12)),
        (
            (1, 2, 3, 4),
            {"scale_x": 1.0, "scale_y": 1.0, "offset_x": 10, "offset_y": 20},
            (11, 22, 13, 24),
        ),
        ((-5, -5, 50, 50), {"scale_x": 1.0, "scale_y": 1.0}, (0, 0, 40, 30)),
    ],
    ids=["scale", "offset", "clip"],
)
def test_map_to_source(
    box: tuple[float, float, float, float], kwargs: dict[str, float], expected: tuple[float, ...]
) -> None:
    detections = _dets([(*box, 0.5, 1)])

    mapped = map_to_source(detections, source_width=40, source_height=30, **kwargs)

    assert tuple(mapped.xyxy[0]) == expected
    assert mapped.class_id[0] == 1 and mapped.confidence[0] == np.float32(0.5)
