"""Edge-only vs cloud-only vs hybrid: accuracy against the share of frames sent to the cloud.

    python -m bench.hybrid.hybrid_tradeoff [--quick]
        [--scenes quiet,crowded,small_far,events,events:2] [--rtt-frames 4] [--cloud-threshold 0.2]
        [--threads 2] [--no-plot]

On generated scenes with ground truth (`bench.hybrid._hybrid_sim`: the real detectors' cached
outputs, tracker, rules, escalation policy and budget, JPEG requests, the cloud's frame processor
and fusion, on simulated time), each variant is scored on:
detection mAP50 and F1 (IoU 0.5, per class) of the boxes the pipeline reports (confirmed tracks,
with their confidences), tracking IDF1 / MOTA, alert precision / recall against the scripted
events of the `events` scenes, the share of frames escalated, JPEG bytes sent per second, and the
edge frame-loop time per frame (edge detector + fusion + tracker + rules + policy; the JPEG
encoding runs off the loop in the agent, so it is reported apart).

Variants: edge only; cloud only (every frame sent, the cloud's boxes tracked on the edge);
hybrid with a per-camera (= per-agent) budget of 0.5 .. 8 frames/s and the default policy; the
same budgets with fusion's trust check off; policy and fusion settings at the default budget;
and what-ifs. `--quick`: 100 frames of `crowded` and `events`.
The table goes to stdout and `bench/results/hybrid_tradeoff.md`, one record per variant to
`bench/results/hybrid_tradeoff.json`, the plot to `bench/results/hybrid_tradeoff.png`.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import harness
from bench.harness import RESULTS
from bench.hybrid._hybrid_sim import (
    TRACKER,
    CloudAnswers,
    EdgeCrops,
    RunScores,
    SceneData,
    SimRun,
    Variant,
    focus_run_variants,
    prepare_scene,
    recovery_variants,
    reported_ids,
    score_run,
    simulate,
)
from bench.models.resample import LEVEL, RESAMPLES, Interval, scene_bootstrap
from edge_agent.config.escalation import EscalationConfig

BUDGETS = (0.5, 1.0, 2.0, 3.0, 4.0, 8.0)
DEFAULT_SCENES = (
    "quiet,crowded,small_far,events,events:2,quiet:3,crowded:3,small_far:3,events:3,events:4"
)
TARGET_ACCURACY = 0.95  # of cloud-only
TARGET_SHARE = 0.20  # of frames escalated
DEFAULTS = EscalationConfig()
UNTRUSTED = "budget, trust off"  # the second budget curve: fusion without its trust check
ORACLE = "oracle"  # the third: the same machinery with a cloud that answers the ground truth


def _budget(frames_per_s: float, *, video: bool = False, **updates: Any) -> EscalationConfig:
    """Default escalation settings with a per-camera = per-agent frame budget and `updates`
    (nested sections as dicts of their fields).

    Without `video` the uplink is JPEG (`uplink.codec: jpeg`): the cloud's answers to whole
    JPEG frames are cached per frame, where answers to video packets are computed per run (a
    decoded picture depends on every packet before it). The settings rows compare with the
    JPEG row at the same budget; the video uplink has its own rows (the budget curve, `uplink`).
    """
    document = DEFAULTS.model_dump()
    document.update(per_camera_frames_per_s=frames_per_s, per_agent_frames_per_s=frames_per_s)
    if not video:
        document["uplink"] = {**document["uplink"], "codec": "jpeg"}
    return EscalationConfig.model_validate(_merged(document, updates))


def _merged(document: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """`document` with `updates` laid over it, nested sections field by field."""
    out = dict(document)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


PREVIOUS_DEFAULTS: dict[str, Any] = {
    "uplink": {"codec": "jpeg"},
    "signals": {"verification": {"enabled": False}},
}
"""The previous release's defaults (one row): whole frames as independent JPEGs, and no
verification memory (a settled track's doubts made frames hard again)."""


def variants(rtt_frames: int, cloud_threshold: float) -> list[Variant]:
    """Every variant of the benchmark, in table order."""
    common: dict[str, Any] = {"rtt_frames": rtt_frames, "cloud_threshold": cloud_threshold}
    default_fps = DEFAULTS.per_camera_frames_per_s
    out = [
        Variant("edge only", "edge", group="reference", **common),
        Variant("cloud only", "cloud", group="reference", **common),
        Variant("stream to cloud", "cloud", group="reference", stream=True, **common),
    ]
    for fps in BUDGETS:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s",
                "hybrid",
                _budget(fps, video=True),
                group="budget",
                is_default=fps == default_fps,
                **common,
            )
        )
    # The uplink's encodings at the default budget (the JPEG row is the previous default).
    uplinks: list[tuple[str, dict[str, Any]]] = [
        ("JPEG uplink", {"uplink": {"codec": "jpeg"}}),
        ("verification memory off", {"signals": {"verification": {"enabled": False}}}),
        ("a second box does not wait", {"signals": {"verification": {"second_box_waits": False}}}),
        ("previous release", PREVIOUS_DEFAULTS),
        ("H.264 CRF 26", {"uplink": {"crf": 26}}),
        ("H.264 CRF 32", {"uplink": {"crf": 32}}),
        ("HEVC CRF 20", {"uplink": {"codec": "hevc"}}),
        ("H.264 at half width", {"uplink": {"max_width": 320}}),
    ]
    for label, updates in uplinks:
        out.append(
            Variant(
                f"hybrid {default_fps:g} f/s, {label}",
                "hybrid",
                _budget(default_fps, video=True, **updates),
                group="uplink",
                **common,
            )
        )
    # The tracker's observation-centric recovery (`tracker.recover_iou`), edge only and hybrid.
    out += recovery_variants(
        TRACKER, default_fps, _budget(default_fps, video=True), group="tracker", **common
    )
    policy: list[tuple[str, dict[str, Any]]] = [
        ("score >= 0.5", {"signals": {"score_threshold": 0.5}}),
        ("score >= 2", {"signals": {"score_threshold": 2.0}}),
        ("score >= 3", {"signals": {"score_threshold": 3.0}}),
        ("crops, refresh off", {"regions": {"enabled": True}, "refresh_interval_s": 0.0}),
        ("crops, refresh 2 s", {"regions": {"enabled": True}, "refresh_interval_s": 2.0}),
        ("crops, refresh 10 s", {"regions": {"enabled": True}, "refresh_interval_s": 10.0}),
        ("crops >= 256 px", {"regions": {"enabled": True, "min_size_px": 256}}),
        ("hold off", {"fusion": {"hold_ms": 0}}),
        ("hold 500 ms, half-life 80 ms", {"fusion": {"hold_ms": 500, "hold_half_life_ms": 80}}),
        ("held score kept", {"fusion": {"hold_half_life_ms": None}}),
        ("held score half-life 300 ms", {"fusion": {"hold_half_life_ms": 300}}),
        ("held boxes at any score", {"fusion": {"min_held_score": 0.0}}),
        ("held boxes at full score", {"fusion": {"held_score_scale": 1.0}}),
        ("held boxes at half score", {"fusion": {"held_score_scale": 0.5}}),
        ("box fit at half gain", {"fusion": {"fit_gain": 0.5}}),
        ("box fit at full gain", {"fusion": {"fit_gain": 1.0}}),
        ("rejection off", {"fusion": {"reject_below_edge_score": 0.0}}),
        ("rejection below 0.7", {"fusion": {"reject_below_edge_score": 0.7}}),
        ("duplicates rejected", {"fusion": {"reject_duplicates": True}}),
        ("new tracks off", {"fusion": {"new_track_min_score": 1.0}}),
        ("cloud sighting off", {"fusion": {"cloud_sighting": False}}),
        ("flow off", {"fusion": {"follow_flow": False}}),
        ("trust >= 0.75", {"fusion": {"min_agreement": 0.75}}),
        ("trust >= 0.6", {"fusion": {"min_agreement": 0.6}}),
        ("trust >= 0.85", {"fusion": {"min_agreement": 0.85}}),
        ("confirm IoU 0.5", {"fusion": {"confirm_iou": 0.5}}),
        ("cloud score >= 0.5", {"fusion": {"min_cloud_score": 0.5}}),
        ("relabel off", {"fusion": {"relabel": False}}),
        ("cloud vote weight 5", {"fusion": {"cloud_vote_weight": 5}}),
        ("cloud vote weight 20", {"fusion": {"cloud_vote_weight": 20}}),
        ("held-track signal off", {"signals": {"weights": {"held_track": 0.0}}}),
        ("followed frames age the hold", {"fusion": {"followed_aging": 1.0}}),
        ("followed frames age a quarter", {"fusion": {"followed_aging": 0.25}}),
        ("refine off", {"focus": {"refine_max_px": 0}}),
        ("refine <= 32 px", {"focus": {"refine_max_px": 32}}),
        ("refine <= 64 px", {"focus": {"refine_max_px": 64}}),
        ("focus off", {"focus": {"enabled": False}}),
        ("4 focus crops", {"focus": {"max_crops": 4}}),
        ("8 focus crops", {"focus": {"max_crops": 8}}),
        ("focus follow-only", {"focus": {"new_object_min_score": 1.0}}),
        ("focus, new objects >= 0.3", {"focus": {"new_object_min_score": 0.3}}),
        ("focus objects <= 40 px", {"focus": {"max_object_px": 40}}),
        ("cloud hints off", {"focus": {"cloud_hints": False}}),
        ("cloud hints 2 s", {"focus": {"hint_ms": 2000}}),
        ("cloud hints >= 0.5", {"focus": {"hint_min_score": 0.5}}),
        ("crops, cloud hints off", {"regions": {"enabled": True}, "focus": {"cloud_hints": False}}),
        ("score lift for life", {"fusion": {"vouch_ms": None}}),
    ]
    for label, updates in policy:
        out.append(
            Variant(
                f"hybrid {default_fps:g} f/s, {label}",
                "hybrid",
                _budget(default_fps, **updates),
                group="policy",
                **common,
            )
        )
    out += focus_run_variants(default_fps, _budget(default_fps), group="policy", **common)
    out.append(
        Variant(
            "hybrid 4 f/s, focus off",
            "hybrid",
            _budget(4.0, focus={"enabled": False}),
            group="policy",
            **common,
        )
    )
    # Crops (the previous release's default) at the other budgets, and the 3 frames/s budget
    # (under 20 % of frames) varied.
    above_default: list[tuple[float, str, dict[str, Any]]] = [
        (1.0, ", crops", {"regions": {"enabled": True}}),
        (3.0, ", crops", {"regions": {"enabled": True}}),
        (4.0, ", crops", {"regions": {"enabled": True}}),
        (8.0, ", crops", {"regions": {"enabled": True}}),
        (3.0, ", box fit at half gain", {"fusion": {"fit_gain": 0.5}}),
    ]
    for fps, label, updates in above_default:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s{label}",
                "hybrid",
                _budget(fps, **updates),
                group="policy",
                **common,
            )
        )
    out.append(
        Variant(
            "oracle 4 f/s, crops",
            "hybrid",
            _budget(4.0, regions={"enabled": True}),
            oracle=True,
            group="policy",
            **common,
        )
    )
    # Fusion without its trust check (`fusion.min_agreement: 0`): the cloud corrects the edge
    # on every camera, also where it misses what the edge plainly sees.
    for fps in BUDGETS:
        config = _budget(fps, fusion={"min_agreement": 0.0})
        out.append(
            Variant(f"hybrid {fps:g} f/s, trust off", "hybrid", config, group=UNTRUSTED, **common)
        )
    # The oracle bound (see `Variant`): a cloud that answers the ground truth, at each budget.
    for fps in BUDGETS:
        out.append(
            Variant(
                f"oracle {fps:g} f/s", "hybrid", _budget(fps), oracle=True, group=ORACLE, **common
            )
        )
    # What-ifs (see `Variant`): crops detected at their own scale (crops on).
    what_if: list[tuple[str, float, dict[str, Any]]] = [
        ("native-scale crops", default_fps, {"native_crops": True}),
        ("native-scale crops", 4.0, {"native_crops": True}),
    ]
    for label, fps, flags in what_if:
        out.append(
            Variant(
                f"hybrid {fps:g} f/s, {label} (what-if)",
                "hybrid",
                _budget(fps, regions={"enabled": True}),
                group="what-if",
                **flags,
                **common,
            )
        )
    return out


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One variant on one scene."""

    scene: SceneData
    run: SimRun
    scores: RunScores


@dataclass(frozen=True)
class Summary:
    """One variant over all scenes: accuracies averaged over scenes, traffic pooled."""

    variant: Variant
    cells: list[Cell]

    def mean(self, metric: Callable[[Cell], float]) -> float:
        """Mean of `metric` over the scenes (NaN skipped)."""
        values = [metric(c) for c in self.cells]
        values = [v for v in values if not math.isnan(v)]
        return float(np.mean(values)) if values else math.nan

    @property
    def frames(self) -> int:
        """Frames simulated in all."""
        return sum(c.scene.n_frames for c in self.cells)

    @property
    def seconds(self) -> float:
        """Seconds of video simulated in all."""
        return sum(c.scene.n_frames / c.scene.fps for c in self.cells)

    @property
    def share(self) -> float:
        """Share of all frames escalated."""
        return sum(c.run.sent for c in self.cells) / max(self.frames, 1)

    @property
    def region_share(self) -> float:
        """Share of escalations sent as crops."""
        sent = sum(c.run.sent for c in self.cells)
        return sum(c.run.sent_regions for c in self.cells) / sent if sent else math.nan

    @property
    def kbytes_per_s(self) -> float:
        """Uplink kilobytes (JPEG or video) sent per second of video."""
        return sum(c.run.bytes_sent for c in self.cells) / 1000.0 / max(self.seconds, 1e-9)

    @property
    def camera_share(self) -> float:
        """The uplink's bytes over those of the cameras' own H.264 streams."""
        stream = sum(c.scene.stream_bytes for c in self.cells)
        return sum(c.run.bytes_sent for c in self.cells) / stream if stream else math.nan

    @property
    def map50(self) -> float:
        """Mean mAP50 over the scenes."""
        return self.mean(lambda c: c.scores.map50)

    @property
    def f1(self) -> float:
        """Mean F1 over the scenes."""
        return self.mean(lambda c: c.scores.f1)

    @property
    def idf1(self) -> float:
        """Mean IDF1 over the scenes."""
        return self.mean(lambda c: c.scores.idf1)

    @property
    def mota(self) -> float:
        """Mean MOTA over the scenes."""
        return self.mean(lambda c: c.scores.mota)

    def _alert_counts(self) -> tuple[int, int, int]:
        matched = missing = unexpected = 0
        for c in self.cells:
            if c.scores.alerts is not None:
                matched += len(c.scores.alerts.matched)
                missing += len(c.scores.alerts.missing)
                unexpected += len(c.scores.alerts.unexpected)
        return matched, missing, unexpected

    @property
    def alert_precision(self) -> float:
        """Matched / observed start events, pooled over the `events` scenes."""
        matched, _, unexpected = self._alert_counts()
        return matched / (matched + unexpected) if matched + unexpected else math.nan

    @property
    def alert_recall(self) -> float:
        """Matched / scripted events, pooled over the `events` scenes."""
        matched, missing, _ = self._alert_counts()
        return matched / (matched + missing) if matched + missing else math.nan

    @property
    def alert_counts(self) -> str:
        """`matched/expected (+unexpected)`."""
        matched, missing, unexpected = self._alert_counts()
        return f"{matched}/{matched + missing} (+{unexpected})"

    @property
    def loop_ms(self) -> float:
        """Mean edge frame-loop time per frame."""
        return float(np.mean([ms for c in self.cells for ms in c.run.loop_ms]))

    @property
    def loop_p95_ms(self) -> float:
        """95th percentile of the edge frame-loop time."""
        return float(np.percentile([ms for c in self.cells for ms in c.run.loop_ms], 95))

    @property
    def encode_ms(self) -> float:
        """Mean JPEG encoding time per sent frame (off the loop in the agent)."""
        values = [ms for c in self.cells for ms in c.run.encode_ms]
        return float(np.mean(values)) if values else math.nan

    def total(self, name: str) -> int:
        """Sum over the scenes of a `SimRun` counter, or of its `FusionTally`'s (`fusion.x`)."""
        owner, _, field_name = name.rpartition(".")
        return int(
            sum(getattr(getattr(c.run, owner) if owner else c.run, field_name) for c in self.cells)
        )


