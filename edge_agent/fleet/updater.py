"""`FleetUpdater`: the agent follows its rollouts, verifies, swaps, and rolls back on evidence.

Its own thread and its own paho client (the alert publisher's connection settings through
`configure_client`, its own client id) subscribe to the retained rollout topics of the box's
groups (`{prefix}/fleet/rollouts/{group}`). paho is the MQTT client the agent already uses; the
store is read by `fleet.download` (standard-library HTTP with Range resume), signatures checked
by `fleet.signing` (pyca/cryptography Ed25519).

For each rollout that assigns this box a model, in this order, and nothing loads before step 3:
1. the rollout's signature (a trusted key), then the manifest's, fetched from the store; the
   manifest must name the rollout's digest, the running detector's runtime type and classes,
   else the update is refused with one log line and an event, and the digest is never tried
   again (`rejected`);
2. the artifact is downloaded (resumed after a cut) within the disk budget and its sha256
   checked (`fleet.download`);
3. the trial is written to `state.json` (a power cut from here on boots on the model before
   it), then the swap goes through `EdgeAgent.request_reload`: the new model loads, warms and
   has its classes checked off the frame loop, and is swapped between two batches;
4. the evidence (`edge_agent.fleet.evidence`) compares the new model's live window with the old
   model's window before the swap; past a threshold the old model is swapped back, the digest
   rejected, a `rolled_back` event published; else the model is kept (`promoted`).
A halted rollout (or one that no longer assigns this box its model) swaps the previous model
back (`reverted`). Every decision is an event on `{prefix}/fleet/events/{agent}`, the retained
`{prefix}/fleet/status/{agent}` says where the box stands, and `edge_agent_fleet_*` count.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from detection.config import DetectorConfig
from detection.detector import Detector
from edge_agent.alerts.connection import configure_client
from edge_agent.alerts.payload import iso_utc
from edge_agent.config import EdgeAgentConfig
from edge_agent.fleet.boot import detector_for
from edge_agent.fleet.evidence import EvidenceLog, Sample, Verdict, judge
from edge_agent.fleet.live import totals_of
from edge_agent.fleet.state import FleetState, ModelRecord, Trial, file_sha256, save_state
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline import EdgeAgent
from edge_agent.pipeline.model_swap import ModelIdentity
from edge_agent.pipeline.reload import ReloadRefused
from fleet.download import ArtifactMismatch, BudgetExceeded, Downloader, DownloadError
from fleet.manifest import RUNTIME_DETECTOR_TYPE, ManifestError, ModelManifest, ModelRef
from fleet.rollout import Rollout, SignedRollout, desired, events_topic, rollout_topic, status_topic
from fleet.signing import SignatureError, Verifier

__all__ = ["FleetUpdater"]

logger = logging.getLogger(__name__)

_TICK_S = 0.5
_SAMPLE_EVERY_S = 1.0
_RELOAD_TIMEOUT_S = 120.0
_MAX_REJECTED = 256


@dataclass
class _Swap:
    """The trial running now: when it swapped in, and the old model's window before it."""

    record: ModelRecord
    rollout: Rollout
    swapped_s: float  # the live window starts here
    baseline_end_s: float  # the old model's window ends here (the warm-up is in neither)


