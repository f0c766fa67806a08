"""The verification memory: tracks the cloud confirmed are not re-sent until they change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from detection.detections import Detections
from edge_agent.config.escalation import EscalationConfig, VerificationMemoryConfig
from edge_agent.escalation.policy import EscalationPolicy, FrameSignals, SignalSettings
from edge_agent.escalation.verification import VerificationMemory

Box = tuple[float, float, float, float]
FPS = 10.0


@dataclass
class Track:
    """The fields the memory and the policy read from a track."""

    track_id: int
    box: Box
    class_id: int = 0
    last_score: float = 0.5
    time_since_update: int = 0
    age: int = 10
    is_tentative: bool = False
    is_held: bool = False
    cloud_only: bool = False

    @property
    def detected(self) -> bool:
        return not self.cloud_only

    def to_xyxy(self) -> npt.NDArray[np.float64]:
        return np.array(self.box, dtype=np.float64)


A: Box = (100.0, 100.0, 140.0, 200.0)
B: Box = (300.0, 100.0, 340.0, 200.0)


def _memory(**fields: object) -> VerificationMemory:
    return VerificationMemory(VerificationMemoryConfig.model_validate(fields), FPS)


def test_a_verified_track_is_settled_until_it_changes() -> None:
    memory = _memory()
    a, b = Track(1, A), Track(2, B)
    assert memory.settled([a, b], 0) == frozenset()  # never verified: not settled
    memory.record([a, b], {1}, frame_index=3)
    assert memory.settled([a, b], 4) == {1}
    assert memory.state(1) is not None and memory.state(2) is None


@pytest.mark.parametrize(
    ("change", "settled"),
    [
        ({}, True),
        ({"class_id": 2}, False),  # class doubt
        ({"last_score": 0.15}, False),  # the edge's score fell by 0.35 > 0.3
        ({"last_score": 0.25}, True),  # by 0.25: within score_drop
        ({"box": (100.0, 100.0, 160.0, 260.0)}, False),  # area x2.4: a size jump
        ({"box": (105.0, 100.0, 145.0, 200.0)}, True),  # moved, same size
    ],
)
def test_what_unsettles_a_track(change: dict[str, object], settled: bool) -> None:
    memory = _memory()
    memory.record([Track(1, A)], {1}, frame_index=0)
    fields: dict[str, object] = {"box": A} | change
    track = Track(1, **fields)  # type: ignore[arg-type]
    assert (1 in memory.settled([track], 1)) is settled


def test_someone_walking_in_front_unsettles_it() -> None:
    memory = _memory()
    memory.record([Track(1, A), Track(2, B)], {1}, frame_index=0)
    passer = Track(2, (110.0, 100.0, 150.0, 200.0))  # IoU with A about 0.6
    assert memory.settled([Track(1, A), passer], 1) == frozenset()


def test_an_old_verification_needs_a_new_look() -> None:
    memory = _memory(max_age_s=2.0)
    memory.record([Track(1, A)], {1}, frame_index=0)
    assert memory.settled([Track(1, A)], 20) == {1}
    assert memory.settled([Track(1, A)], 21) == frozenset()


def test_asked_tracks_and_boxes_are_settled_until_answered_or_pending_s() -> None:
    memory = _memory(pending_s=1.0)
    memory.sent(frame_id=7, untracked=[B], tracks=[1], frame_index=0)
    assert memory.asked(5) == {1}
    assert memory.settled([Track(1, A)], 5) == {1}
    assert memory.settled_boxes(5) == (B,)
    assert memory.asked(11) == frozenset()  # no answer within pending_s: ask again
    memory.answered(7, (), frame_index=3, cloud=[A])
    assert memory.asked(4) == frozenset()
    assert set(memory.settled_boxes(4)) == {A, B}  # what the edge had and what the cloud saw


def test_crops_verify_only_the_boxes_and_the_places_they_looked_at() -> None:
    memory = _memory(region_s=1.0)
    memory.sent(frame_id=1, untracked=[A, B], tracks=[], frame_index=0)
    crop = (90.0, 90.0, 150.0, 210.0)
    memory.answered(1, [crop], frame_index=2)
    assert memory.settled_boxes(3) == (A,)
    assert memory.verified_regions(3) == (crop,)
    assert memory.verified_regions(13) == ()  # more than region_s ago
    memory.answered(2, (), frame_index=20)  # a whole frame looked at everything
    (whole,) = memory.verified_regions(21)
    assert whole[0] == -np.inf and whole[2] == np.inf


def test_a_lost_track_keeps_its_verification() -> None:
    """Without an edge box there is nothing to compare: a prediction's size says nothing."""
    memory = _memory()
    memory.record([Track(1, A)], {1}, frame_index=0)
    shrunk = Track(1, (120.0, 150.0, 121.0, 151.0), time_since_update=2, last_score=0.1)
    assert memory.settled([shrunk], 3) == {1}


