"""The generated protobuf code is fresh, and the v1 messages survive the wire."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from protos import generate
from protos.analytics.v1 import analytics_pb2 as pb


@pytest.mark.process
def test_generated_code_is_fresh() -> None:
    problems = generate.stale_files()

    assert problems == [], "run `python -m protos.generate`: " + ", ".join(problems)


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    shutil.copytree(generate.PROTOS_DIR, tmp_path / "protos")
    return tmp_path


@pytest.mark.process
def test_check_reports_stale_missing_and_orphaned_files(tree_copy: Path) -> None:
    v1 = tree_copy / "protos" / "analytics" / "v1"
    (v1 / "analytics_pb2.py").write_text("# edited by hand\n")
    (v1 / "analytics_pb2_grpc.pyi").unlink()
    (v1 / "old_pb2.py").write_text("")

    problems = generate.stale_files(tree_copy)

    assert problems == [
        "stale: protos/analytics/v1/analytics_pb2.py",
        "missing: protos/analytics/v1/analytics_pb2_grpc.pyi",
        "orphaned: protos/analytics/v1/old_pb2.py",
    ]


@pytest.mark.process
def test_write_generated_repairs_the_tree(tree_copy: Path) -> None:
    (tree_copy / "protos" / "analytics" / "v1" / "analytics_pb2.py").write_text("# stale\n")

    generate.write_generated(tree_copy)

    assert generate.stale_files(tree_copy) == []


@pytest.mark.process
def test_check_cli_exit_status(tree_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check", "--root", str(tree_copy)]) == 0
    (tree_copy / "protos" / "analytics" / "v1" / "analytics_pb2.py").write_text("# stale\n")

    assert generate.main(["--check", "--root", str(tree_copy)]) == 1
    assert "stale: protos/analytics/v1/analytics_pb2.py" in capsys.readouterr().out


def _full_request() -> pb.FrameRequest:
    request = pb.FrameRequest(
        agent_id="site-a-01",
        camera_id="gate",
        frame_id=2**64 - 1,
        request_id="3f0c",
        jpeg=b"\xff\xd8 not really \xff\xd9",
        original_width=1920,
        original_height=1080,
        jpeg_quality=80,
        regions=[pb.Region(x1=1.5, y1=2.5, x2=100.25, y2=200.75, jpeg=b"\xff\xd8crop")],
    )
    request.capture_time.FromNanoseconds(1_700_000_000_123_456_789)
    request.deadline.FromNanoseconds(1_700_000_000_623_456_789)
    return request


def _full_result() -> pb.FrameResult:
    result = pb.FrameResult(
        agent_id="site-a-01",
        camera_id="gate",
        frame_id=7,
        request_id="3f0c",
        status=pb.ResultStatus(code=4, message="deadline passed"),
        detections=[
            pb.Detection(x1=1, y1=2, x2=3, y2=4, score=0.5, class_id=2, class_name="car"),
            pb.Detection(x1=5, y1=6, x2=7, y2=8, score=0.25, class_id=0, region_index=0),
        ],
        model_name="yolov5x",
        model_version="sha256:abc",
        timings=pb.ServerTimings(
            queue_time_ms=1.5, decode_time_ms=2.5, inference_time_ms=10.25, total_time_ms=15.0
        ),
        queue_depth=12,
    )
    result.capture_time.FromSeconds(1_700_000_000)
    return result


@pytest.mark.parametrize("make", [_full_request, _full_result], ids=["request", "result"])
def test_messages_round_trip(make: type[pb.FrameRequest] | type[pb.FrameResult]) -> None:
    original = make()

    decoded = type(original).FromString(original.SerializeToString())

    assert decoded == original
    assert decoded.ListFields() == original.ListFields()


def test_region_index_zero_is_distinct_from_unset() -> None:
    result = pb.FrameResult.FromString(_full_result().SerializeToString())

    assert not result.detections[0].HasField("region_index")
    assert result.detections[1].HasField("region_index") and result.detections[1].region_index == 0


def test_unknown_fields_from_a_newer_peer_survive() -> None:
    # A v1.x sender adds field 16 (a string); an older reader must keep and forward it.
    newer = _full_request().SerializeToString() + b"\x82\x01\x05hello"

    relayed = pb.FrameRequest.FromString(newer).SerializeToString()

    assert relayed.endswith(b"\x82\x01\x05hello")


def test_contract_shape() -> None:
    service = pb.DESCRIPTOR.services_by_name["InferenceService"]
    stream = service.methods_by_name["StreamFrames"]
    unary = service.methods_by_name["DetectFrame"]
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)

    assert pb.DESCRIPTOR.package == "analytics.v1"
    assert service.full_name == "analytics.v1.InferenceService"
    assert (stream.client_streaming, stream.server_streaming) == (True, True)
    assert (unary.client_streaming, unary.server_streaming) == (False, False)
    for message in proto.message_type:
        assert message.reserved_range, f"{message.name} plans no reserved range"
