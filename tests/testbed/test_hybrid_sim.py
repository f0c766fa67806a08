"""The hybrid trade-off simulation (`bench.hybrid._hybrid_sim`) on 20 frames of an `events`
scene."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.hybrid._hybrid_sim import (
    MIN_SIDE_PX,
    MIN_VISIBILITY,
    CloudAnswers,
    EdgeCrops,
    Variant,
    oracle_answer,
    prepare_scene,
    score_run,
    simulate,
)
from edge_agent.config.escalation import EscalationConfig
from tests.fixtures.rtsp import MEDIA_CACHE_DIR

FRAMES = 20


@pytest.fixture(scope="module")
def scene_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-hybrid")


@pytest.mark.slow
def test_edge_cloud_and_hybrid_runs_are_scored(scene_cache: Path) -> None:
    data = prepare_scene(
        "events", 1, render_frames=FRAMES, cache_dir=scene_cache, media_dir=MEDIA_CACHE_DIR
    )
    assert data.n_frames == FRAMES and data.camera is not None
    # Every frame hard, whole frames only, as JPEG: the answers come from the cache (no crops
    # or video packets to run).
    escalation = EscalationConfig.model_validate(
        {
            "per_camera_frames_per_s": 5.0,
            "per_agent_frames_per_s": 5.0,
            "burst_s": 1.0,
            "refresh_interval_s": 0.01,
            "regions": {"enabled": False},
            "uplink": {"codec": "jpeg"},
        }
    )
    answers = CloudAnswers(data, cache_dir=scene_cache)
    crops = EdgeCrops(data, cache_dir=scene_cache)
    runs = {
        variant.mode: simulate(data, variant, answers, crops)
        for variant in (
            Variant("edge", "edge"),
            Variant("cloud", "cloud"),
            Variant("hybrid", "hybrid", escalation, rtt_frames=2),
        )
    }
    oracle = simulate(
        data, Variant("oracle", "hybrid", escalation, rtt_frames=2, oracle=True), crops=crops
    )
    assert oracle.sent_frames == runs["hybrid"].sent_frames  # same budget, same decisions so far
    assert oracle.bytes_sent == runs["hybrid"].bytes_sent
    answers.close()
    crops.close()
    assert answers.computed == 0
    assert runs["edge"].focus_crops == runs["cloud"].focus_crops == 0  # the hybrid's alone
    assert crops.computed <= runs["hybrid"].focus_crops + oracle.focus_crops

    assert runs["edge"].sent == 0 and runs["edge"].fusion.answers == 0
    assert runs["cloud"].sent == FRAMES
    assert runs["cloud"].bytes_sent == int(data.frame_bytes.sum())
    hybrid = runs["hybrid"]
    # Every frame after the first is due for a refresh: a full bucket of 5 frames is spent at
    # once, then 5 frames/s (one every 5th frame at 25 fps).
    first = hybrid.sent_frames[0]
    assert first <= 1 and hybrid.sent_frames[:5] == list(range(first, first + 5))
    assert all(np.diff(hybrid.sent_frames[6:]) >= 5)
    assert 5 < hybrid.sent <= 10
    assert hybrid.bytes_sent == int(data.frame_bytes[hybrid.sent_frames].sum())
    in_flight = sum(1 for f in hybrid.sent_frames if f + 2 >= FRAMES)
    assert hybrid.fusion.answers == hybrid.sent - in_flight and hybrid.fusion.late == 0
    for run in runs.values():
        assert len(run.outputs) == len(run.loop_ms) == FRAMES
        scores = score_run(data, run)
        assert 0.0 <= scores.map50 <= 1.0 and 0.0 <= scores.f1 <= 1.0
        assert scores.tracking is not None and scores.tracking.num_frames == FRAMES
        assert scores.alerts is not None
        assert np.isfinite(scores.idf1)


@pytest.mark.slow
def test_whole_frames_go_as_video_and_the_cloud_answers_the_decoded_pictures(
    scene_cache: Path,
) -> None:
    """The default uplink in the simulation: the agent's encoder, the service's decoder, the
    cloud model on each decoded picture (computed once per session chain, then cached)."""
    data = prepare_scene(
        "events", 1, render_frames=FRAMES, cache_dir=scene_cache, media_dir=MEDIA_CACHE_DIR
    )
    escalation = EscalationConfig.model_validate(
        {"per_camera_frames_per_s": 5.0, "per_agent_frames_per_s": 5.0, "refresh_interval_s": 0.01}
    )
    assert escalation.uplink.codec == "h264"
    variant = Variant("hybrid", "hybrid", escalation, rtt_frames=2)
    answers = CloudAnswers(data, cache_dir=scene_cache)
    try:
        run = simulate(data, variant, answers, EdgeCrops(data, cache_dir=scene_cache))
        computed = answers.computed
        again = simulate(data, variant, answers, EdgeCrops(data, cache_dir=scene_cache))
    finally:
        answers.close()
    assert run.sent > 5 and run.keyframes == 1
    assert computed == run.sent  # one answer per decoded picture ...
    assert answers.computed == computed  # ... and the same chain again comes from the cache
    assert again.sent_frames == run.sent_frames and again.bytes_sent == run.bytes_sent
    # inter-coded frames: a fraction of the JPEGs of the same frames, and of the camera's stream
    assert run.bytes_sent < 0.5 * int(data.frame_bytes[run.sent_frames].sum())
    assert run.bytes_sent < data.stream_bytes
    assert score_run(data, run).map50 > 0.0


@pytest.mark.slow
def test_oracle_answers_the_visible_ground_truth(scene_cache: Path) -> None:
    data = prepare_scene(
        "events", 1, render_frames=FRAMES, cache_dir=scene_cache, media_dir=MEDIA_CACHE_DIR
    )
    frame = data.scene.ground_truth[5]
    answer = oracle_answer(data, 5)
    counted = ~frame.ignored(MIN_VISIBILITY, MIN_SIDE_PX)
    assert 0 < len(answer) == int(counted.sum())
    assert np.all(answer.confidence == 1.0)
    assert sorted(answer.class_id.tolist()) == sorted(frame.class_id[counted].tolist())