def test_gone_tracks_are_forgotten_and_off_settles_nothing() -> None:
    memory = _memory()
    memory.record([Track(1, A), Track(2, B)], {1, 2}, frame_index=0)
    assert memory.settled([Track(2, B)], 1) == {2}
    assert memory.state(1) is None
    off = _memory(enabled=False)
    off.record([Track(1, A)], {1}, frame_index=0)
    off.sent(frame_id=1, untracked=[B], tracks=[1], frame_index=0)
    assert off.settled([Track(1, A)], 1) == frozenset()
    assert off.settled_boxes(1) == () and off.asked(1) == frozenset()


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="fps"):
        VerificationMemory(VerificationMemoryConfig(), 0.0)
    with pytest.raises(ValueError, match="max_age_s"):
        VerificationMemoryConfig.model_validate({"max_age_s": 0})
    with pytest.raises(ValueError, match="box_iou"):
        EscalationConfig.model_validate({"signals": {"verification": {"box_iou": 1.5}}})


def _frame(tracks: list[Track], scores: list[float], ids: list[int]) -> Detections:
    return Detections(
        xyxy=np.array([t.box for t in tracks], dtype=np.float32),
        confidence=np.array(scores, dtype=np.float32),
        class_id=np.zeros(len(tracks), dtype=np.int64),
        tracker_id=np.array(ids, dtype=np.int64),
    )


def test_a_busy_settled_frame_is_not_hard_and_a_new_doubt_is() -> None:
    """Two overlapping people in the uncertain band: hard until the cloud verified them."""
    config = EscalationConfig.model_validate({"refresh_interval_s": 0.0})
    policy = EscalationPolicy.from_config(config, clock=lambda: 0.0)
    a, b = Track(1, A), Track(2, (110.0, 100.0, 150.0, 200.0))
    detections = _frame([a, b], [0.5, 0.5], [1, 2])
    settings = SignalSettings.from_config(config)

    def signals_of(frame: Detections, **memory_says: Any) -> FrameSignals:
        return FrameSignals.from_frame(frame, [a, b], 640, 480, settings, **memory_says)

    before = signals_of(detections)
    assert policy.decide(before, "cam", 0.0).send
    assert len(before.uncertain) == 2 and len(before.crowded) == 2
    memory = VerificationMemory(config.signals.verification, FPS)
    memory.record([a, b], {1, 2}, frame_index=1)
    settled = memory.settled([a, b], 2)
    after = signals_of(detections, settled=settled)
    assert after.uncertain == () and after.crowded == ()
    assert not policy.decide(after, "cam", 1.0).reasons
    # an untracked doubt elsewhere, never looked at by the cloud: hard again
    c = Track(-1, (400.0, 300.0, 440.0, 400.0))
    more = _frame([a, b, c], [0.5, 0.5, 0.5], [1, 2, -1])
    assert signals_of(more, settled=settled).uncertain == (c.box,)
    # ... unless the cloud looked at that very box, or at that place lately
    assert signals_of(more, settled=settled, settled_boxes=[c.box]).uncertain == ()
    there = (380.0, 280.0, 460.0, 420.0)
    assert signals_of(more, settled=settled, verified_regions=[there]).uncertain == ()
    elsewhere = signals_of(more, settled=settled, verified_regions=[A])
    assert elsewhere.uncertain == (c.box,)


def test_small_objects_can_be_kept_hard() -> None:
    """`settle_small: false`: a verified small object stays a signal, unless it is asked."""
    tiny = Track(1, (100.0, 100.0, 110.0, 110.0))
    detections = _frame([tiny], [0.9], [1])
    for settle, expected in ((True, ()), (False, (tiny.box,))):
        config = EscalationConfig.model_validate(
            {"signals": {"verification": {"settle_small": settle}}}
        )
        signals = FrameSignals.from_frame(
            detections, [tiny], 640, 480, SignalSettings.from_config(config), settled={1}
        )
        assert signals.small_objects == expected
    asked = FrameSignals.from_frame(
        detections, [tiny], 640, 480, SignalSettings.from_config(config), settled={1}, asked={1}
    )
    assert asked.small_objects == ()