def _f(value: float, digits: int = 3) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def _pct(value: float, digits: int = 1) -> str:
    return "–" if math.isnan(value) else f"{100.0 * value:.{digits}f} %"


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference and not math.isnan(reference) else math.nan


def _label(s: Summary) -> str:
    return f"**{s.variant.name}** (default)" if s.variant.is_default else s.variant.name


def main_table(summaries: Sequence[Summary]) -> str:
    """Averages over scenes, with each accuracy relative to cloud-only."""
    cloud = next(s for s in summaries if s.variant.mode == "cloud")
    edge = next(s for s in summaries if s.variant.mode == "edge")
    lines = [
        "| variant | escalated | as crops | KB/s | of camera | mAP50 | ×cloud | gap closed "
        "| F1 | ×cloud | IDF1 | ×cloud | MOTA | alerts P | alerts R | ×cloud "
        "| edge loop ms (p95) | encode ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|",
    ]
    for s in summaries:
        closed = gap_closed(s.map50, edge.map50, cloud.map50)
        lines.append(
            f"| {_label(s)} | {_pct(s.share)} | {_pct(s.region_share, 0)} "
            f"| {s.kbytes_per_s:.1f} | {_pct(s.camera_share)} "
            f"| {_f(s.map50)} | {_pct(_ratio(s.map50, cloud.map50))} "
            f"| {_pct(closed, 0)} | {_f(s.f1)} | {_pct(_ratio(s.f1, cloud.f1))} "
            f"| {_f(s.idf1)} | {_pct(_ratio(s.idf1, cloud.idf1))} | {_f(s.mota)} "
            f"| {_f(s.alert_precision, 2)} | {_f(s.alert_recall, 2)} "
            f"| {_pct(_ratio(s.alert_recall, cloud.alert_recall))} "
            f"| {s.loop_ms:.1f} ({s.loop_p95_ms:.1f}) | {_f(s.encode_ms, 1)} |"
        )
    return "\n".join(lines)