class FleetUpdater:
    """See the module docstring. `start` after the agent has started; `close` before it closes."""

    def __init__(
        self,
        agent: EdgeAgent,
        own_detector: DetectorConfig,
        state: FleetState,
        *,
        environ: Mapping[str, str] | None = None,
        metrics: EdgeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`own_detector`: the config file's detector (the model used when no fleet model is
        kept); `state`: as `boot.boot_config` left it (the running model is its `current`)."""
        config: EdgeAgentConfig = agent.config
        self.agent = agent
        self.settings = config.fleet
        self.agent_id = config.agent.id
        self.site = config.agent.site
        self.prefix = config.mqtt.topic_prefix
        self.own_detector = own_detector
        self.state = state
        self.metrics = metrics
        self._clock = clock
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)  # fails here, not later
        self._verifier = Verifier(self.settings.trusted_keys)
        self._downloader = Downloader(
            self.settings.store_url or "",
            self.settings.state_dir / "models",
            ca_path=self.settings.ca_path,
            timeout_s=self.settings.download_timeout_s,
            budget_bytes=int(self.settings.disk_budget_mb * 1024 * 1024),
        )
        own = model_path_of(own_detector)
        self._own_sha = file_sha256(own) if own is not None and own.is_file() else None
        self._evidence = EvidenceLog(keep_s=2 * self.settings.evidence.window_s + 10.0)
        self._rollouts: dict[str, Rollout] = {}
        self._inbox: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._swap: _Swap | None = None
        self._status = "idle"
        self._detail = "no rollout for this box yet"
        self._desired: ModelRef | None = None
        self._retry_at: float | None = None
        self._next_status_s = 0.0
        self._next_sample_s = 0.0
        self._mqtt5 = config.mqtt.protocol == "5"
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{config.mqtt_client_id}-fleet",
            protocol=mqtt.MQTTv5 if self._mqtt5 else mqtt.MQTTv311,
        )
        configure_client(self.client, config.mqtt, environ)
        self.client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self._host, self._port, self._keepalive = (
            config.mqtt.host,
            config.mqtt.port,
            config.mqtt.keepalive_s,
        )
        current = state.current
        if current is not None and model_path_of(agent.config.detector) != Path(current.path):
            logger.error("fleet: %s is not what runs (it did not load); forgetting it", current)
            self._save(state.model_copy(update={"current": None}))
        agent.set_identifier(self.identify)
        self._show_model()

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (in the background) and start the updater's thread."""
        self.client.connect_async(self._host, self._port, self._keepalive)
        self.client.loop_start()
        self._thread = threading.Thread(target=self._run, name="fleet-updater", daemon=True)
        self._thread.start()
        logger.info(
            "fleet: following groups %s on %s; running %s",
            ", ".join(self.settings.groups),
            self.settings.store_url,
            self._running_label(),
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (an update in progress finishes its current step) and disconnect."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.client.disconnect()
        self.client.loop_stop()

    def keep_model(self, config: EdgeAgentConfig) -> EdgeAgentConfig:
        """`config` (a reload's, read from the file) running the fleet model that runs now."""
        return config.model_copy(
            update={"detector": detector_for(config.detector, self._running())}
        )

    # ---- naming models ---------------------------------------------------------------------

    def identify(self, detector: Detector, config: DetectorConfig) -> ModelIdentity:
        """The fleet's name, version and digest for a fleet model's file; the model's own
        metadata (and the file's digest) for the config's model."""
        path = model_path_of(config)
        for record in self._records():
            if path is not None and Path(record.path) == path:
                return ModelIdentity(
                    record.name, record.version, config.runtime.type, record.sha256
                )
        own = ModelIdentity.of(detector, config)
        return ModelIdentity(own.name, own.version, own.runtime, self._own_sha)

    def _records(self) -> list[ModelRecord]:
        state = self.state
        found = [r for r in (state.current, state.previous) if r is not None]
        if state.trial is not None:
            found.append(state.trial.model)
        return found

    # ---- MQTT (paho's thread) --------------------------------------------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.ConnectFlags,
        reason: ReasonCode,
        _properties: Any,
    ) -> None:
        if reason.is_failure:
            logger.warning("fleet: the broker refused the connection: %s", reason)
            return
        topics = [(rollout_topic(self.prefix, group), 1) for group in self.settings.groups]
        client.subscribe(topics)
        self._next_status_s = 0.0  # republish the status on every (re)connect

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        self._inbox.put((message.topic, bytes(message.payload)))

    # ---- the updater's thread --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                topic, payload = self._inbox.get(timeout=_TICK_S)
            except queue.Empty:
                pass
            else:
                try:
                    self._on_rollout(topic, payload)
                except Exception:  # the updater must outlive any one bad input
                    logger.exception("fleet: handling %s failed", topic)
            try:
                self._tick()
            except Exception:
                logger.exception("fleet: updater step failed")

    def _tick(self) -> None:
        now = self._clock()
        if now >= self._next_sample_s:
            now = self._sample()
            if self._swap is not None:
                self._evaluate(now)
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            self._reconcile()
        if now >= self._next_status_s:
            self._publish_status()

    def _sample(self) -> float:
        """Take a sample of the live totals now; its time."""
        now = self._clock()
        self._next_sample_s = now + _SAMPLE_EVERY_S
        self._evidence.observe(Sample(now, totals_of(self.agent)))
        return now

    def _on_rollout(self, topic: str, payload: bytes, *, act: bool = True) -> None:
        """Take the rollout `payload` of `topic` in; with `act`, act on the groups' rollouts."""
        group = next(
            (g for g in self.settings.groups if rollout_topic(self.prefix, g) == topic), None
        )
        if group is None:
            return
        if not payload:
            self._rollouts.pop(group, None)
            logger.info("fleet: the rollout of group %s was cleared; the model stays", group)
            return
        try:
            rollout = SignedRollout.parse(payload).verified(self._verifier)
        except (ManifestError, SignatureError) as exc:
            self._refuse(None, f"rollout on {topic} refused: {exc}")
            return
        if rollout.group != group:
            self._refuse(
                rollout.model,
                f"rollout {rollout.rollout_id} names group {rollout.group!r} but came on {topic}",
                reject=False,  # the rollout is at fault, not the model it names
            )
            return
        self._rollouts[group] = rollout
        logger.info(
            "fleet: rollout %s of group %s: %s at stage %s",
            rollout.rollout_id,
            group,
            rollout.model,
            rollout.stage,
        )
        if act:
            self._reconcile()

    def _take_pending(self) -> bool:
        """Take in the rollouts that came meanwhile (without acting); whether any did."""
        taken = False
        while True:
            try:
                topic, payload = self._inbox.get_nowait()
            except queue.Empty:
                return taken
            self._on_rollout(topic, payload, act=False)
            taken = True

    # ---- deciding --------------------------------------------------------------------------

    def _target(self) -> tuple[ModelRef, Rollout] | None:
        for group in self.settings.groups:
            rollout = self._rollouts.get(group)
            if rollout is None:
                continue
            ref = desired(rollout, self.agent_id)
            if ref is not None:
                return ref, rollout
        return None

    def _withdrawn(self) -> Rollout | None:
        """A rollout of one of the groups that assigns the model running here to nobody now
        (halted, or moved on without this box)."""
        running = self._running_sha()
        for rollout in self._rollouts.values():
            if rollout.model.sha256 == running and desired(rollout, self.agent_id) is None:
                return rollout
        return None

    def _reconcile(self) -> None:
        target = self._target()
        self._desired = target[0] if target is not None else None
        if target is None:
            withdrawn = self._withdrawn()
            if withdrawn is not None and self._running_is_fleet():
                self._revert(withdrawn)
            self._publish_status()
            return
        ref, rollout = target
        if ref.sha256 in self.state.rejected:
            self._set(
                "rolled_back" if self._status == "rolled_back" else "refused",
                f"{ref} was rejected on this box before; it is not tried again",
            )
            return
        if self._swap is not None:
            if self._swap.record.sha256 == ref.sha256:
                return  # on trial already
            self._roll_back(f"rollout {rollout.rollout_id} now wants {ref}", "halted")
        if self._running_sha() == ref.sha256:
            self._set("idle", f"running {ref} as rollout {rollout.rollout_id} wants")
            return
        self._update(ref, rollout)

    # ---- updating --------------------------------------------------------------------------

    def _update(self, ref: ModelRef, rollout: Rollout) -> None:
        started = self._clock()
        self._set("downloading", f"fetching the manifest of {ref}")
        try:
            signed = self._downloader.manifest(ref.name, ref.version)
            self._set("verifying", f"checking the manifest of {ref}")
            manifest = signed.verified(self._verifier)
        except (ManifestError, SignatureError) as exc:
            self._refuse(ref, f"manifest of {ref} refused: {exc}")
            return
        except DownloadError as exc:
            self._retry(f"manifest of {ref}: {exc}")
            return
        problem = self._mismatch(manifest, ref)
        if problem is not None:
            self._refuse(ref, problem)
            return
        self._event("verified", ref, "manifest signed by a trusted key", rollout)
        record = ModelRecord(
            name=ref.name,
            version=ref.version,
            sha256=ref.sha256,
            path=self._downloader.final_path(manifest),
            runtime=self.own_detector.runtime.type,
        )
        self._save(self.state.model_copy(update={"pending": record}))
        self._set("downloading", f"downloading {ref} ({manifest.bytes} bytes)")
        try:
            path = self._downloader.artifact(manifest, keep=self.state.keep())
        except ArtifactMismatch as exc:  # the store serves other bytes: not a network hiccup
            self._refuse(ref, f"artifact of {ref} refused: {exc}")
            return
        except BudgetExceeded as exc:  # a bigger disk_budget_mb and a restart try again
            self._refuse(ref, f"{ref} refused: {exc}", reject=False)
            return
        except DownloadError as exc:
            self._retry(f"artifact of {ref}: {exc}")
            return
        record = record.model_copy(update={"path": path})
        self._count("downloaded")
        self._event("downloaded", ref, f"{manifest.bytes} bytes, sha256 checked", rollout)
        if self._take_pending():  # a download takes a while: a halt may have come meanwhile
            target = self._target()
            if target is None or target[0] != ref:
                logger.info("fleet: %s is no longer wanted here; not swapped in", ref)
                self._save(self.state.model_copy(update={"pending": None}))
                self._reconcile()
                return
            rollout = target[1]
        self._swap_in(record, rollout, started)

    def _mismatch(self, manifest: ModelManifest, ref: ModelRef) -> str | None:
        if manifest.ref != ref:
            return f"the store's manifest names {manifest.ref}, the rollout {ref}"
        running = self.agent.config.detector.runtime.type
        if RUNTIME_DETECTOR_TYPE.get(manifest.runtime) != running:
            return (
                f"{ref} runs on {manifest.runtime}, this box's detector on {running}: refused "
                "(a model for another runtime needs another detector section)"
            )
        names = list(self.agent.detector.class_names)
        if manifest.classes and names and manifest.classes != names:
            return (
                f"{ref} names classes {manifest.classes[:6]}..., the running detector "
                f"{names[:6]}...: refused (rules, fusion and media name classes)"
            )
        return None

    def _swap_in(self, record: ModelRecord, rollout: Rollout, started: float) -> None:
        attempts = dict(self.state.attempts)
        tries = attempts.get(record.sha256, 0) + 1
        if tries > self.settings.max_boot_attempts:
            self._refuse(
                _ref(record),
                f"{record} was on trial {tries - 1} time(s) when the box restarted; not again",
            )
            return
        attempts[record.sha256] = tries
        trial = Trial(model=record, rollout_id=rollout.rollout_id, started_at=iso_utc(time.time()))
        self._save(self.state.model_copy(update={"trial": trial, "attempts": attempts}))
        self._set("warming", f"loading and warming {record}")
        before = self._sample()  # the download may have held up the updater's samples
        if not self._reload(detector_for(self.own_detector, record), record, "swap to"):
            self._save(self.state.model_copy(update={"trial": None}))
            return
        now = self._sample()
        self._swap = _Swap(record, rollout, now, before)
        self._count("swapped")
        self._show_model()
        took = now - started
        self._event(
            "swapped",
            _ref(record),
            f"swapped in {took:.1f} s after the rollout",
            rollout,
            {"seconds": round(took, 2)},
        )
        self._set("evaluating", f"{record} on trial for {self.settings.evidence.window_s:g} s")

    def _reload(self, detector: DetectorConfig, record: ModelRecord | None, what: str) -> bool:
        """Swap to `detector` through the agent's reload; False (logged, counted) if refused."""
        config = self.agent.config.model_copy(update={"detector": detector})
        label = str(record) if record is not None else "the config's model"
        try:
            self.agent.request_reload(config).result(_RELOAD_TIMEOUT_S)
        except ReloadRefused as exc:
            if record is not None and what == "swap to":
                self._refuse(_ref(record), f"{record} refused by the reload: {exc}")
            else:
                logger.error("fleet: %s %s failed: %s", what, label, exc)
            return False
        except FutureTimeout:
            logger.error("fleet: %s %s: the frame loop did not take it in time", what, label)
            if record is not None and what == "swap to":
                self._count("failed")
            return False
        return True

    # ---- judging the trial -----------------------------------------------------------------

    def _evaluate(self, now: float) -> None:
        swap = self._swap
        if swap is None:
            return
        if self.agent.model.sha256 != swap.record.sha256:  # the agent's own probation undid it
            self._swap = None
            self._reject_trial(swap, "the new detector failed on live frames", "failed", None)
            return
        settings = self.settings.evidence
        baseline = self._evidence.window(
            swap.baseline_end_s - settings.window_s, swap.baseline_end_s
        )
        live = self._evidence.window(swap.swapped_s, now)
        if live is None:
            return
        verdict = judge(baseline, live, settings, waited_s=now - swap.swapped_s)
        if verdict.decision == "wait":
            return
        if verdict.decision == "keep":
            self._promote(swap, verdict)
        else:
            self._roll_back(verdict.reason(), "evidence", verdict)

    def _promote(self, swap: _Swap, verdict: Verdict) -> None:
        self._swap = None
        state = self.state
        previous = state.current
        self._save(
            state.model_copy(
                update={
                    "current": swap.record,
                    "previous": previous,
                    "trial": None,
                    "pending": None,
                }
            )
        )
        self._count("promoted")
        self._show_model()
        why = verdict.reason() or "no live signal worse than the old model's"
        self._event("promoted", _ref(swap.record), why, swap.rollout, verdict.evidence)
        self._set("idle", f"running {swap.record} (kept after its trial)")

    def _roll_back(self, reason: str, kind: str, verdict: Verdict | None = None) -> None:
        """Swap the trial's model out for the model before it; reject its digest."""
        swap, self._swap = self._swap, None
        if swap is None:
            return
        back = self.state.current
        if not self._reload(detector_for(self.own_detector, back), back, "roll back to"):
            logger.error("fleet: could not roll back from %s; it keeps running", swap.record)
            self._swap = swap
            return
        self._reject_trial(swap, reason, kind, verdict)

    def _reject_trial(self, swap: _Swap, reason: str, kind: str, verdict: Verdict | None) -> None:
        rejected = (*self.state.rejected, swap.record.sha256)[-_MAX_REJECTED:]
        self._save(
            self.state.model_copy(update={"trial": None, "pending": None, "rejected": rejected})
        )
        if self.metrics is not None:
            self.metrics.observe_fleet_rollback(kind)
        self._show_model()
        evidence = verdict.evidence if verdict is not None else {}
        evidence = {**evidence, "seconds_on_trial": round(self._clock() - swap.swapped_s, 2)}
        logger.warning(
            "fleet: rolled back %s to %s: %s", swap.record, self._running_label(), reason
        )
        self._event("rolled_back", _ref(swap.record), reason, swap.rollout, evidence)
        self._set("rolled_back", f"{swap.record} rolled back: {reason}")

    def _revert(self, rollout: Rollout) -> None:
        """The rollout no longer wants the fleet model running here: the one before it again."""
        if self._swap is not None:
            self._roll_back(f"rollout {rollout.rollout_id} is {rollout.stage}", "halted")
            return
        state = self.state
        current = state.current
        if current is None:
            return
        back = state.previous
        if not self._reload(detector_for(self.own_detector, back), back, "revert to"):
            return
        self._save(state.model_copy(update={"current": back, "previous": None}))
        if self.metrics is not None:
            self.metrics.observe_fleet_rollback("halted")
        self._show_model()
        reason = f"rollout {rollout.rollout_id} is {rollout.stage}: back to {self._running_label()}"
        logger.warning("fleet: reverted %s: %s", current, reason)
        self._event("reverted", _ref(current), reason, rollout)
        self._set("idle", reason)

    # ---- outcomes --------------------------------------------------------------------------

    def _refuse(self, ref: ModelRef | None, reason: str, *, reject: bool = True) -> None:
        """One log line, one event, a count; with `reject`, the digest is never tried again."""
        logger.error(
            "fleet: %s%s", reason, "" if "nothing loaded" in reason else "; nothing loaded"
        )
        if reject and ref is not None and ref.sha256 not in self.state.rejected:
            rejected = (*self.state.rejected, ref.sha256)[-_MAX_REJECTED:]
            self._save(self.state.model_copy(update={"rejected": rejected, "pending": None}))
        self._count("refused")
        self._event("refused", ref, reason, None)
        self._set("refused", reason)

    def _retry(self, reason: str) -> None:
        logger.warning("fleet: %s; trying again in %g s", reason, self.settings.retry_interval_s)
        self._count("failed")
        self._retry_at = self._clock() + self.settings.retry_interval_s
        self._set("downloading", f"{reason}; retrying")

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_fleet_update(outcome)

    def _save(self, state: FleetState) -> None:
        save_state(self.settings.state_dir, state)
        self.state = state

    def _set(self, status: str, detail: str) -> None:
        changed = (status, detail) != (self._status, self._detail)
        self._status, self._detail = status, detail
        if changed:
            self._publish_status()

    # ---- what runs -------------------------------------------------------------------------

    def _running(self) -> ModelRecord | None:
        """The fleet model running now (the trial's while on trial); None: the config's own."""
        if self._swap is not None:
            return self._swap.record
        return self.state.current

    def _running_sha(self) -> str | None:
        running = self._running()
        return running.sha256 if running is not None else self._own_sha

    def _running_is_fleet(self) -> bool:
        return self._running() is not None

    def _running_document(self) -> dict[str, str] | None:
        running = self._running()
        if running is not None:
            return running.document()
        model = self.agent.model
        if self._own_sha is None:
            return None
        return {"name": _id(model.name), "version": _id(model.version), "sha256": self._own_sha}

    def _running_label(self) -> str:
        running = self._running()
        if running is not None:
            return str(running)
        model = self.agent.model
        return f"{model.name}:{model.version} (the config's model)"

    def _show_model(self) -> None:
        document = self._running_document()
        if self.metrics is not None and document is not None:
            self.metrics.set_fleet_model(document["name"], document["version"], document["sha256"])

    # ---- publishing ------------------------------------------------------------------------

    def status_document(self) -> dict[str, object]:
        """The retained fleet status of this box (what `fleet list` reads)."""
        running = self._running_document()
        label = f"{running['name']}:{running['version']}" if running is not None else None
        previous = self.state.previous if self._swap is None else self.state.current
        return {
            "agent_id": self.agent_id,
            "site": self.site,
            "groups": list(self.settings.groups),
            "state": self._status,
            "model": running,
            "previous": previous.document() if previous is not None else None,
            "desired": self._desired.as_json() if self._desired is not None else None,
            "cameras": {name: label for name in list(self.agent.status)},
            "rejected": list(self.state.rejected),
            "detail": self._detail,
            "updated_at": iso_utc(time.time()),
        }

    def _publish_status(self) -> None:
        self._next_status_s = self._clock() + self.settings.status_interval_s
        payload = json.dumps(self.status_document(), separators=(",", ":"))
        self.client.publish(status_topic(self.prefix, self.agent_id), payload, qos=1, retain=True)

    def _event(
        self,
        event: str,
        ref: ModelRef | None,
        reason: str,
        rollout: Rollout | None,
        evidence: Mapping[str, object] | None = None,
    ) -> None:
        document: dict[str, object] = {
            "agent_id": self.agent_id,
            "event": event,
            "model": ref.as_json() if ref is not None else None,
            "reason": reason,
            "evidence": dict(evidence or {}),
            "rollout_id": rollout.rollout_id if rollout is not None else None,
            "at": iso_utc(time.time()),
        }
        payload = json.dumps(document, separators=(",", ":"))
        self.client.publish(events_topic(self.prefix, self.agent_id), payload, qos=1)


def model_path_of(detector: DetectorConfig) -> Path | None:
    """The model file a detector config runs, if it names one."""
    path = getattr(detector.runtime, "model_path", None)
    return path if isinstance(path, Path) else None


def _id(text: str) -> str:
    """`text` as a fleet name (what status readers accept): letters, digits, `_.-`, <= 64."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:64]
    return cleaned if cleaned[:1].isalnum() else f"m{cleaned}"[:64]


def _ref(record: ModelRecord) -> ModelRef:
    return ModelRef(record.name, record.version, record.sha256)