def _held_signals(memory: VerificationMemory, tracks: list[Track], frame: int) -> tuple[Box, ...]:
    settings = SignalSettings.from_config(EscalationConfig())
    settled = memory.settled(tracks, frame)
    empty = _frame([], [], [])
    signals = FrameSignals.from_frame(empty, tracks, 640, 480, settings, settled=settled)
    return signals.held_tracks


def test_a_held_track_the_edge_never_saw_is_hard_until_the_cloud_verified_it_there() -> None:
    memory = _memory()
    seen = Track(1, A, time_since_update=3, is_held=True)
    cloud_only = Track(2, B, time_since_update=3, is_held=True, cloud_only=True)
    # The answer that started the cloud-only track did not verify it: only the cloud keeps it,
    # so only asking again keeps it.
    memory.record([seen], {1}, frame_index=0)
    assert _held_signals(memory, [seen, cloud_only], 1) == (B,)
    # The next answer returned a box for it where it was: asking again about a still object
    # gets the same answer (a sign post the cloud takes for a person was sent every third
    # frame of the busy real demo clip, a quarter of its escalations).
    memory.record([seen, cloud_only], {1, 2}, frame_index=1)
    assert _held_signals(memory, [seen, cloud_only], 2) == ()
    # It moved off the box the cloud verified: where it is now is the cloud's to say.
    moved = Track(
        2, (320.0, 100.0, 360.0, 200.0), time_since_update=3, is_held=True, cloud_only=True
    )
    assert _held_signals(memory, [seen, moved], 3) == (moved.box,)
    # ... and their verifications grow old as any other.
    assert _held_signals(memory, [seen, cloud_only], 1 + 5 * int(FPS) + 1) == (A, B)


def test_cloud_only_tracks_can_stay_hard_as_before() -> None:
    memory = _memory(cloud_only_still_iou=None)
    cloud_only = Track(2, B, time_since_update=3, is_held=True, cloud_only=True)
    memory.record([cloud_only], {2}, frame_index=0)
    assert memory.settled([cloud_only], 1) == frozenset()
    assert _held_signals(memory, [cloud_only], 1) == (B,)


def test_a_held_track_on_a_frame_awaiting_its_answer_is_not_hard() -> None:
    config = EscalationConfig()
    cloud_only = Track(2, B, time_since_update=3, is_held=True, cloud_only=True)
    asked = FrameSignals.from_frame(
        _frame([], [], []),
        [cloud_only],
        640,
        480,
        SignalSettings.from_config(config),
        asked={2},
    )
    assert asked.held_tracks == ()


def test_a_track_born_on_a_settled_one_waits_a_frame() -> None:
    """A second box on a verified person (the busy real demo clip: most are gone a frame later)
    is no signal on its first frame; a real second person is one from the next."""
    seen = Track(1, A, last_score=0.9)
    second = Track(2, (110.0, 100.0, 150.0, 200.0), age=1, is_tentative=True)  # IoU 0.6
    elsewhere = Track(3, B, age=1, is_tentative=True)

    def signals(
        *tracks: Track, waits: bool = True, settled: frozenset[int] = frozenset({1})
    ) -> FrameSignals:
        config = EscalationConfig.model_validate(
            {"signals": {"verification": {"second_box_waits": waits}}}
        )
        frame = _frame(
            list(tracks), [0.9] + [0.5] * (len(tracks) - 1), [t.track_id for t in tracks]
        )
        return FrameSignals.from_frame(
            frame, list(tracks), 640, 480, SignalSettings.from_config(config), settled=settled
        )

    first = signals(seen, second, elsewhere)
    assert first.new_tracks == (B,)  # only the one away from the settled track
    assert first.crowded == () and first.uncertain == (B,)
    # still there a frame later: its doubts are signals (new to the memory, not settled)
    later = Track(2, second.box, age=2)
    assert signals(seen, later).crowded == (later.box,)
    assert signals(seen, later).uncertain == (later.box,)
    # off: a new track like any other
    off = signals(seen, second, waits=False)
    assert off.new_tracks == (second.box,) and off.crowded == (second.box,)
    # the track below it is not settled, or not seen on this frame: no reason to wait
    assert signals(seen, second, settled=frozenset()).new_tracks == (second.box,)
    lost = Track(1, A, time_since_update=1)
    assert signals(lost, second).new_tracks == (second.box,)
