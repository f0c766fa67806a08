"""Fleet-wide rollout time: real `edge-agent run` processes following a signed rollout.

Used by `bench.fleet.fleet_rollout --boxes N`. Each box is a real agent process (its own detector,
tracker, MQTT publisher and `FleetUpdater`) replaying the `events` scene as a live camera at a
low frame rate, with `fleet:` on: the store served by nginx over HTTPS (test CA), rollouts and
status documents on one local Mosquitto. The boxes start on the committed 320x320 INT8 edge
model (the config's own); a rollout at stage `all` then assigns a model from the store, and the
time from publishing the rollout to each box's retained status reporting that model running (the
updater publishes it right after the swap) is measured through the broker, beside each box's own
account of download + warm-up + swap (the `seconds` of its `swapped` event). A second rollout
takes the fleet back to the 320x320 model while the boxes still evaluate the first: each swaps
back to the model it kept, without a download (the instant rollback).

The two models are real exports of the same network: the 320x192 INT8 TFLite made for 16:9
cameras, and the 320x320 one; the agents' detector takes each model's own input size.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.edge._edge_common import MODELS, class_names, ensure_scene
from fleet.broker import BrokerLink, BrokerOptions
from fleet.manifest import ModelManifest, utc_now_iso
from fleet.rollout import Rollout, SignedRollout, rollout_topic, status_filter
from fleet.signing import Signer
from fleet.status import AgentStatus, parse_status
from fleet.store import DirectoryStore
from testbed.alert_check import scene_agent_config
from testbed.broker import LocalBroker, start_broker
from testbed.processes import ManagedProcess

PREFIX = "video-analytics"
GROUP = "default"


@dataclass(frozen=True)
class RolloutRow:
    """One rollout to every box: seconds from the rollout to each box reporting the model."""

    rollout: str
    model: str
    megabytes: float
    boxes: int
    reported: int
    first_s: float
    median_s: float
    all_s: float  # the fleet-wide rollout time: the last box
    swap_median_s: float  # the boxes' own "swapped ... after the rollout" (download + warm + swap)


def _box_config(
    scene: Path, index: int, work: Path, broker: LocalBroker, store_url: str, ca: Path,
    public_b64: str, target_fps: float,
) -> Path:  # fmt: skip
    box = work / f"box-{index}"
    box.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = scene_agent_config(
        scene,
        camera_url=str(scene / "video.mp4"),
        model_path=MODELS["litert-int8"],
        class_names=class_names(),
        mqtt_port=broker.port,
        outbox_path=box / "outbox.db",
        agent_id=f"box-{index}",
        threads=1,
        target_fps=target_fps,
        loop_file=True,
    )
    document["detector"]["input_size"] = None  # each model's own input size
    document["fleet"] = {
        "enabled": True,
        "store_url": store_url,
        "ca_path": str(ca),
        "trusted_keys": [public_b64],
        "groups": [GROUP],
        "state_dir": str(box / "fleet"),
        "status_interval_s": 5.0,
    }
    path = box / "agent.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _statuses(link: BrokerLink, deadline: float, done: Any) -> dict[str, AgentStatus]:
    """Status documents as they come until `done(statuses)` or `deadline`."""
    found: dict[str, AgentStatus] = {}
    while not done(found):
        message = link.next_message(deadline)
        if message is None:
            break
        topic, payload, _ = message
        if payload:
            status = parse_status(payload)
            found[status.agent_id] = status
    return found


def _rollout(
    link: BrokerLink, signer: Signer, manifest: ModelManifest, boxes: Sequence[str], label: str,
    timeout_s: float,
) -> RolloutRow:  # fmt: skip
    ref = manifest.ref
    rollout = Rollout(
        rollout_id=f"bench-{ref.sha256[:12]}",
        group=GROUP,
        model=ref,
        stage="all",
        canary=[],
        issued_at=utc_now_iso(),
        soak_s=0.0,
    )
    started = time.monotonic()
    link.publish(
        rollout_topic(PREFIX, GROUP), SignedRollout.sign(rollout, signer).to_bytes(), retain=True
    )
    reported: dict[str, float] = {}
    swapped: dict[str, float] = {}
    deadline = started + timeout_s
    while len(reported) < len(boxes):
        message = link.next_message(deadline)
        if message is None:
            break
        topic, payload, _ = message
        if not payload:
            continue
        if "/fleet/events/" in topic:
            seconds = _swap_seconds(payload, ref.sha256)
            if seconds is not None:
                swapped[topic.rsplit("/", 1)[1]] = seconds
            continue
        status = parse_status(payload)
        if status.model is not None and status.model.sha256 == ref.sha256:
            reported.setdefault(status.agent_id, time.monotonic() - started)
    times = sorted(reported.values()) or [float("nan")]
    return RolloutRow(
        rollout=label,
        model=str(ref),
        megabytes=round(manifest.bytes / 1e6, 2),
        boxes=len(boxes),
        reported=len(reported),
        first_s=round(times[0], 2),
        median_s=round(statistics.median(times), 2),
        all_s=round(times[-1], 2) if len(reported) == len(boxes) else float("nan"),
        swap_median_s=round(statistics.median(swapped.values()), 2) if swapped else float("nan"),
    )


def _swap_seconds(payload: bytes, sha256: str) -> float | None:
    """The `seconds` of a `swapped` event for model `sha256` (None for any other event)."""
    event = json.loads(payload)
    if event.get("event") != "swapped" or (event.get("model") or {}).get("sha256") != sha256:
        return None
    seconds = (event.get("evidence") or {}).get("seconds")
    return float(seconds) if isinstance(seconds, int | float) else None


def run_fleet(
    work: Path,
    store: DirectoryStore,
    signer: Signer,
    store_url: str,
    ca: Path,
    *,
    boxes: int,
    target_fps: float,
    start_timeout_s: float = 240.0,
    rollout_timeout_s: float = 180.0,
) -> list[RolloutRow]:
    """Start `boxes` agents, roll the 320x192 model out to all, then the 320x320 one."""
    scene = ensure_scene(None)
    names = class_names()
    wide = store.publish(
        MODELS["litert-int8-320x192"], "edge-det", "16x9", signer, classes=names
    ).manifest
    square = store.publish(MODELS["litert-int8"], "edge-det", "square", signer, classes=names)
    broker = start_broker("mosquitto", work / "broker")
    agents: list[ManagedProcess] = []
    try:
        ids = [f"box-{i}" for i in range(boxes)]
        with BrokerLink(BrokerOptions(port=broker.port, timeout_s=20)) as link:
            link.subscribe(status_filter(PREFIX))
            link.subscribe(f"{PREFIX}/fleet/events/+")
            for index in range(boxes):
                config = _box_config(
                    scene, index, work, broker, store_url, ca, signer.public_b64, target_fps
                )
                agent = ManagedProcess(
                    f"box-{index}",
                    [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
                )
                agents.append(agent)
                agent.start(ready_timeout_s=5)
            ready = _statuses(
                link, time.monotonic() + start_timeout_s, lambda found: len(found) >= boxes
            )
            if len(ready) < boxes:
                tails = "\n".join(a.output_tail(5) for a in agents)
                raise RuntimeError(f"only {sorted(ready)} of {boxes} boxes reported:\n{tails}")
            rows = [
                _rollout(link, signer, manifest, ids, label, rollout_timeout_s)
                for manifest, label in (
                    (wide, "to the 320x192 export"),
                    # the boxes are still evaluating the first: this is a roll back to the model
                    # kept on the box, no download
                    (square.manifest, "back to the 320x320 one (kept on the box)"),
                )
            ]
            link.publish(rollout_topic(PREFIX, GROUP), b"", retain=True)
    finally:
        for agent in agents:
            agent.stop(term_timeout_s=15)
        broker.stop()
    return rows


def fleet_table(rows: Sequence[RolloutRow]) -> str:
    """Markdown table of the fleet-wide rollouts."""
    lines = [
        "| rollout | model | MB | boxes reporting it | first s | median s | all boxes s "
        "| swap median s (box's own) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.rollout} | `{r.model}` | {r.megabytes} | {r.reported}/{r.boxes} | {r.first_s} "
            f"| {r.median_s} | {r.all_s} | {_cell(r.swap_median_s)} |"
        )
    return "\n".join(lines)


def _cell(value: float) -> str:
    return "–" if value != value else f"{value}"  # NaN: the boxes sent no `swapped` event
