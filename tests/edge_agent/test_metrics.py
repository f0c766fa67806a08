"""Edge agent metrics: names, labels and values, served over a real loopback HTTP endpoint."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import get_args

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from configkit.common import MetricsConfig
from edge_agent.config import EdgeAgentConfig
from edge_agent.escalation.policy import Mode
from edge_agent.metrics import (
    CAMERA_STATES,
    ESCALATION_MODES,
    EdgeMetrics,
    MetricsExporter,
    start_edge_metrics_exporter,
)
from edge_agent.pipeline import EdgeAgent

REPO_ROOT = Path(__file__).resolve().parents[2]

FAMILIES = {
    "edge_agent_frames": "counter",
    "edge_agent_frames_dropped": "counter",
    "edge_agent_motion_skipped_frames": "counter",
    "edge_agent_camera_fps": "gauge",
    "edge_agent_camera_target_fps": "gauge",
    "edge_agent_camera_state": "gauge",
    "edge_agent_reconnects": "counter",
    "edge_agent_detect_latency_seconds": "histogram",
    "edge_agent_detect_batch_size": "histogram",
    "edge_agent_track_latency_seconds": "histogram",
    "edge_agent_rules_latency_seconds": "histogram",
    "edge_agent_end_to_end_latency_seconds": "histogram",
    "edge_agent_alert_latency_seconds": "histogram",
    "edge_agent_embedded_boxes": "counter",
    "edge_agent_events": "counter",
    "edge_agent_outbox_depth": "gauge",
    "edge_agent_outbox_dropped": "counter",
    "edge_agent_mqtt_connected": "gauge",
    "edge_agent_escalations": "counter",
    "edge_agent_escalation_bytes": "counter",
    "edge_agent_escalation_reasons": "counter",
    "edge_agent_escalation_round_trip_seconds": "histogram",
    "edge_agent_cloud_connected": "gauge",
    "edge_agent_escalation_enabled": "gauge",
    "edge_agent_fusion_changes": "counter",
    "edge_agent_cloud_agreement": "gauge",
}


@pytest.fixture
def served() -> Iterator[tuple[EdgeMetrics, MetricsExporter]]:
    metrics = EdgeMetrics()
    exporter = start_edge_metrics_exporter(
        metrics, MetricsConfig(listen_host="127.0.0.1", listen_port=0)
    )
    assert exporter is not None
    yield metrics, exporter
    exporter.close()


def _scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (fixed http URL)
        assert response.status == 200
        body: bytes = response.read()
    return body.decode()


def test_endpoint_serves_every_family_with_its_labels_and_values(
    served: tuple[EdgeMetrics, MetricsExporter],
) -> None:
    metrics, exporter = served
    assert exporter.port > 0
    metrics.frames.labels(camera="cam-1").inc(3)
    metrics.set_frames_dropped_total("cam-1", 7)
    metrics.camera_fps.labels(camera="cam-1").set(12.5)
    metrics.camera_target_fps.labels(camera="cam-1").set(15)
    metrics.escalation_enabled.set(1)
    metrics.set_camera_state("cam-1", "streaming")
    metrics.detect_latency.labels(runtime="onnxruntime").observe(0.02)
    metrics.detect_batch_size.observe(2)
    metrics.end_to_end_latency.labels(camera="cam-1").observe(0.08)
    metrics.observe_event("cam-1", "door-enter", "zone_enter", "start")
    metrics.outbox_depth.set(4)
    metrics.mqtt_connected.set(1)
    metrics.observe_escalation("cam-1", "answered")
    metrics.observe_escalation_bytes("cam-1", "frame", 40_000)
    metrics.observe_escalation_reasons("cam-1", ("new_track", "refresh"), sent=True)
    metrics.observe_escalation_reasons("cam-1", ("new_track",), sent=False)
    metrics.observe_escalation_bytes("cam-1", "regions", 3_000)
    metrics.observe_escalation_bytes("cam-1", "regions", 2_000)
    metrics.set_fusion_total("cam-1", "rejected", 2)
    metrics.set_fusion_total("cam-1", "rejected", 5)
    metrics.cloud_agreement.labels(camera="cam-1").set(0.9)

    text = _scrape(exporter.port)

    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name, kind in FAMILIES.items():
        assert name in families, f"{name} missing from /metrics"
        assert families[name].type == kind, name
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families.values()
        for sample in family.samples
    }
    assert values[("edge_agent_frames_total", (("camera", "cam-1"),))] == 3
    assert values[("edge_agent_frames_dropped_total", (("camera", "cam-1"),))] == 7
    assert values[("edge_agent_camera_fps", (("camera", "cam-1"),))] == 12.5
    assert values[("edge_agent_camera_target_fps", (("camera", "cam-1"),))] == 15
    assert values[("edge_agent_escalation_enabled", ())] == 1
    assert values[("edge_agent_camera_state", (("camera", "cam-1"), ("state", "streaming")))] == 1
    assert values[("edge_agent_camera_state", (("camera", "cam-1"), ("state", "stalled")))] == 0
    assert values[("edge_agent_detect_latency_seconds_count", (("runtime", "onnxruntime"),))] == 1
    assert values[("edge_agent_detect_latency_seconds_sum", (("runtime", "onnxruntime"),))] == 0.02
    assert values[("edge_agent_detect_batch_size_bucket", (("le", "2.0"),))] == 1
    event = {"camera": "cam-1", "rule": "door-enter", "kind": "zone_enter", "phase": "start"}
    assert values[("edge_agent_events_total", tuple(sorted(event.items())))] == 1
    assert values[("edge_agent_outbox_depth", ())] == 4
    assert values[("edge_agent_mqtt_connected", ())] == 1
    outcome = (("camera", "cam-1"), ("outcome", "answered"))
    assert values[("edge_agent_escalations_total", outcome)] == 1
    frames = (("camera", "cam-1"), ("mode", "frame"))
    crops = (("camera", "cam-1"), ("mode", "regions"))
    assert values[("edge_agent_escalation_bytes_total", frames)] == 40_000
    assert values[("edge_agent_escalation_bytes_total", crops)] == 5_000
    reasons = "edge_agent_escalation_reasons_total"
    for reason, outcome, expected in [
        ("new_track", "sent", 1),
        ("refresh", "sent", 1),
        ("new_track", "dropped_budget", 1),
    ]:
        labels = (("camera", "cam-1"), ("outcome", outcome), ("reason", reason))
        assert values[(reasons, labels)] == expected
    change = (("camera", "cam-1"), ("change", "rejected"))
    assert values[("edge_agent_fusion_changes_total", change)] == 5
    assert values[("edge_agent_cloud_agreement", (("camera", "cam-1"),))] == 0.9


def test_disabled_metrics_start_no_endpoint() -> None:
    assert start_edge_metrics_exporter(EdgeMetrics(), MetricsConfig(enabled=False)) is None


def test_each_instance_has_its_own_registry() -> None:
    first, second = EdgeMetrics(), EdgeMetrics()
    first.frames.labels(camera="cam-1").inc()
    assert first.registry.get_sample_value("edge_agent_frames_total", {"camera": "cam-1"}) == 1
    assert second.registry.get_sample_value("edge_agent_frames_total", {"camera": "cam-1"}) is None


@pytest.mark.parametrize(
    ("totals", "expected"),
    [
        ([0], 0),
        ([5], 5),
        ([5, 5, 9], 9),
        ([5, 9, 2], 11),  # the keeper restarted: 9, then 2 more from zero
        ([3, 0, 4], 7),
    ],
)
def test_running_totals_become_counter_increments(totals: list[int], expected: int) -> None:
    metrics = EdgeMetrics()
    for total in totals:
        metrics.set_frames_dropped_total("cam-1", total)
        metrics.set_reconnects_total("cam-1", total)
        metrics.set_outbox_dropped_total(total)
    registry = metrics.registry
    camera = {"camera": "cam-1"}
    assert registry.get_sample_value("edge_agent_frames_dropped_total", camera) == expected
    assert registry.get_sample_value("edge_agent_reconnects_total", camera) == expected
    assert registry.get_sample_value("edge_agent_outbox_dropped_total") == expected


def test_running_totals_are_per_camera() -> None:
    metrics = EdgeMetrics()
    metrics.set_frames_dropped_total("cam-1", 4)
    metrics.set_frames_dropped_total("cam-2", 1)
    metrics.set_frames_dropped_total("cam-1", 6)
    registry = metrics.registry
    assert registry.get_sample_value("edge_agent_frames_dropped_total", {"camera": "cam-1"}) == 6
    assert registry.get_sample_value("edge_agent_frames_dropped_total", {"camera": "cam-2"}) == 1


def test_a_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="negative, got -1"):
        EdgeMetrics().set_frames_dropped_total("cam-1", -1)


def test_camera_state_is_one_hot_across_changes() -> None:
    metrics = EdgeMetrics()
    metrics.set_camera_state("cam-1", "connecting")
    metrics.set_camera_state("cam-1", "stalled")
    assert metrics.camera_state_of("cam-1") == "stalled"
    for state in CAMERA_STATES:
        value = metrics.registry.get_sample_value(
            "edge_agent_camera_state", {"camera": "cam-1", "state": state}
        )
        assert value == (1 if state == "stalled" else 0), state


def test_capture_states_are_the_metric_states() -> None:
    from edge_agent.capture import CaptureState

    assert tuple(state.value for state in CaptureState) == CAMERA_STATES


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.set_camera_state("cam-1", "on-fire"), "unknown camera state 'on-fire'"),
        (lambda m: m.observe_escalation("cam-1", "lost"), "unknown escalation outcome 'lost'"),
        (lambda m: m.set_fusion_total("cam-1", "moved", 1), "unknown fusion change 'moved'"),
        (
            lambda m: m.observe_escalation_reasons("cam-1", ("boredom",), sent=True),
            "unknown escalation reason 'boredom'",
        ),
    ],
)
def test_unknown_label_values_are_refused(
    call: Callable[[EdgeMetrics], None], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(EdgeMetrics())


@pytest.mark.parametrize("escalation", [False, True])
def test_the_agent_exports_each_cameras_target_fps_and_whether_it_escalates(
    escalation: bool, tmp_path: Path
) -> None:
    # the alert rules need both: "fps below target" and "cloud unreachable" (which would fire
    # on every agent without escalation, whose `cloud_connected` is 0 by design)
    document = yaml.safe_load((REPO_ROOT / "configs" / "edge-agent.minimal.yaml").read_text())
    document["detector"]["runtime"]["model_path"] = str(
        REPO_ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"
    )
    document["cameras"][0]["target_fps"] = 7.5
    document["mqtt"] = {"outbox_path": str(tmp_path / "outbox.sqlite")}
    document["escalation"] = {"enabled": escalation, "cloud_address": "127.0.0.1:9"}
    metrics = EdgeMetrics()
    agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document), metrics=metrics)
    try:
        if agent.escalation is not None:
            agent.escalation.start()
        assert agent.telemetry is not None
        agent.telemetry.refresh(agent.workers, agent.status, agent.publisher)
    finally:
        agent.close(flush_timeout_s=0.1)
    registry = metrics.registry
    camera = {"camera": document["cameras"][0]["name"]}
    assert registry.get_sample_value("edge_agent_camera_target_fps", camera) == 7.5
    assert registry.get_sample_value("edge_agent_escalation_enabled") == (1 if escalation else 0)


def test_an_unknown_escalation_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown escalation mode 'crop'"):
        EdgeMetrics().observe_escalation_bytes("cam-1", "crop", 10)


def test_escalation_modes_are_the_policys() -> None:
    assert get_args(Mode) == ESCALATION_MODES
