"""Edge agent config: the examples validate, cross-field mistakes are caught with their line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from configkit import ConfigError, SecretRef, load_config, parse_config
from edge_agent.config import EdgeAgentConfig, LineCrossRule, LoiterRule, ZoneOccupancyRule
from edge_agent.config.escalation import EscalationConfig
from edge_agent.config.rules import CountLineRule

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

BASE = """\
agent:
  id: box-1
cameras:
  - name: cam1
    url: rtsp://10.0.0.1/stream
    zones:
      - name: door
        points: [[0, 0], [1, 0], [1, 1]]
    lines:
      - name: gate
        points: [[0, 0.5], [1, 0.5]]
    rules:
      - name: r1
        kind: zone_enter
        zone: door
detector:
  runtime:
    type: litert
    model_path: models/edge/yolov5s-int8.tflite
"""


@pytest.mark.parametrize("name", ["edge-agent.example.yaml", "edge-agent.minimal.yaml"])
def test_examples_validate(name: str) -> None:
    config = load_config(CONFIGS / name, EdgeAgentConfig)
    assert config.cameras


def test_full_example_covers_every_rule_kind() -> None:
    config = load_config(CONFIGS / "edge-agent.example.yaml", EdgeAgentConfig)
    kinds = {rule.kind for camera in config.cameras for rule in camera.rules}
    assert kinds == {"zone_enter", "zone_exit", "zone_occupancy", "line_cross", "loiter"}
    assert len(config.cameras) == 3
    assert config.mqtt.password == SecretRef(env="MQTT_PASSWORD")
    assert config.escalation.auth_token == SecretRef(credential="cloud-token")
    rules = config.cameras[0].rules
    assert isinstance(rules[2], ZoneOccupancyRule) and rules[2].min_objects == 5
    assert isinstance(rules[3], LineCrossRule) and rules[3].direction == "both"
    assert isinstance(rules[4], LoiterRule) and rules[4].dwell_s == 90


def test_minimal_example_defaults() -> None:
    config = load_config(CONFIGS / "edge-agent.minimal.yaml", EdgeAgentConfig)
    assert config.escalation.enabled is False
    assert config.mqtt.qos == 1
    assert config.mqtt_client_id == "edge-agent-dev-box"
    assert config.tracker.embedder == "histogram"


def test_base_is_valid() -> None:
    assert parse_config(BASE, EdgeAgentConfig).cameras[0].rules[0].name == "r1"


def _with(extra: str, replace: tuple[str, str] | None = None) -> str:
    text = BASE if replace is None else BASE.replace(*replace)
    return text + extra


_ENTER_DOOR = "kind: zone_enter\n        zone: door"


def test_count_line_rule_counts_every_minute_by_default() -> None:
    text = _with("", (_ENTER_DOOR, "kind: count_line\n        line: gate"))
    (rule,) = parse_config(text, EdgeAgentConfig).cameras[0].rules
    assert isinstance(rule, CountLineRule)
    assert (rule.kind, rule.line, rule.interval_s) == ("count_line", "gate", 60.0)


def test_full_example_shows_a_count_line_rule_that_validates_uncommented() -> None:
    text = (CONFIGS / "edge-agent.example.yaml").read_text()
    uncommented, count = re.subn(
        r"^(\s*)# ((?:- name: vehicle-count|  (?:kind|line|classes|interval_s):).*)$",
        r"\1\2",
        text,
        flags=re.M,
    )
    assert count == 5
    rules = parse_config(uncommented, EdgeAgentConfig).cameras[1].rules
    assert [(rule.name, rule.kind) for rule in rules][-1] == ("vehicle-count", "count_line")


CASES = [
    pytest.param(
        _with("", ("zone: door", "zone: nowhere")),
        "t.yaml:15: cameras[0].rules[0].zone: rule 'r1' refers to zone 'nowhere', which is not "
        "defined on camera 'cam1' (zones defined: door)",
        id="rule-names-missing-zone",
    ),
    pytest.param(
        _with(
            "", ("kind: zone_enter\n        zone: door", "kind: line_cross\n        line: fence")
        ),
        "t.yaml:15: cameras[0].rules[0].line: rule 'r1' refers to line 'fence', which is not "
        "defined on camera 'cam1' (lines defined: gate)",
        id="rule-names-missing-line",
    ),
    pytest.param(
        _with("", ("detector:", "  - name: cam1\n    url: /videos/a.mp4\ndetector:")),
        "t.yaml:16: cameras[1].name: duplicate camera name 'cam1'",
        id="duplicate-camera-names",
    ),
    pytest.param(
        _with(
            "",
            (
                "    zones:",
                "    capture:\n      reconnect_min_backoff_ms: 5000\n"
                "      reconnect_max_backoff_ms: 1000\n    zones:",
            ),
        ),
        "t.yaml:7: cameras[0].capture.reconnect_min_backoff_ms: reconnect_min_backoff_ms (5000) "
        "must not exceed reconnect_max_backoff_ms (1000)",
        id="backoff-min-above-max",
    ),
    pytest.param(
        _with("escalation:\n  uncertain_confidence_low: 0.6\n  uncertain_confidence_high: 0.6\n"),
        "t.yaml:21: escalation.uncertain_confidence_low: uncertain_confidence_low (0.6) must be "
        "below uncertain_confidence_high (0.6)",
        id="band-low-not-below-high",
    ),
    pytest.param(
        _with("escalation:\n  enabled: true\n"),
        "t.yaml:21: escalation.enabled: escalation is enabled but `cloud_address` is not set",
        id="escalation-without-address",
    ),
    pytest.param(
        _with("escalation:\n  fusion:\n    min_agreement: 1.5\n"),
        "t.yaml:22: escalation.fusion.min_agreement: Input should be less than or equal to 1 "
        "(got 1.5)",
        id="fusion-agreement-above-one",
    ),
    pytest.param(
        _with("escalation:\n  fusion:\n    trust_min_checks: -1\n"),
        "t.yaml:22: escalation.fusion.trust_min_checks: Input should be greater than or equal "
        "to 0 (got -1)",
        id="fusion-negative-checks",
    ),
    pytest.param(
        _with("escalation:\n  per_camera_frames_per_s: 20\n  per_agent_frames_per_s: 10\n"),
        "t.yaml:21: escalation.per_camera_frames_per_s: per_camera_frames_per_s (20.0) exceeds "
        "per_agent_frames_per_s (10.0)",
        id="camera-budget-above-agent-budget",
    ),
    pytest.param(
        _with("", ("url: rtsp://10.0.0.1/stream", "url: rtsp://admin:pw@10.0.0.1/stream")),
        "t.yaml:5: cameras[0].url: put the password in `password` (a secret reference), not in "
        "the URL (got 'rtsp://admin:pw@10.0.0.1/stream')",
        id="password-in-url",
    ),
    pytest.param(
        _with("", ("url: rtsp://10.0.0.1/stream", "url: http://10.0.0.1/stream")),
        "t.yaml:5: cameras[0].url: URL scheme must be rtsp or rtsps (or give a file path) "
        "(got 'http://10.0.0.1/stream')",
        id="http-url",
    ),
    pytest.param(
        _with(
            "",
            ("url: rtsp://10.0.0.1/stream", "url: rtsp://10.0.0.1/s\n    file_replay: every_frame"),
        ),
        "t.yaml:6: cameras[0].file_replay: file_replay every_frame applies to video files only; "
        "a live stream cannot wait",
        id="every-frame-on-a-stream",
    ),
    pytest.param(
        _with("", ("points: [[0, 0], [1, 0], [1, 1]]", "points: [[0, 0], [1, 0]]")),
        "t.yaml:8: cameras[0].zones[0].points: List should have at least 3 items after "
        "validation, not 2",
        id="zone-two-points",
    ),
    pytest.param(
        _with("", ("points: [[0, 0], [1, 0], [1, 1]]", "points: [[0, 0], [2, 0], [1, 1]]")),
        "t.yaml:7: cameras[0].zones[0]: normalized point (2.0, 0.0) is outside [0, 1]",
        id="normalized-point-outside",
    ),
    pytest.param(
        _with(
            "  class_names: [person, car]\n", ("zone: door", "zone: door\n        classes: [dog]")
        ),
        "t.yaml:16: cameras[0].rules[0].classes[0]: rule 'r1' names class 'dog', which is not in "
        "detector.class_names",
        id="rule-class-not-in-detector",
    ),
    pytest.param(
        _with("", ("kind: zone_enter", "kind: zone_teleport")),
        "t.yaml:13: cameras[0].rules[0]: Input tag 'zone_teleport' found using 'kind' does not "
        "match any of the expected tags: 'zone_enter', 'zone_exit', 'zone_occupancy', "
        "'line_cross', 'loiter', 'count_line'",
        id="unknown-rule-kind",
    ),
    pytest.param(
        _with("", (_ENTER_DOOR, "kind: count_line\n        line: gate\n        interval_s: 0")),
        "t.yaml:16: cameras[0].rules[0].interval_s: Input should be greater than 0 (got 0)",
        id="count-line-empty-interval",
    ),
    pytest.param(
        _with("", (_ENTER_DOOR, "kind: count_line\n        line: nowhere")),
        "t.yaml:15: cameras[0].rules[0].line: rule 'r1' refers to line 'nowhere', which is not "
        "defined on camera 'cam1' (lines defined: gate)",
        id="count-line-dangling-line",
    ),
    pytest.param(
        _with("tracker:\n  low_score_threshold: 0.3\n"),
        "t.yaml:21: tracker.low_score_threshold: tracker.low_score_threshold (0.3) must be below "
        "detector.confidence_threshold (0.25)",
        id="second-pass-above-detector-threshold",
    ),
    pytest.param(
        _with("mqtt:\n  qos: 3\n"),
        "t.yaml:21: mqtt.qos: Input should be less than or equal to 2 (got 3)",
        id="mqtt-qos",
    ),
    pytest.param(
        _with("mqtt:\n  password: {env: MQTT_PASSWORD}\n"),
        "t.yaml:21: mqtt.password: a password needs a `username`",
        id="mqtt-password-without-user",
    ),
    pytest.param(
        _with("mqtt:\n  password: hunter2\n"),
        "t.yaml:21: mqtt.password: Input should be a valid dictionary or instance of SecretRef "
        "(got 'hunter2')",
        id="mqtt-password-in-clear",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_cross_field_errors(text: str, expected: str) -> None:
    yaml.safe_load(text)  # the case itself is valid YAML
    with pytest.raises(ConfigError) as raised:
        parse_config(text, EdgeAgentConfig, "t.yaml")
    assert str(raised.value) == expected


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        pytest.param(
            ("    zones:", "    target_fps: 0\n    zones:"),
            [
                "t.yaml:6: cameras[0].target_fps: Input should be greater than 0 (got 0)",
                "t.yaml:16: cameras[0].rules[0].zone: rule 'r1' refers to zone 'nowhere', which "
                "is not defined on camera 'cam1' (zones defined: door)",
            ],
            id="field-error-and-dangling-reference",
        ),
        pytest.param(
            ("    lines:", "      - name: door\n        points: [[0, 0], [1, 1], [0, 1]]\n"
             "    lines:"),
            [
                "t.yaml:9: cameras[0].zones[1].name: duplicate name 'door' on camera 'cam1'",
                "t.yaml:17: cameras[0].rules[0].zone: rule 'r1' refers to zone 'nowhere', which "
                "is not defined on camera 'cam1' (zones defined: door)",
            ],
            id="duplicate-name-and-dangling-reference",
        ),
    ],
)  # fmt: skip
def test_errors_of_every_stage_come_in_one_pass(
    replace: tuple[str, str], expected: list[str]
) -> None:
    text = _with("", replace).replace("zone: door", "zone: nowhere")
    with pytest.raises(ConfigError) as raised:
        parse_config(text, EdgeAgentConfig, "t.yaml")
    assert str(raised.value).splitlines() == expected


@pytest.mark.parametrize(
    "target",
    [
        "cloud.example.com:50051",
        "10.0.0.5:50051",
        "[::1]:50051",
        "dns:///cloud-service-headless.vision.svc.cluster.local:50051",
        "dns://10.96.0.10:53/cloud-service-headless:50051",
        "ipv4:10.0.0.5:50051,10.0.0.6:50051",
        "ipv6:[::1]:50051,[::2]:50051",
    ],
)
def test_cloud_address_takes_grpc_targets_with_several_replicas(target: str) -> None:

    config = EscalationConfig(enabled=True, cloud_address=target)
    assert config.cloud_address == target and config.load_balancing == "round_robin"


@pytest.mark.parametrize(
    "target",
    ["cloud:", "http://cloud:50051", "ipv4:cloud.example.com:50051", "dns:///cloud", "a b:1"],
)
def test_cloud_address_refuses_what_grpc_would_not_resolve(target: str) -> None:

    with pytest.raises(ValidationError, match="cloud_address"):
        EscalationConfig(enabled=True, cloud_address=target)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("fusion:\n    cloud_vote_weight: 0", "escalation.fusion.cloud_vote_weight: Input should "
         "be greater than or equal to 1 (got 0)"),
        ("fusion:\n    min_held_score: 1.5", "escalation.fusion.min_held_score: Input should be "
         "less than or equal to 1 (got 1.5)"),
        ("fusion:\n    follow_flow: maybe", "escalation.fusion.follow_flow: Input should be a "
         "valid boolean, unable to interpret input (got 'maybe')"),
        ("fusion:\n    reject_duplicate: true", "t.yaml:24: escalation.fusion.reject_duplicate: "
         "unknown key"),
        ("fusion:\n    followed_aging: -0.1", "escalation.fusion.followed_aging: Input should be "
         "greater than or equal to 0 (got -0.1)"),
        ("fusion:\n    held_score_scale: 2", "escalation.fusion.held_score_scale: Input should "
         "be less than or equal to 1 (got 2)"),
        ("fusion:\n    fit_gain: -0.5", "escalation.fusion.fit_gain: Input should be greater "
         "than or equal to 0 (got -0.5)"),
        ("fusion:\n    fit_ms: 1.5", "escalation.fusion.fit_ms: Input should be a valid "
         "integer, got a number with a fractional part (got 1.5)"),
        ("fusion:\n    hidden_coverage: 1.2", "escalation.fusion.hidden_coverage: Input should "
         "be less than or equal to 1 (got 1.2)"),
        ("regions:\n    crops_when_bytes_short: sometimes", "escalation.regions."
         "crops_when_bytes_short: Input should be a valid boolean, unable to interpret input "
         "(got 'sometimes')"),
        ("focus:\n    refine_max_px: -1", "escalation.focus.refine_max_px: Input should be "
         "greater than or equal to 0 (got -1)"),
        ("signals:\n    weights:\n      held_track: many", "escalation.signals.weights."
         "held_track: Input should be a valid number, unable to parse string as a number "
         "(got 'many')"),
        ("signals:\n    weights:\n      held_tracks: 1", "escalation.signals.weights."
         "held_tracks: unknown key"),
    ],
)  # fmt: skip
def test_bad_escalation_settings_are_refused_by_name(section: str, expected: str) -> None:
    text = _with(f"escalation:\n  enabled: true\n  cloud_address: c:1\n  {section}\n")
    with pytest.raises(ConfigError) as raised:
        parse_config(text, EdgeAgentConfig, "t.yaml")
    assert expected in str(raised.value)
