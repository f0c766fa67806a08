"""Accuracy of the project's models on held-out generated scenes, one test set per scenario.

Used by `testbed.build_models` (the numbers in the manifest) and `bench/models/model_accuracy.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.scenes.dataset import DatasetConfig, write_dataset

logger = logging.getLogger(__name__)

SCENARIOS: tuple[str, ...] = ("quiet", "crowded", "small_far", "events")


@dataclass(frozen=True)
class ModelUnderTest:
    """A model file and the square input size it is evaluated at (`letterbox: fit`: a
    dynamic-shape model takes each image at its fitted rectangle within that square)."""

    label: str
    path: Path
    imgsz: int
    letterbox: Literal["fit", "fixed"] = "fixed"


@dataclass(frozen=True)
class AccuracyRow:
    """One model on one scenario."""

    model: str
    scenario: str
    map50_95: float
    map50: float
    small_map50: float
    small_recall: float
    recall: float
    num_gt: int
    num_small_gt: int


def write_test_sets(
    root: Path, cache_dir: Path, seed: int, scenes: int, frames_per_scene: int, every: int
) -> dict[str, Path]:
    """One held-out YOLO test set per scenario (seeds disjoint from training); returns YAMLs."""
    sets = {}
    for scenario in SCENARIOS:
        data_yaml = root / scenario / "data.yaml"
        if not data_yaml.is_file():
            config = DatasetConfig(
                scenes_per_split=(0, 0, scenes),
                frames_per_scene=frames_per_scene,
                every_n_frames=every,
                seed=seed,
                presets=(scenario,),
            )
            write_dataset(config, root / scenario, cache_dir)
        sets[scenario] = data_yaml
    return sets


def evaluate_all(models: list[ModelUnderTest], test_sets: dict[str, Path]) -> list[AccuracyRow]:
    """Every model on every scenario's test split."""
    from detection.toolchain.dataset import load_dataset
    from detection.toolchain.evaluate import evaluate_model

    rows = []
    for scenario, data_yaml in test_sets.items():
        dataset = load_dataset(data_yaml, split="test")
        for model in models:
            result = evaluate_model(model.path, dataset, model.imgsz, model.letterbox)
            rows.append(
                AccuracyRow(
                    model=model.label,
                    scenario=scenario,
                    map50_95=result.overall.map50_95,
                    map50=result.overall.map50,
                    small_map50=result.small.map50,
                    small_recall=result.small.recall,
                    recall=result.overall.recall,
                    num_gt=result.overall.num_gt,
                    num_small_gt=result.small.num_gt,
                )
            )
            logger.info("%s on %s: mAP50 %.3f", model.label, scenario, result.overall.map50)
    return rows


def markdown_table(rows: list[AccuracyRow]) -> str:
    """The accuracy table: a row per scenario and model."""
    lines = [
        "| scenario | model | mAP50-95 | mAP50 | recall@0.25 | small mAP50 | small recall "
        "| GT (small) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.model} | {r.map50_95:.3f} | {r.map50:.3f} | {r.recall:.3f} | "
            f"{r.small_map50:.3f} | {r.small_recall:.3f} | {r.num_gt} ({r.num_small_gt}) |"
        )
    return "\n".join(lines)
