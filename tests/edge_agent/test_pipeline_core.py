"""`CameraPipeline`, the per-camera frame-loop core: frame choice, escalation decisions on an
injected clock, fusion of answers, retractions of cloud-rejected tracks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from detection.detections import Detections
from edge_agent.capture import CaptureState
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config import CameraConfig, EdgeAgentConfig, EscalationConfig
from edge_agent.config.tracker import TrackerConfig
from edge_agent.escalation import EscalationDecision, EscalationPolicy, FrameSignals, SignalSettings
from edge_agent.pipeline import CameraPipeline, EdgeAgent
from edge_agent.tracking import CameraTracker, NoEmbedder
from edge_agent.tracking.fusion import CloudTrust, FusionSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = np.zeros((200, 200, 3), np.uint8)


def _camera(**updates: object) -> CameraConfig:
    document: dict[str, object] = {
        "name": "cam",
        "url": "/x.mp4",
        "target_fps": 10.0,
        "motion": {"enabled": False},
        "zones": [{"name": "z", "units": "pixel",
                   "points": [[0, 0], [100, 0], [100, 100], [0, 100]]}],
        "rules": [{"name": "enter", "kind": "zone_enter", "zone": "z", "cooldown_s": 0.0}],
    }  # fmt: skip
    document.update(updates)
    return CameraConfig.model_validate(document)


def _tracker() -> CameraTracker:
    return CameraTracker.from_config(TrackerConfig(embedder="none", n_init=1), 0.3, NoEmbedder())


def _frame(index: int, fps: float = 10.0) -> CapturedFrame:
    return CapturedFrame("cam", index, 100.0 + index / fps, index / fps, IMAGE)


def _box(x: float, score: float = 0.5) -> Detections:
    return Detections(np.array([[x, 40.0, x + 40.0, 60.0]]), np.array([score]), np.array([0]))


class SendFrames:
    """An escalator sending exactly the frames listed (by the order they are decided on)."""

    def __init__(self, send: set[int]) -> None:
        self.signal_settings = SignalSettings.from_config(EscalationConfig())
        self.send = send
        self.decided = 0

    def decide(self, signals: FrameSignals, camera: str) -> EscalationDecision:
        send = self.decided in self.send
        self.decided += 1
        return EscalationDecision(send=send, score=1.0, reasons=("refresh",) if send else ())


def test_a_track_the_cloud_rejects_has_its_alert_retracted_with_the_next_frame() -> None:
    pipeline = CameraPipeline(
        _camera(),
        _tracker(),
        ["person"],
        fusion=FusionSettings(min_agreement=0.0),
        escalator=SendFrames({2}),
    )

    def step(index: int, x: float) -> list[str]:
        outcome = pipeline.process(_frame(index), _box(x))
        assert outcome.escalated == (index == 2)
        return [f"{e.kind}/{e.phase}" for e in outcome.events]

    assert step(0, 90.0) == [] and step(1, 85.0) == []  # anchored at x + 20: outside
    assert step(2, 75.0) == ["zone_enter/start"]
    assert pipeline.awaiting == 1
    assert pipeline.fuse(1, Detections.empty()) is None  # never sent: nothing to fuse
    result = pipeline.fuse(2, Detections.empty())
    assert result is not None and len(result.rejected) == 1
    assert pipeline.counters.fusion.rejected == 1 and pipeline.awaiting == 0
    assert step(3, 75.0) == ["zone_enter/retract"]  # and the track is no longer reported
    assert step(4, 75.0) == []


def test_finishing_a_camera_sends_the_retractions_still_pending() -> None:
    pipeline = CameraPipeline(
        _camera(), _tracker(), ["person"], fusion=FusionSettings(min_agreement=0.0),
        escalator=SendFrames({2}),
    )  # fmt: skip
    for index, x in enumerate((90.0, 85.0)):
        assert pipeline.process(_frame(index), _box(x)).events == []
    assert [e.phase for e in pipeline.process(_frame(2), _box(75.0)).events] == ["start"]
    result = pipeline.fuse(2, Detections.empty())
    assert result is not None and result.rejected
    assert [e.phase for e in pipeline.finish()] == ["retract"]


def test_the_policy_on_an_injected_clock_spends_the_budget_in_simulated_time() -> None:
    now = [0.0]
    config = EscalationConfig.model_validate(
        {"per_camera_frames_per_s": 1.0, "per_agent_frames_per_s": 1.0}
    )
    decider = EscalationPolicy.from_config(config, lambda: now[0])
    pipeline = CameraPipeline(_camera(zones=[], rules=[]), _tracker(), ["person"],
                              escalator=decider)  # fmt: skip
    sent = []
    for index in range(100):  # 10 s at 10 frames/s, a new object every frame: all hard
        now[0] = index / 10.0
        outcome = pipeline.process(_frame(index), _box(float(index)))
        if outcome.escalated:
            sent.append(index)
    # the budget (1 frame/s, its burst at the start) decides on the simulated clock
    assert 9 <= len(sent) <= 14
    assert pipeline.counters.escalated == len(sent) == pipeline.awaiting
    decider.observe_answer(rtt_s=0.1)  # an answer feeds the budget's back-off


def test_frames_are_chosen_at_the_target_rate_and_only_with_motion() -> None:
    pipeline = CameraPipeline(_camera(target_fps=5.0), _tracker(), ["person"])
    admitted = [pipeline.admit(_frame(i, fps=25.0)) for i in range(49)]  # 0 .. 1.92 s
    assert sum(admitted) == 10 and pipeline.counters.skipped_rate == 39
    gated = CameraPipeline(_camera(motion={"enabled": True}), _tracker(), ["person"])
    assert [gated.admit(_frame(i)) for i in range(3)].count(True) >= 1
    assert gated.counters.skipped_motion >= 1  # a still picture: nothing new to look at


def _agent_document(tmp_path: Path) -> dict[str, Any]:
    """The minimal agent config with the committed INT8 model and an outbox in `tmp_path`."""
    document = yaml.safe_load((REPO_ROOT / "configs" / "edge-agent.minimal.yaml").read_text())
    document["detector"]["runtime"]["model_path"] = str(
        REPO_ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"
    )
    document["mqtt"] = {"outbox_path": str(tmp_path / "outbox.sqlite")}
    return document


def test_the_agent_gives_its_cameras_focus_crops_only_with_escalation(tmp_path: Path) -> None:
    document = _agent_document(tmp_path)
    alone = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document))
    try:
        assert alone.escalation is None and alone.workers[0].focus is None
    finally:
        alone.close(flush_timeout_s=0.1)
    document["escalation"] = {"enabled": True, "cloud_address": "127.0.0.1:9"}
    config = EdgeAgentConfig.model_validate(document)
    hybrid = EdgeAgent.from_config(config)
    try:
        worker = hybrid.workers[0]
        assert worker.focus == config.escalation.focus and worker.escalator is hybrid.escalation
        fusion = worker.fusion  # the defaults
        assert fusion.relabel and fusion.box_correction_gain == 0.0 and fusion.vouch == 0
    finally:
        hybrid.close(flush_timeout_s=0.1)


def test_from_config_builds_what_production_runs_with_what_a_bench_injects(
    tmp_path: Path,
) -> None:
    document = _agent_document(tmp_path)
    document["escalation"] = {
        "enabled": True,
        "cloud_address": "127.0.0.1:9",
        "refresh_interval_s": 5.0,
    }
    document["media"] = {"enabled": True, "directory": str(tmp_path / "media")}
    scene_s = [100.0]
    embedder = NoEmbedder()
    agent = EdgeAgent.from_config(
        EdgeAgentConfig.model_validate(document),
        embedder=embedder,
        clock=lambda: scene_s[0],
        wall_clock=lambda: 1.7e9 + scene_s[0],
    )
    try:
        assert agent.media is not None and agent.escalation is not None  # as configured
        assert agent.workers[0].tracker.embedder is embedder
        policy = agent.escalation.policy
        easy = FrameSignals(640, 360)
        assert "refresh" not in policy.decide(easy, "cam").reasons  # its clock starts now
        scene_s[0] += 5.0  # the scene's clock, not the machine's, says a refresh is due
        assert "refresh" in policy.decide(easy, "cam").reasons
        agent.start(capture=False)  # broker, media and escalation, but no camera opened
        assert agent.workers[0].state is CaptureState.STOPPED
    finally:
        agent.close(flush_timeout_s=0.1)


def test_frames_the_loop_skipped_move_the_tracks_on_the_capture_clock() -> None:
    """A box moving 6 px per camera frame (20 wide), analysed at frames 0-4 and then 8: the
    gap of 0.4 s at 10 fps is 4 steps of the motion model, so the track keeps its object."""
    pipeline = CameraPipeline(_camera(zones=[], rules=[]), _tracker(), ["person"])
    ids = []
    for index in (0, 1, 2, 3, 4, 8):
        frame = _frame(index)
        assert pipeline.admit(frame)
        box = Detections(
            np.array([[6.0 * index, 40, 6.0 * index + 20, 60]]), np.array([0.9]), np.array([0])
        )
        ids.append(int(pipeline.process(frame, box).detections.tracker_id[0]))
    assert len(set(ids)) == 1 and ids[0] > 0


def test_a_track_confirmed_inside_a_zone_entered_it() -> None:
    """Tracks confirm on their second detection (n_init 2): the first was outside the zone."""
    tracker = CameraTracker.from_config(TrackerConfig(embedder="none", n_init=2), 0.3, NoEmbedder())
    pipeline = CameraPipeline(_camera(), tracker, ["person"])
    events = []
    for index, x in enumerate((96.0, 76.0, 74.0)):  # bottom-centres 116, 96, 94: z ends at 100
        frame = _frame(index)
        assert pipeline.admit(frame)
        events += pipeline.process(frame, _box(x, 0.9)).events
    assert [(e.kind, e.timestamp_s) for e in events] == [("zone_enter", 100.1)]


def test_a_cloud_hint_is_looked_at_closer_until_it_expires() -> None:
    from edge_agent.config.escalation import FocusConfig

    pipeline = CameraPipeline(
        _camera(), _tracker(), ["person"], fusion=FusionSettings(new_track_min_score=1.0),
        escalator=SendFrames({0}), focus=FocusConfig(hint_ms=300, hint_min_score=0.3),
    )  # fmt: skip
    assert pipeline.focus_tiles(_frame(0)) == []
    pipeline.process(_frame(0), Detections.empty())
    far = Detections(np.array([[150.0, 150.0, 160.0, 170.0]]), np.array([0.4]), np.array([0]))
    result = pipeline.fuse(0, far)
    assert result is not None and len(result.unexplained) == 1
    planned = []
    for index in range(1, 6):
        planned.append(len(pipeline.focus_tiles(_frame(index))))
        pipeline.process(_frame(index), Detections.empty())
    assert planned == [1, 1, 1, 0, 0]  # 300 ms at 10 frames/s
    weak = Detections(np.array([[150.0, 150.0, 160.0, 170.0]]), np.array([0.25]), np.array([0]))
    pipeline.process(_frame(6), Detections.empty())
    pipeline.escalator = SendFrames({0})
    pipeline.process(_frame(7), Detections.empty())
    pipeline.fuse(7, weak)
    assert pipeline.focus_tiles(_frame(8)) == []  # below hint_min_score


def test_an_object_only_the_cloud_sees_is_followed_by_optical_flow() -> None:
    import cv2

    noise = np.random.default_rng(3).integers(0, 256, (40, 40), dtype=np.uint8)
    patch = cv2.GaussianBlur(noise, (5, 5), 1.5)

    def scene(index: int) -> CapturedFrame:  # a textured 40 px object driving right, 4 px/frame
        image = np.zeros((200, 240, 3), np.uint8)
        x = 40 + 4 * index
        image[80:120, x : x + 40] = patch[..., None]
        return CapturedFrame("cam", index, 100.0 + index / 10.0, index / 10.0, image)

    settings = FusionSettings(
        new_track_min_score=0.5, hold_frames=10, follow_flow=True, cloud_sighting=True
    )
    pipeline = CameraPipeline(
        _camera(), _tracker(), ["person"], fusion=settings, escalator=SendFrames({0})
    )
    pipeline.process(scene(0), Detections.empty())  # the edge sees nothing
    cloud = Detections(np.array([[40.0, 80.0, 80.0, 120.0]]), np.array([0.9]), np.array([0]))
    result = pipeline.fuse(0, cloud)
    assert result is not None and result.created == 1
    for index in range(1, 6):
        out = pipeline.process(scene(index), Detections.empty()).detections
        assert len(out) == 1 and out.tracker_id[0] >= 0  # reported on the cloud's word
        assert float(out.xyxy[0, 0]) == pytest.approx(40 + 4 * index, abs=0.5)


@pytest.mark.parametrize(("still_iou", "sends"), [(0.5, range(1, 2)), (None, range(15, 31))])
def test_a_still_object_only_the_cloud_sees_is_not_asked_about_again_and_again(
    still_iou: float | None, sends: range
) -> None:
    # The busy real demo clip: the cloud takes a sign post for a person, the edge never sees
    # it, and its held track made every third frame hard (a quarter of the escalations).
    import cv2

    noise = np.random.default_rng(3).integers(0, 256, (40, 40), dtype=np.uint8)
    image = np.zeros((200, 240, 3), np.uint8)
    image[80:120, 140:180] = cv2.GaussianBlur(noise, (5, 5), 1.5)[..., None]
    sign = Detections(np.array([[140.0, 80.0, 180.0, 120.0]]), np.array([0.6]), np.array([0]))
    now = [0.0]
    config = EscalationConfig.model_validate({
        "per_camera_frames_per_s": 10.0, "per_agent_frames_per_s": 10.0,
        "refresh_interval_s": 0.0,
        "signals": {"verification": {"cloud_only_still_iou": still_iou}},
    })  # fmt: skip
    policy = EscalationPolicy.from_config(config, lambda: now[0])
    pipeline = CameraPipeline(
        _camera(zones=[], rules=[]), _tracker(), ["person"],
        fusion=FusionSettings.from_config(config.fusion, 10.0), escalator=policy,
    )  # fmt: skip
    pipeline.cloud_trust = CloudTrust(checked=100, seen=100)  # it agreed on the edge's tracks
    pipeline.escalator = SendFrames({0})  # the refresh that finds it

    def frame(index: int) -> CapturedFrame:
        return CapturedFrame("cam", index, 100.0 + index / 10.0, index / 10.0, image)

    pipeline.process(frame(0), Detections.empty())  # the edge sees nothing
    assert (result := pipeline.fuse(0, sign)) is not None and result.created == 1
    pipeline.escalator = policy
    sent = 0
    for index in range(1, 61):  # 6 s at 10 frames/s, each answer fused at once
        now[0] = index / 10.0
        outcome = pipeline.process(frame(index), Detections.empty())
        if outcome.escalated:
            assert outcome.decision is not None and outcome.decision.reasons == ("held_track",)
            sent += 1
            pipeline.fuse(index, sign)
    # Once the cloud answered that it is still there, asking again asks the same; without
    # that, each answer holds it again and it is sent for as long as it is held.
    assert sent in sends


@pytest.mark.parametrize(
    ("mosaic", "rest", "run", "side", "crops"),
    [(1, 0.6, 0.3, 1, [1]), (2, 0.6, 0.3, 2, [4]), (2, 0.0, 0.1, 1, [6])],
    ids=["never-packed", "packed-to-fit", "room-for-each-alone"],
)
def test_the_agent_packs_the_focus_crops_only_to_fit_its_frame_period(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mosaic: int,
    rest: float,
    run: float,
    side: int,
    crops: list[int],
) -> None:
    import edge_agent.pipeline.agent as agent_module
    from detection.slicing import Tile

    document = _agent_document(tmp_path)
    document["escalation"] = {
        "enabled": True, "cloud_address": "127.0.0.1:9", "focus": {"mosaic": mosaic},
    }  # fmt: skip
    agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document))
    try:
        worker = agent.workers[0]
        period_s = 1.0 / worker.config.target_fps
        # the rest of a step takes `rest` of the period and a detector run on crops `run`:
        # room for one run (of six crops planned), or for ten
        step_s, run_s = rest * period_s, run * period_s
        agent.focus_budget.observe(step_s=step_s + run_s, focus_s=run_s, runs=1)
        tile = Tile(0, 0, 32, 32, False, False, True, True)
        monkeypatch.setattr(worker, "focus_tiles", lambda frame: [tile] * 6)
        ran: list[int] = []

        def detect_crops(detector: object, planned: list[object], per_side: int) -> dict[str, Any]:
            assert per_side == side
            ran.append(len(planned))
            return {}

        monkeypatch.setattr(agent_module, "detect_crops", detect_crops)
        agent._detect_focus([(worker, CapturedFrame("cam", 0, 0.0, 0.0, IMAGE))])
        assert ran == crops  # one run: one crop alone or four in a mosaic; or six runs
        assert agent.focus_budget.skipped == 6 - crops[0]
    finally:
        agent.close(flush_timeout_s=0.1)
