"""Deadline mismatch: answers that expire in the cloud's queue are reported, not silent.

The watch's logic on a fake clock; then the shipped edge example's escalation settings against
the shipped CPU cloud config (`cloud-service serve`, the real FP32 model) on loopback: its
deadline gets answers, and a deadline shorter than the cloud's inference is reported (log line
with what to change, the status document, the metric).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest
import yaml

from edge_agent.capture import CapturedFrame
from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation import EscalationClient, EscalationDecision
from edge_agent.escalation.deadline import MIN_OUTCOMES, WINDOW_S, DeadlineWatch
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline.escalation import EscalationStage
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.processes import free_tcp_port

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
WAIT_S = 120.0  # a loaded 2-core box runs the FP32 model at a few frames a second at best


def test_most_frames_expiring_is_a_mismatch_said_once() -> None:
    watch = DeadlineWatch(500)
    onsets = [watch.observe(float(i), expired=True) for i in range(MIN_OUTCOMES)]
    assert onsets == [False] * (MIN_OUTCOMES - 1) + [True]  # judged only with enough outcomes
    assert not watch.observe(9.0, expired=True)  # said once, not on every expiry
    verdict = watch.verdict(9.0)
    assert verdict.mismatch and verdict.expired_share == 1.0
    assert verdict.suggested_deadline_ms == 2000  # nothing answered: 4x the deadline
    advice = watch.advice(9.0)
    assert "escalation.deadline_ms" in advice and "2000 ms" in advice
    assert "no frame was answered in time" in advice


def test_the_advice_follows_the_measured_round_trip_and_the_mismatch_clears() -> None:
    watch = DeadlineWatch(500)
    for i in range(6):
        watch.observe(float(i), expired=True)
    for i in range(4):
        watch.observe(6.0 + i, expired=False, rtt_s=1.3)  # answered, once a deadline was longer
    verdict = watch.verdict(10.0)
    assert verdict.mismatch and verdict.rtt_p90_ms == pytest.approx(1300.0)
    assert verdict.suggested_deadline_ms == 2600  # twice the round trip
    for i in range(40):  # a longer deadline (or a lighter cloud): answers come back
        watch.observe(11.0 + i * 0.1, expired=False, rtt_s=0.3)
    assert not watch.verdict(15.0).mismatch
    assert watch.onsets == 1


def test_old_outcomes_are_forgotten_and_a_few_expiries_are_no_mismatch() -> None:
    watch = DeadlineWatch(500)
    for i in range(MIN_OUTCOMES):
        watch.observe(float(i), expired=True)
    assert watch.verdict(float(MIN_OUTCOMES) + WINDOW_S + 1.0).outcomes == 0
    assert not watch.verdict(float(MIN_OUTCOMES) + WINDOW_S + 1.0).mismatch
    calm = DeadlineWatch(500)
    for i in range(20):
        calm.observe(float(i), expired=i % 5 == 0, rtt_s=None if i % 5 == 0 else 0.2)
    assert not calm.verdict(20.0).mismatch  # 20 % expired: a burst, not a mismatch
    with pytest.raises(ValueError, match="deadline_ms"):
        DeadlineWatch(0)


# -- the shipped configs, a real cloud service on loopback ---------------------------------------


@pytest.fixture(scope="module")
def cpu_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    document: dict[str, Any] = yaml.safe_load((CONFIGS / "cloud-service.cpu.yaml").read_text())
    document["server"]["listen_address"] = f"127.0.0.1:{free_tcp_port()}"
    document.setdefault("metrics", {})["listen_port"] = free_tcp_port()
    document["metrics"]["listen_host"] = "127.0.0.1"
    cloud = CloudProcess(document, tmp_path_factory.mktemp("cloud"))
    cloud.start()
    yield cloud
    cloud.stop()


def _shipped_escalation(address: str, **changes: object) -> EscalationConfig:
    """The shipped edge example's `escalation:` section, pointed at the local cloud."""
    document = yaml.safe_load((CONFIGS / "edge-agent.example.yaml").read_text())["escalation"]
    document.update({"cloud_address": address, "tls": False, **changes})
    for key in ("tls_ca_path", "auth_token"):
        document.pop(key, None)
    return EscalationConfig.model_validate(document)


def _frame(index: int) -> npt.NDArray[np.uint8]:
    image = np.full((576, 768, 3), 90, dtype=np.uint8)
    cv2.rectangle(image, (100 + 5 * index, 200), (160 + 5 * index, 380), (40, 40, 200), -1)
    return image


def _escalate(stage: EscalationStage, frames: int, every_s: float) -> tuple[int, int]:
    """Send `frames` whole frames, one every `every_s`; (answered, expired) once all came back."""
    decision = EscalationDecision(send=True, score=1.0, reasons=("refresh",))
    answered = expired = 0
    sent = 0
    deadline = time.monotonic() + WAIT_S
    while answered + expired < sent or sent < frames:
        assert time.monotonic() < deadline, f"{answered} answered, {expired} expired of {sent}"
        if sent < frames:
            now = time.time()
            frame = CapturedFrame("cam", sent, now, time.monotonic(), _frame(sent))
            sent += int(stage.submit("cam", frame, decision))
        for result in stage.poll():
            answered += int(result.ok)
            expired += int(result.code.name == "DEADLINE_EXCEEDED")
        time.sleep(every_s)
    return answered, expired


def _stage(config: EscalationConfig, metrics: EdgeMetrics) -> EscalationStage:
    stage = EscalationStage(config, "agent-1", EscalationClient(config, "agent-1"), metrics=metrics)
    stage.start()
    assert stage.client.wait_connected(WAIT_S), stage.client.stats().last_error
    return stage


def test_the_shipped_edge_and_cpu_cloud_configs_get_their_answers(
    cpu_cloud: CloudProcess,
) -> None:
    metrics = EdgeMetrics()
    stage = _stage(_shipped_escalation(cpu_cloud.address), metrics)
    try:
        # the example's per-camera budget: 2 frames a second
        answered, expired = _escalate(stage, frames=12, every_s=0.5)
    finally:
        stage.close()
    assert answered >= 0.95 * 12, (answered, expired)
    assert stage.deadline_status()["mismatch"] is False
    assert metrics.registry.get_sample_value("edge_agent_escalation_deadline_mismatch") == 0


def test_a_deadline_shorter_than_the_cloud_is_reported_once(
    cpu_cloud: CloudProcess, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = EdgeMetrics()
    stage = _stage(_shipped_escalation(cpu_cloud.address, deadline_ms=20), metrics)
    caplog.set_level(logging.WARNING, logger="edge_agent.pipeline.escalation")
    try:
        started = time.monotonic()
        answered, expired = _escalate(stage, frames=12, every_s=0.2)
        took_s = time.monotonic() - started
    finally:
        stage.close()
    assert expired >= MIN_OUTCOMES, (answered, expired)
    assert took_s < 60.0  # reported within a minute of the first escalation
    lines = [r.getMessage() for r in caplog.records if "deadline mismatch" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "escalation.deadline_ms" in lines[0] and "20 ms" in lines[0]
    status = stage.deadline_status()
    assert status["mismatch"] is True and status["deadline_ms"] == 20
    suggested = status["suggested_deadline_ms"]
    assert isinstance(suggested, int) and suggested >= 80
    assert metrics.registry.get_sample_value("edge_agent_escalation_deadline_mismatch") == 1