def per_scene_table(summaries: Sequence[Summary]) -> str:
    """mAP50 / F1 / IDF1 and escalated share of every variant on every scene."""
    scenes = [c.scene.label for c in summaries[0].cells]
    head = " | ".join(f"{label} mAP50 / F1 / IDF1 / sent" for label in scenes)
    lines = [f"| variant | {head} | alerts matched/expected (+unexpected) |"]
    lines.append("|---|" + "---:|" * len(scenes) + "---:|")
    for s in summaries:
        cells = " | ".join(
            f"{c.scores.map50:.3f} / {c.scores.f1:.3f} / {c.scores.idf1:.3f} "
            f"/ {_pct(c.run.sent / c.scene.n_frames, 0)}"
            for c in s.cells
        )
        lines.append(f"| {_label(s)} | {cells} | {s.alert_counts} |")
    return "\n".join(lines)


def fusion_table(summaries: Sequence[Summary]) -> str:
    """What the escalations did: hard frames, budget refusals and fusion outcomes."""
    lines = [
        "| variant | hard frames | refused by budget | sent | answers fused | late "
        "| tracks created (ever reported) | tentative removed | confirmed | reclassified "
        "| rejected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        if s.variant.mode != "hybrid":
            continue
        counts = [str(s.total(n)) for n in ("hard", "refused_budget", "sent", "fusion.answers")]
        counts.append(str(s.total("fusion.late")))
        shown = sum(len(c.run.created_ids & reported_ids(c.run)) for c in s.cells)
        counts.append(f"{s.total('fusion.created')} ({shown})")
        counts += [
            str(s.total(f"fusion.{n}"))
            for n in ("removed", "confirmed", "reclassified", "rejected")
        ]
        lines.append(f"| {_label(s)} | " + " | ".join(counts) + " |")
    return "\n".join(lines)


def gap_closed(hybrid: float, edge: float, cloud: float) -> float:
    """Share of the edge-to-cloud difference the hybrid recovers (NaN when there is none)."""
    gap = cloud - edge
    return (hybrid - edge) / gap if gap > 0 and not math.isnan(hybrid) else math.nan


def gap_interval(hybrid: Summary, edge: Summary, cloud: Summary) -> Interval:
    """The interval of `hybrid`'s mAP50 gap closed over draws of the scenes (paired: one draw
    picks the same scenes for the three)."""
    h, e, c = (np.asarray([x.scores.map50 for x in s.cells]) for s in (hybrid, edge, cloud))

    def closed(draw: npt.NDArray[np.int64]) -> float:
        means = (float(np.nanmean(x[draw])) for x in (h, e, c))
        return gap_closed(*means)

    return scene_bootstrap(len(hybrid.cells), closed)


def default_interval(summaries: Sequence[Summary]) -> Interval | None:
    """`gap_interval` of the default row (None without one)."""
    default = next((s for s in summaries if s.variant.is_default), None)
    if default is None:
        return None
    edge = next(s for s in summaries if s.variant.mode == "edge")
    cloud = next(s for s in summaries if s.variant.mode == "cloud")
    return gap_interval(default, edge, cloud)


def _meets(s: Summary, cloud: Summary) -> bool:
    checks = [
        _ratio(s.map50, cloud.map50) >= TARGET_ACCURACY,
        _ratio(s.f1, cloud.f1) >= TARGET_ACCURACY,
        math.isnan(cloud.alert_recall) or _ratio(s.alert_recall, cloud.alert_recall) >= 0.95,
    ]
    return all(checks) and s.share <= TARGET_SHARE


def verdict(summaries: Sequence[Summary], sure: Interval | None = None) -> str:
    """Where the default sits and which hybrid variants meet the targets; `sure`: the
    default's `default_interval`, when drawn."""
    cloud = next(s for s in summaries if s.variant.mode == "cloud")
    default = next((s for s in summaries if s.variant.is_default), None)
    lines = []
    if default is not None:
        lines.append(
            f"Default ({default.variant.name}, score >= "
            f"{default.variant.escalation.signals.score_threshold:g}, regions "
            f"{'on' if default.variant.escalation.regions.enabled else 'off'}, refresh "
            f"{default.variant.escalation.refresh_interval_s:g} s): escalates "
            f"{_pct(default.share)} of frames, mAP50 {_pct(_ratio(default.map50, cloud.map50))}, "
            f"F1 {_pct(_ratio(default.f1, cloud.f1))}, alert recall "
            f"{_pct(_ratio(default.alert_recall, cloud.alert_recall))} of cloud-only."
        )
    edge = next(s for s in summaries if s.variant.mode == "edge")
    if default is not None:
        below = [
            f"{d.scene.label} ({d.scores.map50:.4f} < {e.scores.map50:.4f})"
            for d, e in zip(default.cells, edge.cells, strict=True)
            if d.scores.map50 < e.scores.map50
        ]
        if sure is not None:
            lines.append(
                f"How sure: the default's gap closed lies in {_pct(sure.low, 0)} to "
                f"{_pct(sure.high, 0)} in {100 * LEVEL:.0f} % of {RESAMPLES} draws of these "
                f"{len(default.cells)} scenes with replacement (`bench.models.resample`); a "
                "target inside that span is not told apart from the default by this set of "
                "scenes."
            )
        lines.append(
            f"Targets at the default ({_pct(default.share)} of frames, "
            f"{_pct(default.camera_share)} of the cameras' own H.264 bytes, "
            f"{_pct(_ratio(default.kbytes_per_s, cloud.kbytes_per_s))} of cloud-only's JPEG "
            "bytes): "
            f"closes {_pct(gap_closed(default.map50, edge.map50, cloud.map50), 0)} of "
            f"the edge→cloud mAP50 gap (target >= 50 %); below edge-only on "
            f"{', '.join(below) if below else 'no preset'}; alert recall "
            f"{_f(default.alert_recall, 2)} vs cloud-only {_f(cloud.alert_recall, 2)}; F1 and "
            f"IDF1 {_pct(_ratio(default.f1, cloud.f1))} and "
            f"{_pct(_ratio(default.idf1, cloud.idf1))} of cloud-only."
        )
    lines.append(
        f"Edge only reaches mAP50 {_pct(_ratio(edge.map50, cloud.map50))}, F1 "
        f"{_pct(_ratio(edge.f1, cloud.f1))}, alert recall "
        f"{_pct(_ratio(edge.alert_recall, cloud.alert_recall))} of cloud-only by itself."
    )
    hybrid = [s for s in summaries if s.variant.mode == "hybrid"]
    real = [s for s in hybrid if s.variant.group != "what-if" and not s.variant.oracle]
    real = [s for s in real if s.share <= TARGET_SHARE]
    if real:
        best = max(real, key=lambda s: s.map50)
        lines.append(
            f"Best hybrid setting (no what-if) within {TARGET_SHARE:.0%} of frames: "
            f"{best.variant.name}: {_pct(best.share)} of frames, mAP50 "
            f"{_pct(_ratio(best.map50, cloud.map50))}, F1 {_pct(_ratio(best.f1, cloud.f1))}, "
            f"IDF1 {_pct(_ratio(best.idf1, cloud.idf1))}, alert recall "
            f"{_pct(_ratio(best.alert_recall, cloud.alert_recall))} of cloud-only."
        )
    if default is not None:
        fps = default.variant.escalation.per_camera_frames_per_s
        oracle = next(
            (s for s in summaries if s.variant.group == ORACLE
             and s.variant.escalation.per_camera_frames_per_s == fps),
            None,
        )  # fmt: skip
        if oracle is not None:
            lines.append(
                f"Oracle bound at the default budget (the same machinery, a cloud that answers "
                f"the ground truth): mAP50 {oracle.map50:.3f} vs {default.map50:.3f} with the "
                f"real cloud and {edge.map50:.3f} edge only; F1 {oracle.f1:.3f} vs "
                f"{default.f1:.3f} and {edge.f1:.3f}. The machinery lifts a perfect cloud's "
                f"frames by {oracle.map50 - edge.map50:+.3f} mAP50 over the edge; the real "
                f"cloud gets {default.map50 - edge.map50:+.3f} of it."
            )
    meeting = [s for s in hybrid if not s.variant.oracle and _meets(s, cloud)]
    if meeting:
        best = min(meeting, key=lambda s: s.share)
        names = ", ".join(s.variant.name for s in meeting)
        lines.append(
            f"Meeting every target (>= {TARGET_ACCURACY:.0%} of cloud mAP50, F1 and alert "
            f"recall at <= {TARGET_SHARE:.0%} of frames): {names}; fewest frames: "
            f"{best.variant.name} ({_pct(best.share)})."
        )
    else:
        lines.append(
            f"No hybrid variant meets every target (>= {TARGET_ACCURACY:.0%} of cloud mAP50, "
            f"F1 and alert recall at <= {TARGET_SHARE:.0%} of frames)."
        )
    return "\n\n".join(lines)


def plot_uplink(summaries: Sequence[Summary], path: Path, title: str = "") -> None:
    """Share of the edge→cloud mAP50 gap closed against the uplink as a share of the cameras'
    own H.264 streams (log scale), every variant, with streaming the cameras to the cloud."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cloud = next(s for s in summaries if s.variant.mode == "cloud" and not s.variant.stream)
    edge = next(s for s in summaries if s.variant.mode == "edge")

    def closed(s: Summary) -> float:
        return 100.0 * gap_closed(s.map50, edge.map50, cloud.map50)

    groups: list[tuple[str, str, str, Callable[[Summary], bool]]] = [
        ("budgets, video uplink", "o-", "tab:blue", lambda s: s.variant.group == "budget"),
        (
            "encodings at the default budget",
            "s",
            "tab:purple",
            lambda s: s.variant.group == "uplink",
        ),
        ("settings (JPEG uplink)", "x", "tab:grey", lambda s: s.variant.group == "policy"),
        ("budgets, trust off (JPEG)", "^", "tab:orange", lambda s: s.variant.group == UNTRUSTED),
        ("stream to cloud / cloud only", "*", "black", lambda s: s.variant.mode == "cloud"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=90)
    for label, style, colour, keep in groups:
        points = [s for s in summaries if keep(s) and not s.variant.oracle and s.camera_share > 0]
        if not points:
            continue
        xs = [100.0 * s.camera_share for s in points]
        ys = [closed(s) for s in points]
        ax.plot(xs, ys, style, color=colour, ms=6, label=label)
        for s, x, y in zip(points, xs, ys, strict=True):
            if s.variant.group in ("budget", "uplink") or s.variant.mode == "cloud":
                ax.annotate(s.variant.name.replace("hybrid ", ""), (x, y), fontsize=6,
                            textcoords="offset points", xytext=(4, -8))  # fmt: skip
    default = next((s for s in summaries if s.variant.is_default), None)
    if default is not None:
        ax.scatter([100.0 * default.camera_share], [closed(default)], marker="*", s=240,
                   color="tab:blue", edgecolor="black", zorder=5, label="default")  # fmt: skip
    ax.axvline(10.0, color="red", ls=":", lw=1, label="10 % of the camera's stream")
    ax.axhline(0.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("uplink, % of the cameras' own H.264 bytes (log)")
    ax.set_ylabel("edge→cloud mAP50 gap closed (%)")
    ax.set_title(title or "gap closed against uplink bytes")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot(summaries: Sequence[Summary], path: Path) -> None:
    """Accuracy relative to cloud-only against the share of frames escalated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cloud = next(s for s in summaries if s.variant.mode == "cloud")
    edge = next(s for s in summaries if s.variant.mode == "edge")
    curves = [
        ([s for s in summaries if s.variant.group == "budget"], "o-", "budgets"),
        ([s for s in summaries if s.variant.group == UNTRUSTED], "s--", "budgets, trust off"),
        ([s for s in summaries if s.variant.group == ORACLE], "d:", "oracle cloud (ceiling)"),
    ]  # fmt: skip
    policy = [s for s in summaries if s.variant.group == "policy" and not s.variant.oracle]
    what_if = [s for s in summaries if s.variant.group == "what-if"]
    metrics: list[tuple[str, Callable[[Summary], float]]] = [
        ("mAP50", lambda s: s.map50),
        ("F1", lambda s: s.f1),
        ("IDF1", lambda s: s.idf1),
        ("alert recall", lambda s: s.alert_recall),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=90)
    for ax, pair in zip(axes, (metrics[:2], metrics[2:]), strict=True):
        for (name, metric), colour in zip(pair, ("tab:blue", "tab:orange"), strict=True):
            ref = metric(cloud)
            for budget, style, label in curves:
                xs = [0.0] + [100.0 * s.share for s in budget]
                ys = [_ratio(metric(edge), ref)] + [_ratio(metric(s), ref) for s in budget]
                ax.plot(xs, ys, style, color=colour, ms=4, label=f"{name}: edge only → {label}")
                for s, x, y in zip(budget, xs[1:], ys[1:], strict=True):
                    text = f"{s.variant.escalation.per_camera_frames_per_s:g}"
                    ax.annotate(text, (x, y), textcoords="offset points", xytext=(3, -10),
                                fontsize=7)  # fmt: skip
            ax.annotate("edge", (0.0, _ratio(metric(edge), ref)), textcoords="offset points",
                        xytext=(3, 4), fontsize=7)  # fmt: skip
            ax.scatter([100.0 * s.share for s in policy],
                       [_ratio(metric(s), ref) for s in policy],
                       marker="x", color=colour, s=25)  # fmt: skip
            ax.scatter([100.0 * s.share for s in what_if],
                       [_ratio(metric(s), ref) for s in what_if],
                       marker="^", facecolor="none", edgecolor=colour, s=30)  # fmt: skip
            default = next((s for s in summaries if s.variant.is_default), None)
            if default is not None:
                ax.scatter([100.0 * default.share], [_ratio(metric(default), ref)], marker="*",
                           s=220, color=colour, edgecolor="black", zorder=5)  # fmt: skip
        ax.axhline(1.0, color="grey", lw=1, label="cloud only (100 % of frames)")
        ax.axhline(TARGET_ACCURACY, color="green", ls="--", lw=1, label="target 95 %")
        ax.axvline(100.0 * TARGET_SHARE, color="red", ls=":", lw=1, label="≤ 20 % of frames")
        ax.set_xlabel("frames escalated (%)   numbers: budget f/s; x: policy; △: what-if")
        ax.set_ylabel("relative to cloud only")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    axes[0].set_title("detection (★ default config)")
    axes[1].set_title("tracking and alerts")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def record_name(variant: Variant) -> str:
    """The variant's name in the JSON results: `default`, `edge_only`, `cloud_only`,
    `oracle_2fps`, ... (lower case, words joined by `_`)."""
    if variant.is_default:
        return "default"
    text = variant.name.replace(" f/s", "fps").replace(">=", "ge").replace("=", "eq")
    return re.sub(r"[^a-z0-9.]+", "_", text.lower()).strip("_")


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def records(summaries: Sequence[Summary]) -> list[dict[str, Any]]:
    """One JSON record per variant: averages, traffic and per-preset values."""
    out = []
    for s in summaries:
        out.append(
            {
                "name": record_name(s.variant),
                "label": s.variant.name,
                "group": s.variant.group,
                "escalated_fraction": _number(s.share),
                "kb_per_s": _number(s.kbytes_per_s),
                "camera_stream_fraction": _number(s.camera_share),
                "map50": _number(s.map50),
                "f1": _number(s.f1),
                "idf1": _number(s.idf1),
                "mota": _number(s.mota),
                "alert_recall": _number(s.alert_recall),
                "alert_precision": _number(s.alert_precision),
                "presets": {
                    c.scene.label: {
                        "map50": _number(c.scores.map50),
                        "f1": _number(c.scores.f1),
                        "idf1": _number(c.scores.idf1),
                        "escalated_fraction": _number(c.run.sent / c.scene.n_frames),
                    }
                    for c in s.cells
                },
            }
        )
    return out


# -- main ---------------------------------------------------------------------------------------


def _scene_specs(text: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split(","):
        preset, _, seed = item.strip().partition(":")
        out.append((preset, int(seed) if seed else 1))
    return out


def main(argv: list[str] | None = None) -> int:
    """Prepare the scenes, simulate every variant, print and write the tables and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", default=None, help=f"preset[:seed],... ({DEFAULT_SCENES})")
    parser.add_argument("--quick", action="store_true", help="100 frames of crowded and events")
    parser.add_argument("--frames", type=int, default=None, help="frames per scene (all)")
    parser.add_argument("--rtt-frames", type=int, default=4, help="round trip in frames (4)")
    parser.add_argument("--cloud-threshold", type=float, default=0.2, help="cloud confidence")
    parser.add_argument("--threads", type=int, default=2, help="detector threads")
    parser.add_argument(
        "--only",
        default=None,
        help="regex: run only the variants it finds in their names (plus edge only, cloud only "
        "and the default, which every table needs); results go to --out as usual",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the .md and .png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    scenes_text = args.scenes or ("crowded,events" if args.quick else DEFAULT_SCENES)
    frames = 100 if args.quick and args.frames is None else args.frames
    scenes = [
        prepare_scene(preset, seed, max_frames=frames, threads=args.threads)
        for preset, seed in _scene_specs(scenes_text)
    ]
    prepared_s = time.perf_counter() - started
    plan = variants(args.rtt_frames, args.cloud_threshold)
    if args.only:
        wanted = re.compile(args.only)
        plan = [
            v
            for v in plan
            if v.group == "reference" or v.is_default or wanted.search(v.name) is not None
        ]
    cells: dict[str, list[Cell]] = {v.name: [] for v in plan}
    computed = crops_computed = 0
    for data in scenes:
        answers = CloudAnswers(data, threads=args.threads)
        crops = EdgeCrops(data, threads=args.threads)
        try:
            for variant in plan:
                run = simulate(data, variant, answers, crops)
                cells[variant.name].append(Cell(data, run, score_run(data, run)))
            answers.save()
        finally:
            computed += answers.computed
            crops_computed += crops.computed
            answers.close()
            crops.close()
    summaries = [Summary(v, cells[v.name]) for v in plan]
    elapsed = time.perf_counter() - started
    command = harness.command_line(__spec__.name, argv)
    settings = (
        f"Scenes: {', '.join(f'{d.label} ({d.n_frames} frames)' for d in scenes)}; round trip "
        f"{args.rtt_frames} frames ({1000.0 * args.rtt_frames / scenes[0].fps:.0f} ms); cloud "
        f"confidence >= {args.cloud_threshold:g}; tracker IoU-only, n_init 2, low score 0.1. "
        f"Wall time {elapsed:.0f} s ({prepared_s:.0f} s preparing scenes and caches, "
        f"{computed} crop requests run on the cloud model, {crops_computed} focus crops on the "
        "edge model)."
    )
    sure = default_interval(summaries)
    document = "\n\n".join(
        [
            f"# Hybrid trade-off\n\n`{command.strip()}`\n\n{settings}",
            "## Averages over scenes (alerts pooled over the `events` scenes)",
            main_table(summaries),
            verdict(summaries, sure),
            "## Per scene",
            per_scene_table(summaries),
            "## Escalation and fusion (sums over scenes)",
            fusion_table(summaries),
        ]
    )
    print(document)
    results = {
        "command": command.strip(),
        "settings": settings,
        "variants": records(summaries),
        "default_gap_closed_interval": None
        if sure is None
        else {"level": LEVEL, "resamples": RESAMPLES, **sure.as_dict()},
    }
    harness.write_results("hybrid_tradeoff", document, results, args.out)
    if not args.no_plot:
        plot(summaries, args.out / "hybrid_tradeoff.png")
        plot_uplink(summaries, args.out / "hybrid_tradeoff_uplink.png")
        print(f"\nplots: {args.out / 'hybrid_tradeoff.png'}, hybrid_tradeoff_uplink.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
