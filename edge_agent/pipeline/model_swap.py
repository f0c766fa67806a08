"""Swapping the edge detector on a reload: load aside, check, swap between frames, roll back.

A reload whose `detector:` section changed (a new model file, e.g. one distilled for this site)
goes through these steps:

1. `prepare_detector` loads the new model outside the frame loop (the reload's own thread), runs
   it once on a blank frame and checks that it names the same classes as the running one (rules,
   fusion and media name classes; a model with other classes needs a restart). A model that does
   not load or fails the check refuses the reload: the running model stays, nothing else changes.
2. The frame loop swaps it in between two batches: no frame waits for the load, none is dropped.
3. `Probation` keeps the previous detector loaded for the new one's first batches. A detector
   failure in that window swaps the previous one back (the roll-back), logged and counted in
   `edge_agent_model_swaps_total{outcome="rolled_back"}`; after it the previous one is closed.

The model in use is reported by `ModelIdentity` (name and version from the model's metadata,
else its file stem and "1") in every camera's status document and in
`edge_agent_model_info{model, version, runtime}`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detection.config import DetectorConfig
from detection.detector import Detector
from detection.letterbox import PAD_VALUE
from detection.model_metadata import model_file_of, model_identity
from edge_agent.config import EdgeAgentConfig
from edge_agent.pipeline.reload import ReloadRefused

logger = logging.getLogger(__name__)

PROBATION_BATCHES = 50
_BLANK_SIZE = 320


@dataclass(frozen=True)
class ModelIdentity:
    """The model a detector runs: name, version and runtime type."""

    name: str
    version: str
    runtime: str
    sha256: str | None = None  # the artifact's digest, where the fleet updater knows it

    @classmethod
    def of(cls, detector: Detector, config: DetectorConfig) -> ModelIdentity:
        """From the model's metadata, else its file stem and "1"."""
        found = model_file_of(config.runtime)
        stem: Path | None = found[1] if found is not None else None
        name, version = model_identity(detector.metadata, stem, None, None)
        return cls(name=name, version=version, runtime=config.runtime.type)

    def document(self) -> dict[str, str]:
        """As it appears in a status document."""
        document = {"name": self.name, "version": self.version, "runtime": self.runtime}
        if self.sha256 is not None:
            document["sha256"] = self.sha256
        return document

    def __str__(self) -> str:
        return f"{self.name}:{self.version} on {self.runtime}"


def effective_detector_config(config: EdgeAgentConfig) -> DetectorConfig:
    """The detector config the agent runs: detections kept down to the tracker's low-score
    threshold (its ByteTrack-style second pass), the tracker starting tracks only above the
    detector's own threshold."""
    low = config.tracker.low_score_threshold
    if low is None:
        return config.detector
    return config.detector.model_copy(update={"confidence_threshold": low})


def load_detector(config: EdgeAgentConfig) -> Detector:
    """The configured detector, loaded (see `effective_detector_config`)."""
    return Detector.from_config(effective_detector_config(config))


def prepare_detector(config: EdgeAgentConfig, running: Detector) -> Detector:
    """Load `config`'s detector, run it once, and check it can replace `running`.

    Raises `ReloadRefused` (with the reason) when it does not load, fails on a blank frame, or
    names other classes than `running`; nothing is left open then.
    """
    try:
        detector = load_detector(config)
    except Exception as exc:  # any load failure refuses the reload, the running model stays
        raise ReloadRefused(f"the new model did not load, the running one stays: {exc}") from exc
    try:
        height, width = detector.input_shape
        blank = np.full((height or _BLANK_SIZE, width or _BLANK_SIZE, 3), PAD_VALUE, dtype=np.uint8)
        detector.detect([blank])
        if tuple(detector.class_names) != tuple(running.class_names):
            raise ReloadRefused(
                f"the new model names classes {list(detector.class_names)[:6]}..., the running "
                f"one {list(running.class_names)[:6]}...; a model with other classes needs a "
                "restart (rules, fusion and media name classes)"
            )
    except ReloadRefused:
        detector.close()
        raise
    except Exception as exc:
        detector.close()
        raise ReloadRefused(
            f"the new model failed on a blank frame, the running one stays: {exc}"
        ) from exc
    return detector


class Probation:
    """The previous detector, kept loaded until the new one has run `batches` batches."""

    def __init__(
        self,
        previous: Detector,
        previous_config: DetectorConfig,
        previous_identity: ModelIdentity,
        batches: int = PROBATION_BATCHES,
    ) -> None:
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        self.previous = previous
        self.previous_config = previous_config
        self.previous_identity = previous_identity
        self.left = batches

    def passed_batch(self) -> bool:
        """Count one successful batch of the new detector; True once probation is over."""
        self.left -= 1
        return self.left <= 0
