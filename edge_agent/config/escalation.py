"""`escalation:` — which frames go to the cloud detector, within what budget, and how."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at
from edge_agent.config.uplink import UplinkConfig

_HOST_PORT = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}"
_IPV4_PORT = r"\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}"
_IPV6_PORT = r"\[[0-9A-Fa-f:.]+\]:\d{1,5}"
# The gRPC target forms the client takes: `host:port`, `dns:///name:port` (every address the
# name resolves to, re-resolved when a connection goes away) and gRPC's static address lists.
GRPC_TARGET_PATTERN = (
    rf"^(?:(?:dns:(?://[A-Za-z0-9_.:-]*)?/)?{_HOST_PORT}"
    rf"|ipv4:{_IPV4_PORT}(?:,{_IPV4_PORT})*"
    rf"|ipv6:{_IPV6_PORT}(?:,{_IPV6_PORT})*)$"
)


class EscalationWeights(StrictModel):
    """Score added per occurrence of each hard-frame signal (each count capped, see `signals`)."""

    uncertain: float = Field(
        default=1.0, ge=0.0, le=100.0, description="Per detection in the uncertain confidence band."
    )
    new_track: float = Field(
        default=0.5, ge=0.0, le=100.0, description="Per track started on this frame."
    )
    tentative_track: float = Field(
        default=0.5, ge=0.0, le=100.0, description="Per older track not yet confirmed."
    )
    lost_track: float = Field(
        default=0.75, ge=0.0, le=100.0, description="Per confirmed track missed on this frame."
    )
    held_track: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description=(
            "Per track the edge keeps missing that a cloud answer holds (feedback region: the "
            "next crops re-check it)."
        ),
    )
    small_object: float = Field(
        default=0.5, ge=0.0, le=100.0, description="Per detection smaller than the small-area cut."
    )
    crowding: float = Field(
        default=0.5, ge=0.0, le=100.0, description="Per detection overlapping another one."
    )
    motion_without_detections: float = Field(
        default=1.0, ge=0.0, le=100.0, description="Once, when there is motion but no detection."
    )


class VerificationMemoryConfig(StrictModel):
    """Per-track verification memory: a track the cloud confirmed is settled, and its doubts
    (uncertain score, overlap with others) do not make a frame hard again until it changes.

    A busy but settled scene otherwise spends its whole budget re-sending what the cloud
    already confirmed: on the real demo clip every frame scored hard (uncertain people in the
    band, crowding) while the cloud agreed with 99 % of the edge's sure tracks. New, tentative
    and never-verified tracks and small objects stay hard as before; a held track only the
    cloud has seen is settled while it stays where the cloud last boxed it.
    """

    enabled: bool = Field(
        default=True,
        description=(
            "Remember which tracks a cloud answer confirmed (or rejected) and leave their "
            "uncertain-score and crowding signals out of the frame's score while they stay as "
            "they were; off: every uncertain or crowded box makes the frame hard."
        ),
    )
    max_age_s: float = Field(
        default=5.0,
        gt=0.0,
        le=3_600.0,
        description="A verification older than this no longer settles a track (re-check it).",
    )
    score_drop: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description=(
            "A settled track whose edge score fell this much below its score at the "
            "verification is in doubt again."
        ),
    )
    size_change: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description=(
            "A settled track whose box area grew or shrank by more than this fraction since "
            "the verification (1 + this times, either way) is in doubt again."
        ),
    )
    overlap_rise: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description=(
            "A settled track whose highest IoU with another box rose this much since the "
            "verification (someone walked in front of it) is in doubt again."
        ),
    )
    pending_s: float = Field(
        default=2.0,
        gt=0.0,
        le=600.0,
        description=(
            "Tracks and boxes on a frame sent to the cloud are settled until its answer is "
            "fused or this long has passed (no answer): asking again meanwhile asks the same."
        ),
    )
    region_s: float = Field(
        default=1.0,
        ge=0.0,
        le=600.0,
        description=(
            "An untracked edge box (no confirmed track: a weak box under the tracker's "
            "threshold) inside what a cloud answer fused this recently looked at is settled: "
            "the cloud saw that place and either has it (a track, a box of the memory) or found "
            "nothing there. 0 turns it off."
        ),
    )
    settle_small: bool = Field(
        default=True,
        description=(
            "A settled track's small size is no signal either; false: small objects stay hard "
            "(except while a frame showing them awaits its answer)."
        ),
    )
    box_iou: float = Field(
        default=0.2,
        gt=0.0,
        le=1.0,
        description=(
            "An untracked edge box (no confirmed track) overlapping at least this much a box "
            "the edge had on a frame the cloud answered within max_age_s is settled: the cloud "
            "already looked at that very box."
        ),
    )
    cloud_only_still_iou: float | None = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description=(
            "A held track only the cloud has seen (the edge never detected it) is settled by "
            "the cloud's last box for it while it stays there (its box overlaps that box at "
            "least this much): asking again about a still object gets the same answer. One "
            "that moves, or was never verified, stays hard. null: such tracks are always hard."
        ),
    )
    second_box_waits: bool = Field(
        default=True,
        description=(
            "A track started on top of a settled track the edge still sees (IoU at least "
            "signals.crowding_iou) is no signal on its first frame: most such boxes are a "
            "second box on one object, gone on the next frame; a real second object is a "
            "signal from its next frame on (its crowding, its uncertain score). false: it is "
            "a new track like any other."
        ),
    )


class EscalationSignalsConfig(StrictModel):
    """How a frame is scored: signal thresholds, weights and the score that makes it hard."""

    score_threshold: float = Field(
        default=1.0, gt=0.0, le=1_000.0, description="A frame scoring at least this is sent."
    )
    max_count_per_signal: int = Field(
        default=3, ge=1, le=1_000, description="Occurrences of one signal counted per frame."
    )
    small_object_area_fraction: float = Field(
        default=0.0025,
        ge=0.0,
        le=1.0,
        description="A box covering less than this fraction of the frame is a small object.",
    )
    crowding_iou: float = Field(
        default=0.3,
        gt=0.0,
        le=1.0,
        description="Two boxes overlapping with at least this IoU count as crowding.",
    )
    motion_threshold: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="Motion score (fraction of changed pixels) that counts as motion.",
    )
    weights: EscalationWeights = Field(
        default_factory=EscalationWeights, description="Score of each signal."
    )
    verification: VerificationMemoryConfig = Field(
        default_factory=VerificationMemoryConfig,
        description="Tracks the cloud confirmed are not a reason to re-send until they change.",
    )


class RegionEscalationConfig(StrictModel):
    """Region escalation: send padded crops of the hard boxes instead of the whole frame."""

    enabled: bool = Field(
        default=False,
        description=(
            "Send crops of the hard boxes instead of the whole frame when the hard part is "
            "small. They save bytes, not accuracy (a crop shows the cloud only what the edge "
            "already sees): turn them on where the uplink is tight."
        ),
    )
    crops_when_bytes_short: bool = Field(
        default=True,
        description=(
            "With crops off (whole frames preferred), a hard frame whose whole JPEG the byte "
            "budget (per_camera_bytes_per_s, per_agent_bytes_per_s) cannot pay for is sent as "
            "crops of its hard boxes when they are few and small enough, instead of not at all: "
            "a 1080p camera at 2 frames/s can outrun 500 KB/s."
        ),
    )
    max_area_fraction: float = Field(
        default=0.3,
        gt=0.0,
        le=1.0,
        description="Send crops only while they cover at most this fraction of the frame.",
    )
    max_regions: int = Field(
        default=4, ge=1, le=64, description="At most this many crops; more: the whole frame."
    )
    padding_fraction: float = Field(
        default=0.25, ge=0.0, le=10.0, description="Margin around a box, as a fraction of its size."
    )
    min_size_px: int = Field(
        default=64, ge=1, le=4_096, description="Smallest crop side in source pixels."
    )
    jpeg_quality: int = Field(
        default=95, ge=1, le=100, description="JPEG quality of the crops (above the frame's)."
    )


class EscalationBackoffConfig(StrictModel):
    """AIMD on the escalation rate: cut when the cloud is slow or overloaded, recover slowly."""

    max_rtt_ms: float = Field(
        default=1_000.0, gt=0.0, le=600_000.0, description="Round-trip time above it: back off."
    )
    max_queue_time_ms: float = Field(
        default=200.0, gt=0.0, le=600_000.0, description="Cloud queue time above it: back off."
    )
    decrease_factor: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="The rate is multiplied by this on a back-off."
    )
    min_rate_fraction: float = Field(
        default=0.05, gt=0.0, le=1.0, description="The rate never falls below this fraction."
    )
    recover_per_s: float = Field(
        default=0.05,
        gt=0.0,
        le=10.0,
        description="Fraction of the full rate regained per second without congestion.",
    )
    hold_ms: int = Field(
        default=1_000,
        ge=0,
        le=600_000,
        description="After a back-off, further congestion signals are ignored this long.",
    )


class CloudConnectionConfig(StrictModel):
    """The gRPC stream to the cloud: send queue, keepalive, reconnect back-off."""

    send_queue_frames: int = Field(
        default=8, ge=1, le=1_024, description="Frames waiting to go on the stream; full: dropped."
    )
    result_queue_frames: int = Field(
        default=256, ge=1, le=100_000, description="Answers kept for `poll_results`; oldest lost."
    )
    answer_grace_ms: int = Field(
        default=2_000,
        ge=0,
        le=600_000,
        description="An answer missing this long past its deadline fails the frame locally.",
    )
    keepalive_time_ms: int = Field(
        default=30_000, ge=1_000, le=3_600_000, description="Ping the connection this often."
    )
    keepalive_timeout_ms: int = Field(
        default=10_000, ge=100, le=600_000, description="Reconnect if a ping is unanswered."
    )
    reconnect_min_backoff_ms: int = Field(
        default=500, ge=10, le=600_000, description="First wait before reopening a broken stream."
    )
    reconnect_max_backoff_ms: int = Field(
        default=30_000, ge=10, le=3_600_000, description="Longest wait between reconnects."
    )
    reconnect_jitter_fraction: float = Field(
        default=0.2, ge=0.0, le=1.0, description="Spread of each wait, +- this fraction."
    )
    auth_retry_ms: int = Field(
        default=60_000,
        ge=10,
        le=3_600_000,
        description="Wait before retrying after the cloud rejected the token (UNAUTHENTICATED).",
    )
    max_message_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1_024,
        le=256 * 1024 * 1024,
        description="Largest request sent / answer accepted.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.reconnect_min_backoff_ms > self.reconnect_max_backoff_ms:
            raise config_error_at(
                ("reconnect_min_backoff_ms",),
                f"reconnect_min_backoff_ms ({self.reconnect_min_backoff_ms}) exceeds "
                f"reconnect_max_backoff_ms ({self.reconnect_max_backoff_ms})",
            )
        return self


class FusionConfig(StrictModel):
    """How late cloud answers are folded into the tracks."""

    horizon_ms: int = Field(
        default=2_000,
        ge=0,
        le=60_000,
        description="Answers about frames older than this are dropped (and counted).",
    )
    min_iou: float = Field(
        default=0.3, gt=0.0, le=1.0, description="Least IoU between a cloud box and a track's box."
    )
    min_cloud_score: float = Field(
        default=0.4,
        ge=0.0,
        le=1.0,
        description=(
            "Cloud boxes scoring lower are ignored, so a weak cloud guess cannot relabel a track."
        ),
    )
    hold_ms: int = Field(
        default=1_000,
        ge=0,
        le=10_000,
        description=(
            "Report a track the cloud vouched for this long even where the edge misses it "
            "(about the time between two cloud answers at the default budget)."
        ),
    )
    hold_half_life_ms: int | None = Field(
        default=120,
        ge=1,
        le=60_000,
        description=(
            "A held box (see hold_ms) is reported at the cloud's score halved every this many ms "
            "the edge has missed the track, so a box coasting off its object ranks below fresh "
            "detections; null: at the cloud's score until the hold ends."
        ),
    )
    min_held_score: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "A held box whose score has run down below this (see hold_half_life_ms) is no longer "
            "reported: past it the box has mostly drifted off its object, and every reported box "
            "counts, whatever its rank."
        ),
    )
    fit_gain: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "Share of the cloud's box fit (how its box differed from the edge's at the answer's "
            "frame) applied to the track's own edge boxes for fit_ms after an answer; needs a "
            "trusted cloud. 0 (the default) turns it off: it also gives edge boxes that were "
            "right the cloud model's box style."
        ),
    )
    fit_ms: int = Field(
        default=1000,
        ge=0,
        le=60_000,
        description=(
            "How long after an answer its box fit corrects the track's edge boxes (see "
            "fit_gain); the next answer about the track replaces it."
        ),
    )
    held_score_scale: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description=(
            "A held box (see hold_ms) is reported at this share of its decayed score "
            "(min_held_score applies before the share): no detector saw the object in this "
            "frame, so it ranks below the edge's fresh detections."
        ),
    )
    followed_aging: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "What a frame in which optical flow followed a held track (follow_flow) counts "
            "towards its score's decay (hold_half_life_ms): 0 not at all, 1 as a frame the track "
            "coasted blind."
        ),
    )
    vouch_ms: int | None = Field(
        default=0,
        ge=0,
        le=60_000,
        description=(
            "How long a cloud confirmation lifts the reported confidence of the track's own "
            "detections to the cloud's score; 0 (the default): never, only held boxes carry the "
            "cloud's score; null: for the rest of the track's life."
        ),
    )
    new_track_min_score: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "A cloud box no track explains starts a track (an object the edge missed, followed "
            "by optical flow) when it scores at least this; 1.0 turns that off. Such tracks need "
            "a trusted cloud, or a camera still undecided (fewer than trust_min_checks checks)."
        ),
    )
    relabel: bool = Field(
        default=True,
        description=(
            "Let a trusted cloud answer count as a heavy vote (cloud_vote_weight) in a track's "
            "class; off: cloud answers vouch for tracks and never change their class."
        ),
    )
    cloud_vote_weight: int = Field(
        default=10,
        ge=1,
        le=1_000,
        description=(
            "Edge frames one trusted cloud answer is worth in a track's class vote (see relabel)."
        ),
    )
    cloud_sighting: bool = Field(
        default=True,
        description=(
            "A track the cloud confirms counts as seen at the answer's frame: it is not aged out "
            "(tracker max_age_frames) and its held score does not run down while only the cloud "
            "sees it."
        ),
    )
    follow_flow: bool = Field(
        default=True,
        description=(
            "Move the held boxes of tracks only the cloud has seen (no edge detection since) by "
            "the optical flow of their content (pyramidal Lucas-Kanade), instead of a Kalman "
            "prediction with no velocity."
        ),
    )
    reject_duplicates: bool = Field(
        default=False,
        description=(
            "Also reject a weak track the cloud saw only through a box it matched to another "
            "track containing it (a second edge box on one object). Off: on real footage that is "
            "often a person standing behind another."
        ),
    )
    remove_tentative: bool = Field(
        default=True,
        description="Remove tentative tracks in the looked-at area that the cloud did not see.",
    )
    confirm_iou: float = Field(
        default=0.3,
        gt=0.0,
        le=1.0,
        description=(
            "A matched cloud box confirms the track (cloud score, hold, class vote) only when it "
            "overlaps the track's box at least this much; low, as the edge's boxes of small and "
            "partly hidden objects are loose."
        ),
    )
    reject_below_edge_score: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "A confirmed track the cloud looked at and returned no box for stops being reported "
            "(its recent alerts retracted) when the edge never scored it this high; 0 turns that "
            "off."
        ),
    )
    hidden_coverage: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "A track with no cloud box of its own still counts as seen (not rejected, agreeing "
            "for trust) when a cloud box covers at least this share of its box: a person half "
            "hidden behind another is boxed with them. 0 turns it off."
        ),
    )
    min_agreement: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "The cloud may relabel, refit, reject, remove or add tracks on a camera only while "
            "it surely (90 % lower confidence bound) returned a box for at least this share of "
            "the tracks the edge is sure of; 0 trusts it always."
        ),
    )
    trust_min_checks: int = Field(
        default=10,
        ge=0,
        le=100_000,
        description="Sure edge tracks the cloud must have been checked on before it is trusted.",
    )
    box_correction_gain: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "Share of the cloud's box offset (at its frame) applied to the track's state now; 0 "
            "(the default) turns it off, as it can move a track onto a close neighbour."
        ),
    )


class FocusConfig(StrictModel):
    """Following what the cloud saw: the edge re-detects small cloud-vouched objects in crops.

    A small object the cloud found (or confirmed) is followed by the edge itself once the whole
    frame loses it: its own detector runs on a native-resolution crop around the track's last box
    (the crop is scaled up to the detector's input, so a 10 px object becomes a 20 px one), and
    what the crop finds and the whole frame missed joins the frame's detections before tracking.
    This keeps such tracks alive between cloud answers instead of coasting on predictions.
    """

    enabled: bool = Field(default=True, description="Follow small cloud-vouched tracks in crops.")
    max_crops: int = Field(
        default=6,
        ge=1,
        le=32,
        description=(
            "Crops per camera and frame, batched with the frames; each is one more detector "
            "input, or a share of one when the frame period is short (see mosaic)."
        ),
    )
    crop_px: int = Field(
        default=160, ge=32, le=4096, description="Side of a crop in source pixels (at least)."
    )
    mosaic: int = Field(
        default=2,
        ge=1,
        le=4,
        description=(
            "Most crops a side of one detector run when the frame period has no room to run "
            "each crop alone: 2 packs up to four as one 2x2 mosaic at the model's input size "
            "(each scaled to fit a quarter of it), so a box with time for one more run a frame "
            "still looks at four; with room, each runs alone, upscaled to the whole input. 1: "
            "never packed."
        ),
    )
    max_object_px: int = Field(
        default=96,
        ge=1,
        le=4096,
        description=(
            "Only tracks (and cloud hints) whose box is at most this tall or wide are followed "
            "with crops."
        ),
    )
    refine_max_px: int = Field(
        default=48,
        ge=0,
        le=4096,
        description=(
            "Cloud-vouched tracks the whole frame still sees that are at most this tall and wide "
            "get a crop too (within max_crops), and their whole-frame box is averaged with the "
            "crop's, score-weighted: a small object's box is often loose. 0 turns it off."
        ),
    )
    new_object_min_score: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "A crop's box away from the followed tracks is kept (and may start a track) when it "
            "scores at least this; 1.0 keeps only the boxes of the followed tracks. The "
            "tracker's own thresholds still apply."
        ),
    )
    cloud_hints: bool = Field(
        default=True,
        description=(
            "Also look closer where a cloud answer had a small object (scoring hint_min_score or "
            "more) that no track explains: the edge then starts the track itself from what its "
            "crop finds (new_object_min_score), instead of the cloud's box being dropped."
        ),
    )
    hint_min_score: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Least score of a cloud box no track explains for the edge to look there.",
    )
    hint_ms: int = Field(
        default=1_000,
        ge=0,
        le=60_000,
        description="How long after an answer such a place is looked at (while no track is there).",
    )


class EscalationConfig(StrictModel):
    """Sending hard frames to the cloud service; the edge never waits for the answers."""

    enabled: bool = Field(default=False, description="Escalate hard frames to the cloud.")
    cloud_address: str | None = Field(
        default=None,
        pattern=GRPC_TARGET_PATTERN,
        description=(
            "gRPC target of the cloud service; required when enabled. `host:port`; "
            "`dns:///name:port` for every replica a name resolves to (a Kubernetes headless "
            "Service); or a static list `ipv4:10.0.0.5:50051,10.0.0.6:50051`."
        ),
    )
    load_balancing: Literal["round_robin", "pick_first"] = Field(
        default="round_robin",
        description=(
            "gRPC load-balancing policy over the target's addresses: `round_robin` places each "
            "new stream on the next ready replica (streams move when a replica goes away or a "
            "connection ages out); `pick_first` sticks to the first address that answers."
        ),
    )
    tls: bool = Field(default=False, description="Use TLS to the cloud service.")
    tls_ca_path: Path | None = Field(
        default=None, description="PEM CA bundle to verify the cloud with; none: system roots."
    )
    auth_token: SecretRef | None = Field(
        default=None, description="Where the bearer token sent to the cloud comes from."
    )
    per_camera_frames_per_s: float = Field(
        default=2.0, gt=0.0, le=1_000.0, description="Budget of escalated frames per camera."
    )
    per_camera_bytes_per_s: int = Field(
        default=500_000,
        ge=1_000,
        le=10**10,
        description=(
            "Budget of uplink bytes per camera (video packets, JPEGs and crops); the video "
            "uplink's quality follows it (uplink.max_crf). Size it from docs/uplink.md."
        ),
    )
    per_agent_frames_per_s: float = Field(
        default=10.0, gt=0.0, le=10_000.0, description="Budget of escalated frames, all cameras."
    )
    per_agent_bytes_per_s: int = Field(
        default=4_000_000, ge=1_000, le=10**11, description="Budget of uplink bytes, all cameras."
    )
    uncertain_confidence_low: float = Field(
        default=0.25, ge=0.0, le=1.0, description="Lower end of the uncertain confidence band."
    )
    uncertain_confidence_high: float = Field(
        default=0.6, ge=0.0, le=1.0, description="Upper end of the uncertain confidence band."
    )
    jpeg_quality: int = Field(default=85, ge=1, le=100, description="JPEG quality of sent frames.")
    deadline_ms: int = Field(
        default=2_000,
        ge=10,
        le=60_000,
        description=(
            "Deadline of one frame at the cloud; it must cover the uplink, the cloud's queue and "
            "its inference, or the answers expire and the hybrid runs as edge-only. When most "
            "frames expire the agent says so (a log line with a deadline to set, "
            "`cloud_answers.mismatch` on the status topic)."
        ),
    )
    max_in_flight: int = Field(
        default=8, ge=1, le=1_024, description="Frames sent and not yet answered, per agent."
    )
    initial_in_flight: int = Field(
        default=2,
        ge=1,
        le=1_024,
        description=(
            "Frames in flight allowed on a new stream to the cloud (slow start): one more for "
            "each answer that comes back uncongested, up to max_in_flight, and halved (not "
            "below 1) whenever the cloud is congested (escalation.backoff). An agent's first "
            "burst, or a fleet that restarts at once, then queues this many frames per agent "
            "at the cloud, not the whole burst budget."
        ),
    )
    refresh_interval_s: float = Field(
        default=1.0,
        ge=0.0,
        le=3_600.0,
        description=(
            "Send one whole frame per camera at least this often, within the frame budget (crops "
            "in between do not count); whole frames are how the cloud finds objects the edge "
            "misses altogether. 0 turns refreshes off."
        ),
    )
    burst_s: float = Field(
        default=2.0,
        gt=0.0,
        le=600.0,
        description="Token bucket depth: this many seconds of each budget can be spent at once.",
    )
    signals: EscalationSignalsConfig = Field(
        default_factory=EscalationSignalsConfig, description="Scoring of hard frames."
    )
    regions: RegionEscalationConfig = Field(
        default_factory=RegionEscalationConfig, description="Sending crops instead of frames."
    )
    backoff: EscalationBackoffConfig = Field(
        default_factory=EscalationBackoffConfig, description="Slowing down when the cloud is."
    )
    fusion: FusionConfig = Field(
        default_factory=FusionConfig, description="Folding cloud answers into the tracks."
    )
    focus: FocusConfig = Field(
        default_factory=FocusConfig, description="The edge follows small objects the cloud saw."
    )
    connection: CloudConnectionConfig = Field(
        default_factory=CloudConnectionConfig, description="The gRPC stream to the cloud."
    )
    uplink: UplinkConfig = Field(
        default_factory=UplinkConfig,
        description="How escalated whole frames are encoded: a video stream per camera or JPEG.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.enabled and self.cloud_address is None:
            raise config_error_at(
                ("enabled",), "escalation is enabled but `cloud_address` is not set"
            )
        if self.tls_ca_path is not None and not self.tls:
            raise config_error_at(("tls_ca_path",), "`tls_ca_path` is set but `tls` is false")
        if self.uncertain_confidence_low >= self.uncertain_confidence_high:
            raise config_error_at(
                ("uncertain_confidence_low",),
                f"uncertain_confidence_low ({self.uncertain_confidence_low}) must be below "
                f"uncertain_confidence_high ({self.uncertain_confidence_high})",
            )
        if self.initial_in_flight > self.max_in_flight:
            raise config_error_at(
                ("initial_in_flight",),
                f"initial_in_flight ({self.initial_in_flight}) exceeds max_in_flight "
                f"({self.max_in_flight})",
            )
        for unit in ("frames_per_s", "bytes_per_s"):
            camera, agent = getattr(self, f"per_camera_{unit}"), getattr(self, f"per_agent_{unit}")
            if camera > agent:
                raise config_error_at(
                    (f"per_camera_{unit}",),
                    f"per_camera_{unit} ({camera}) exceeds per_agent_{unit} ({agent})",
                )
        return self
