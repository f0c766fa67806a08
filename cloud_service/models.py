"""The models a service answers with: a stable one, a candidate taking a share, swapped live.

* `TrafficSplit` decides, from a stable hash, whether a frame goes to the candidate: by agent
  (every frame of one agent on the same side, so its tracks see one model) or by frame. The same
  agent stays on the same side across replicas and restarts while the share is unchanged, and a
  larger share only moves agents from stable to candidate, never back.
* `ServedModel` is one model: a `ScaleAwareDetector` with the `ModelInfo` its answers report.
* `ModelTable` holds the `ServedModel`s and hands them out per batch (`checkout` / `release`).
  `replace` swaps in new models at once: batches already running finish on the old ones, which
  are closed when the last of those batches releases them. No frame waits for a load (the new
  models are loaded and warmed before `replace`) and none is dropped.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from cloud_service.decoders.base import BgrImage
    from detection.detections import Detections

logger = logging.getLogger(__name__)

AssignBy = Literal["agent", "frame"]
_HASH_SPACE = 2**64


class ScaleAwareDetector(Protocol):
    """A detector that can be told per image not to enlarge it (`detection.Detector`).

    The processor passes `scale_up=False` for region crops so they run at native scale, and
    True for whole frames. A detector whose `detect` takes no `scale_up` keyword still works
    (`cloud_service.processor` wraps it), but its region crops are enlarged to the model input
    like whole frames.
    """

    def detect(
        self, images: Sequence[BgrImage], *, scale_up: bool | Sequence[bool] = True
    ) -> list[Detections]:
        """One `Detections` per image, in order; `scale_up`: one flag, or one per image."""
        ...


@dataclass(frozen=True)
class ModelInfo:
    """What the results report about the model: name, version and class names by class id."""

    name: str
    version: str
    class_names: tuple[str, ...] = field(default=())


def _no_version() -> str | None:
    return None


def _nothing() -> None:
    return None


@dataclass(eq=False)
class ServedModel:
    """One model: its detector, what its answers report, and how to release it.

    `answered_version` tells the version that answered the detector's last call where the engine
    knows it (Triton picks the version by its policy); None falls back to `info.version`.
    """

    detector: ScaleAwareDetector
    info: ModelInfo
    answered_version: Callable[[], str | None] = field(default=_no_version)
    close: Callable[[], None] = field(default=_nothing)

    def version(self) -> str:
        """The version to report for the frames of the last call."""
        return self.answered_version() or self.info.version


def split_point(key: str) -> float:
    """`key` hashed to [0, 1), the same on every machine and run (BLAKE2b, not `hash()`)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _HASH_SPACE


@dataclass(frozen=True)
class TrafficSplit:
    """Which frames the candidate answers: `share` of the agents (or of the frames)."""

    share: float
    assign_by: AssignBy = "agent"

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be within 0..1, got {self.share}")

    def to_candidate(self, agent_id: str, camera_id: str, frame_id: int) -> bool:
        """Whether this frame goes to the candidate."""
        key = agent_id if self.assign_by == "agent" else f"{agent_id}\0{camera_id}\0{frame_id}"
        return split_point(key) < self.share


FrameKey = tuple[str, str, int]  # (agent_id, camera_id, frame_id)


class ModelTable:
    """The stable model, an optional candidate with its split, swappable while serving."""

    def __init__(
        self,
        stable: ServedModel,
        candidate: ServedModel | None = None,
        split: TrafficSplit | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._in_use: dict[int, int] = {}
        self._retired: dict[int, ServedModel] = {}
        self._set(stable, candidate, split)

    def _set(
        self, stable: ServedModel, candidate: ServedModel | None, split: TrafficSplit | None
    ) -> None:
        if (candidate is None) != (split is None):
            raise ValueError("a candidate needs a split and a split needs a candidate")
        self._stable, self._candidate, self._split = stable, candidate, split

    @property
    def models(self) -> list[ServedModel]:
        """The current models, stable first."""
        with self._lock:
            return [m for m in (self._stable, self._candidate) if m is not None]

    def checkout(self, frames: Sequence[FrameKey]) -> list[ServedModel]:
        """The model for each frame; each returned model stays open until `release`d."""
        with self._lock:
            chosen = [self._pick(*frame) for frame in frames]
            for model in {id(m): m for m in chosen}.values():
                self._in_use[id(model)] = self._in_use.get(id(model), 0) + 1
        return chosen

    def _pick(self, agent_id: str, camera_id: str, frame_id: int) -> ServedModel:
        if self._candidate is not None and self._split is not None:
            if self._split.to_candidate(agent_id, camera_id, frame_id):
                return self._candidate
        return self._stable

    def release(self, models: Sequence[ServedModel]) -> None:
        """Give back what `checkout` returned; closes retired models nobody uses any more."""
        to_close = []
        with self._lock:
            for model in {id(m): m for m in models}.values():
                left = self._in_use.get(id(model), 0) - 1
                if left > 0:
                    self._in_use[id(model)] = left
                    continue
                self._in_use.pop(id(model), None)
                retired = self._retired.pop(id(model), None)
                if retired is not None:
                    to_close.append(retired)
        for model in to_close:
            self._close(model)

    def replace(
        self,
        stable: ServedModel,
        candidate: ServedModel | None = None,
        split: TrafficSplit | None = None,
    ) -> None:
        """Answer with these models from the next batch on; close the old ones once idle.

        A model passed again (the same object) stays open.
        """
        to_close = []
        with self._lock:
            old = [m for m in (self._stable, self._candidate) if m is not None]
            self._set(stable, candidate, split)
            keep = {id(stable), id(candidate)}
            for model in old:
                if id(model) in keep:
                    continue
                if self._in_use.get(id(model), 0) > 0:
                    self._retired[id(model)] = model
                else:
                    to_close.append(model)
        for model in to_close:
            self._close(model)
        logger.info(
            "now answering with %s",
            ", ".join(f"{m.info.name}:{m.version()}" for m in self.models),
        )

    def close(self) -> None:
        """Close every model (the service is stopping; no batch runs any more)."""
        with self._lock:
            models = [m for m in (self._stable, self._candidate) if m is not None]
            models += list(self._retired.values())
            self._retired.clear()
        for model in models:
            self._close(model)

    @staticmethod
    def _close(model: ServedModel) -> None:
        try:
            model.close()
        except Exception:  # a failing close must not stop the others
            logger.exception("closing model %s:%s failed", model.info.name, model.info.version)
