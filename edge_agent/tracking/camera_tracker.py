"""`CameraTracker`: one camera's DeepSORT tracker together with its appearance embedder.

The pipeline, the tracking evaluation and the benchmarks all drive tracking through this class,
so the way embeddings are computed (every box, or only the ones matching needs) lives in one place.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from detection.class_groups import GroupKeys
from detection.detections import Detections
from edge_agent.config.tracker import TrackerConfig
from edge_agent.tracking.embedders import Embedder, Float32Array, NoEmbedder
from edge_agent.tracking.fused_tracker import FusedTracker
from edge_agent.tracking.tracker import FollowFunction

EmbedPolicy = Literal["all", "ambiguous"]


class CameraTracker:
    """Tracks the detections of one camera, frame after frame.

    `embed_policy`: `all` embeds every box; `ambiguous` lets the tracker ask only for the
    boxes whose match depends on appearance, plus periodic gallery refreshes
    (`DeepSortTracker.certain_pairs`). `embedded_boxes` counts the boxes embedded so far.
    """

    def __init__(
        self,
        tracker: FusedTracker,
        embedder: Embedder | None = None,
        embed_policy: EmbedPolicy = "all",
    ) -> None:
        if embed_policy not in ("all", "ambiguous"):
            raise ValueError(f"embed_policy must be 'all' or 'ambiguous', got {embed_policy!r}")
        self.tracker = tracker
        self.embedder: Embedder = embedder if embedder is not None else NoEmbedder()
        self.embed_policy: EmbedPolicy = embed_policy
        self.embedded_boxes = 0  # boxes the embedder was run on, for metrics and benchmarks

    @classmethod
    def from_config(
        cls,
        config: TrackerConfig,
        confidence_threshold: float,
        embedder: Embedder | None = None,
        class_keys: GroupKeys | None = None,
    ) -> CameraTracker:
        """A tracker with the `tracker:` settings, the given embedder (none: IoU only) and the
        detector's class groups (`class_keys`; see `DeepSortTracker.from_config`)."""
        return cls(
            FusedTracker.from_config(config, confidence_threshold, class_keys),
            embedder,
            config.embed_policy,
        )

    def update(
        self,
        frame: npt.NDArray[np.uint8],
        detections: Detections,
        may_start: npt.NDArray[np.bool_] | None = None,
        steps: int = 1,
        follow: FollowFunction | None = None,
    ) -> Detections:
        """Advance one frame; returns `detections` with `tracker_id` filled in (-1: untracked).

        `may_start`: which detections may start a track; `steps`: camera frame intervals since
        the last update; `follow`: moves cloud-held tracks by optical flow (see
        `DeepSortTracker.update`); held boxes that left the frame are not reported."""
        size = (int(frame.shape[1]), int(frame.shape[0])) if frame.ndim >= 2 else None
        if isinstance(self.embedder, NoEmbedder) or not len(detections):
            return self.tracker.update(
                detections, may_start=may_start, steps=steps, follow=follow, frame_size=size
            )
        if self.embed_policy == "all":
            embeddings = self.embedder.embed(frame, detections.xyxy)
            self.embedded_boxes += len(detections)
            return self.tracker.update(
                detections,
                embeddings,
                may_start=may_start,
                steps=steps,
                follow=follow,
                frame_size=size,
            )

        def embed(indices: list[int]) -> Float32Array | None:
            if not indices:
                return None
            self.embedded_boxes += len(indices)
            return self.embedder.embed(frame, detections.xyxy[indices])

        return self.tracker.update(
            detections,
            embed=embed,
            may_start=may_start,
            steps=steps,
            follow=follow,
            frame_size=size,
        )


def observed(tracked: Detections, detections: Detections) -> Detections:
    """The rows of `tracked` that are this frame's own detections, without the tracks reported
    only because the cloud vouched for them (which sit at predicted boxes). Rules run on these:
    an alert must come from a position something actually saw."""
    return tracked[: len(detections)]
