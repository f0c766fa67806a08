"""`EdgeAgent`: every camera of one box through one shared detector, trackers, rules and alerts.

One thread runs the frame loop (`step`): it takes the newest due frame of each camera (never a
stale one: capture keeps only the newest), runs the shared detector once on all of them (a batch
across cameras), then per camera tracks, runs the rules and queues the events in the MQTT
outbox. Capture runs in the sources' own threads, MQTT delivery in the publisher's. A failure
of one camera (stream, secret, bad frame) is logged and counted; the others go on.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from configkit.secrets import SecretError
from detection.class_groups import GroupKeys
from detection.config import DetectorConfig
from detection.detections import Detections
from detection.detector import Detector
from detection.errors import DetectionError
from detection.slicing import Tile
from edge_agent.alerts import AlertPublisher
from edge_agent.alerts.sinks import AlertFanout, AlertSink, Lifecycle, MediaRecorder
from edge_agent.alerts.webhook import WebhookSink
from edge_agent.capture import CameraSource, CapturedFrame, CaptureState, LatestFrameSlot
from edge_agent.capture.urls import camera_url
from edge_agent.config import EdgeAgentConfig
from edge_agent.config.camera import CameraConfig
from edge_agent.escalation import EscalationClient, EscalationResult
from edge_agent.escalation.encode import detections_from_result
from edge_agent.labels import LabelStore
from edge_agent.media.store import MediaStore
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline.camera import CameraWorker, FrameOutcome
from edge_agent.pipeline.discovery import HomeAssistantLink
from edge_agent.pipeline.escalation import EscalationStage
from edge_agent.pipeline.focus import detect_crops
from edge_agent.pipeline.model_swap import ModelIdentity, Probation, load_detector, prepare_detector
from edge_agent.pipeline.mosaic import runs_for
from edge_agent.pipeline.pace import FocusBudget
from edge_agent.pipeline.reload import ReloadPlan, ReloadRefused, plan_reload
from edge_agent.pipeline.status import CameraStatus
from edge_agent.pipeline.telemetry import AgentTelemetry
from edge_agent.rules import RuleEvent
from edge_agent.tracking import CameraTracker, Embedder
from edge_agent.tracking.embedders import build_embedder
from edge_agent.tracking.fusion import FusionSettings

logger = logging.getLogger(__name__)

OutcomeHook = Callable[[FrameOutcome], None]
"""Called in the frame loop with every analysed frame (escalation, demo, tests)."""

ModelIdentifier = Callable[[Detector, DetectorConfig], ModelIdentity]
"""Names the model a detector runs (`ModelIdentity.of`, or the fleet updater's, which knows the
name, version and digest it published the file under)."""


@dataclass(frozen=True, slots=True)
class _StateChange:
    camera: str
    generation: int  # which build of the camera (a reload restarts a changed camera)
    state: CaptureState
    reason: str
    at_s: float


ReloadListener = Callable[[EdgeAgentConfig, ReloadPlan], None]
"""Called in the frame loop after a reload applied `plan`, with the new config."""


class EdgeAgent:
    """The frame loop of one edge agent; see the module docstring."""

    def __init__(
        self,
        config: EdgeAgentConfig,
        detector: Detector,
        publisher: AlertPublisher,
        *,
        environ: Mapping[str, str] | None = None,
        embedder: Embedder | None = None,
        metrics: EdgeMetrics | None = None,
        escalation: EscalationStage | None = None,
        sinks: Sequence[AlertSink] = (),
        recorders: Sequence[MediaRecorder] = (),
        media: MediaStore | None = None,
    ) -> None:
        """Set up the cameras (not started); `embedder` defaults to the configured one.

        `escalation` sends hard frames to the cloud and brings its answers back for fusion.
        Events go to `publisher` (MQTT) and to `sinks`, with media from `recorders` named in
        their payloads (`AlertFanout`); `media` (snapshots and clips) is one such recorder that
        also watches every analysed frame (for clips) and serves the status page's files.
        """
        self.config = config
        self.detector = detector
        self.publisher = publisher
        self.hooks: list[OutcomeHook] = []
        self.webhook = next((sink for sink in sinks if isinstance(sink, WebhookSink)), None)
        self.media = media
        if media is not None:
            recorders = [media, *recorders]
            self.hooks.append(media.observe)
        self.alerts = AlertFanout(config.agent.id, [publisher, *sinks], recorders)
        self._owned = [*sinks, *recorders]  # started and closed with the agent (`Lifecycle`)
        self.batches = 0
        self.failed_batches = 0
        self._wake = threading.Event()
        # focus crops only in the time the frame period leaves (pipeline.pace)
        self.focus_budget = FocusBudget()
        self._changes: queue.SimpleQueue[_StateChange] = queue.SimpleQueue()
        self._embedder = embedder if embedder is not None else build_embedder(config.tracker)
        self.identify: ModelIdentifier = ModelIdentity.of
        self.model = ModelIdentity.of(detector, config.detector)
        self._probation: Probation | None = None
        self.telemetry = (
            AgentTelemetry(metrics, config.detector.runtime.type) if metrics is not None else None
        )
        if self.telemetry is not None:
            self.telemetry.on_model(self.model)
        self.escalation = escalation
        if escalation is not None and escalation.labels is not None:
            escalation.labels.set_edge_model(lambda: self.model.document())
        self.workers: list[CameraWorker] = []
        self.status: dict[str, CameraStatus] = {}
        self._next_status_s = 0.0
        self._next_metrics_s = 0.0
        self._last_cloud_state = "off" if escalation is None else "unreachable"
        self._environ = environ
        self._started = False
        self._generations: dict[str, int] = {}
        self._reloads: queue.SimpleQueue[
            tuple[EdgeAgentConfig, Future[ReloadPlan], Detector | None]
        ] = queue.SimpleQueue()
        self.reload_listeners: list[ReloadListener] = []
        self.homeassistant = (
            HomeAssistantLink(publisher, config) if config.homeassistant.enabled else None
        )
        if self.homeassistant is not None:
            self.reload_listeners.append(self.homeassistant.reload)
        if media is not None:
            self.reload_listeners.append(
                lambda new, _plan: media.set_cameras(
                    [camera for camera in new.cameras if camera.enabled], detector.class_names
                )
            )
        for camera in config.cameras:
            if camera.enabled:
                self._add_camera(camera)

    @classmethod
    def from_config(
        cls,
        config: EdgeAgentConfig,
        *,
        environ: Mapping[str, str] | None = None,
        metrics: EdgeMetrics | None = None,
        detector: Detector | None = None,
        embedder: Embedder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> EdgeAgent:
        """The agent production runs: the configured detector, MQTT publisher, embedder,
        webhook, media store, escalation stage and label store (each where configured). The one
        way to build an agent; benches and tests inject what they drive themselves.

        The detector keeps detections down to the tracker's low-score threshold (the second,
        ByteTrack-style pass); the tracker treats only those above the detector's own threshold
        as able to start tracks. Injections: `detector` (default `load_detector(config)`;
        closed with the agent), `embedder` (default: the configured one), `clock` (monotonic
        seconds: the escalation budget's and refresh clock) and `wall_clock` (epoch seconds: the
        media store's clip and retention times); a bench on a scene's time passes the scene's.
        """
        detector = detector if detector is not None else load_detector(config)
        try:
            publisher = AlertPublisher(config.mqtt, config.agent.id, environ=environ)
        except BaseException:
            detector.close()
            raise
        try:
            webhook = (
                WebhookSink(config.webhook, environ=environ) if config.webhook is not None else None
            )
            media = None
            if config.media.enabled:
                enabled = [camera for camera in config.cameras if camera.enabled]
                media = MediaStore(
                    config.media,
                    cameras=enabled,
                    class_names=detector.class_names,
                    clock=wall_clock,
                )
            escalation = None
            if config.escalation.enabled:
                client = EscalationClient(config.escalation, config.agent.id, environ=environ)
                labels = (
                    LabelStore(config.labels, config.agent.id) if config.labels.enabled else None
                )
                escalation = EscalationStage(
                    config.escalation,
                    config.agent.id,
                    client,
                    metrics=metrics,
                    clock=clock,
                    labels=labels,
                )
            return cls(
                config,
                detector,
                publisher,
                environ=environ,
                embedder=embedder,
                metrics=metrics,
                escalation=escalation,
                sinks=[webhook] if webhook is not None else [],
                media=media,
            )
        except BaseException:
            publisher.outbox.close()
            detector.close()
            raise

    # ---- life cycle ------------------------------------------------------------------------

    def start(self, *, capture: bool = True) -> None:
        """Connect to the broker (in the background) and open every camera; `capture` False
        leaves the cameras closed, for a caller that puts frames into their slots itself (the
        benches, on a scene's clock)."""
        self.publisher.start()
        for part in self._owned:
            if isinstance(part, Lifecycle):
                part.start()
        if self.homeassistant is not None:
            self.homeassistant.announce()
        if self.escalation is not None:
            self.escalation.start()
        if capture:
            for worker in self.workers:
                worker.source.start()
        self._started = capture  # cameras added by a reload open too

    def run(self, stop: threading.Event, on_idle: Callable[[], None] | None = None) -> None:
        """Run the frame loop until `stop` is set; `on_idle` is called at least every 0.5 s."""
        next_idle = 0.0
        while not stop.is_set():
            self.step(timeout_s=0.05)
            now = time.monotonic()
            if on_idle is not None and now >= next_idle:
                on_idle()
                next_idle = now + 0.5

    def close(self, flush_timeout_s: float = 10.0) -> None:
        """Stop the cameras, end lasting events, publish final statuses and flush the outbox."""
        for worker in self.workers:
            worker.source.slot.close()
        for worker in self.workers:
            worker.source.stop()
        if self.escalation is not None:
            self.escalation.close()
        for worker in self.workers:
            self._publish_events(worker, worker.finish())
        self._drain_state_changes()
        for worker in self.workers:
            status = self.status[worker.name]
            status.changed(CaptureState.STOPPED.value, "agent stopping")
            self._publish_status(worker, final=True)
        for part in self._owned:
            if isinstance(part, Lifecycle):
                part.close(timeout_s=flush_timeout_s)
        self.publisher.close(timeout_s=flush_timeout_s)
        self.detector.close()
        if self._probation is not None:
            self._probation.previous.close()
            self._probation = None

    # ---- the frame loop ----------------------------------------------------------------------

    def step(self, timeout_s: float = 0.05) -> int:
        """Analyse at most one new frame per camera; wait up to `timeout_s` when none is ready."""
        entered = time.perf_counter()
        self._wake.clear()
        self._apply_requested_reloads()
        self._drain_state_changes()
        self._publish_statuses_if_due()
        self._refresh_metrics_if_due()
        self._fuse_answers()
        batch = [(w, f) for w in self.workers if (f := w.next_frame()) is not None]
        if not batch:
            self._wake.wait(timeout_s)
            return 0
        started = time.perf_counter()
        try:
            results = self.detector.detect([frame.image for _, frame in batch])
        except DetectionError as exc:
            self.failed_batches += 1
            logger.error("detector failed on %d frame(s): %s", len(batch), exc)
            if self._probation is not None:
                self._roll_back(exc)
            return 0
        detect_s = time.perf_counter() - started
        self.batches += 1
        if self._probation is not None and self._probation.passed_batch():
            logger.info("model %s passed its probation; the previous one is closed", self.model)
            self._probation.previous.close()
            self._probation = None
        if self.telemetry is not None:
            self.telemetry.on_batch(len(batch), detect_s)
        focus_started = time.perf_counter()
        focus, runs = self._detect_focus(batch)
        focus_s = time.perf_counter() - focus_started
        for (worker, frame), detections in zip(batch, results, strict=True):
            try:
                outcome = worker.process(frame, detections, detect_s, focus.get(worker.name, []))
            except Exception:  # one camera's bad frame must not stop the others
                worker.counters.failed += 1
                logger.exception("camera %s: frame %d failed", worker.name, frame.index)
                continue
            self.status[worker.name].analysed(frame.monotonic_s)
            if self.homeassistant is not None and worker.rules is not None:
                self.homeassistant.zones_seen(worker.name, worker.rules.zone_counts())
            self._publish_events(worker, outcome.events, outcome)
            if self.telemetry is not None:
                self.telemetry.on_outcome(outcome)
            decision = outcome.decision
            if self.escalation is not None and decision is not None and decision.send:
                self.escalation.submit(worker.name, frame, decision)
            for hook in self.hooks:
                hook(outcome)
        self.focus_budget.observe(time.perf_counter() - entered, focus_s, runs)
        return len(batch)

    # ---- reload ----------------------------------------------------------------------------

    def request_reload(self, config: EdgeAgentConfig) -> Future[ReloadPlan]:
        """Ask the frame loop to apply `config` (from any thread); the future gives the plan
        applied, or raises `ReloadRefused` (nothing changed).

        A new detector is loaded and checked here, in the caller's thread, so the frame loop
        only swaps it in (`pipeline.model_swap`).
        """
        future: Future[ReloadPlan] = Future()
        detector = None
        if config.detector != self.config.detector:
            try:
                plan_reload(self.config, config)  # refuse other sections before loading
                detector = prepare_detector(config, self.detector)
            except ReloadRefused as exc:
                if self.telemetry is not None:
                    self.telemetry.on_model_swap("refused")
                future.set_exception(exc)
                return future
        self._reloads.put((config, future, detector))
        self._wake.set()
        return future

    def reload(self, config: EdgeAgentConfig, detector: Detector | None = None) -> ReloadPlan:
        """Apply `config`'s camera and detector changes now; call in the frame loop's thread
        (see `pipeline.reload`). `detector`: the new detector, already prepared (else it is
        loaded here). Raises `ReloadRefused` when another section changed or the new model
        cannot replace the running one."""
        try:
            plan = plan_reload(self.config, config)
            if plan.detector and detector is None:
                detector = prepare_detector(config, self.detector)
        except ReloadRefused:
            if detector is not None:
                detector.close()
            if config.detector != self.config.detector and self.telemetry is not None:
                self.telemetry.on_model_swap("refused")
            raise
        if detector is not None:
            if plan.detector:
                self._swap_detector(detector, config)
            else:
                detector.close()
        cameras = {camera.name: camera for camera in config.cameras}
        for name in (*plan.removed, *plan.changed):
            self._remove_camera(name, clear_status=name in plan.removed)
        self.config = config
        for name in (*plan.changed, *plan.added):
            worker = self._add_camera(cameras[name])
            if worker is not None and self._started:
                worker.source.start()
        self._drain_state_changes()
        for listener in self.reload_listeners:
            listener(config, plan)
        logger.info("config reloaded: %s", plan.summary())
        return plan

    def set_identifier(self, identify: ModelIdentifier) -> None:
        """Name models with `identify` from now on, the running one included (call before
        `start`, or from the frame loop)."""
        self.identify = identify
        self.model = identify(self.detector, self.config.detector)
        if self.telemetry is not None:
            self.telemetry.on_model(self.model)

    def _apply_requested_reloads(self) -> None:
        while True:
            try:
                config, future, detector = self._reloads.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                if detector is not None:
                    detector.close()
                continue
            try:
                future.set_result(self.reload(config, detector))
            except Exception as exc:  # refused or failed: the caller is told; the loop goes on
                future.set_exception(exc)

    def _swap_detector(self, detector: Detector, config: EdgeAgentConfig) -> None:
        """Answer with `detector` from the next batch on; the running one is kept for the
        new one's probation (a probation still running ends: its older model closes)."""
        if self._probation is not None:
            self._probation.previous.close()
        previous = self.model
        self._probation = Probation(self.detector, self.config.detector, previous)
        self.detector = detector
        self.model = self.identify(detector, config.detector)
        self._regroup_trackers()
        if self.telemetry is not None:
            self.telemetry.on_model(self.model)
            self.telemetry.on_model_swap("applied")
        logger.info("detector swapped: %s -> %s", previous, self.model)

    def _class_keys(self) -> GroupKeys | None:
        """The running detector's class groups as the trackers' gate (None: gate off)."""
        return GroupKeys(self.detector.class_groups) if self.config.tracker.class_gate else None

    def _regroup_trackers(self) -> None:
        """A swapped detector may group its classes otherwise (`detector.class_groups`): the
        cameras' trackers and fusion follow it from the next frame."""
        keys = self._class_keys()
        for worker in self.workers:
            worker.tracker.tracker.class_keys = keys

    def _roll_back(self, error: Exception) -> None:
        """The new detector failed during its probation: the previous one answers again."""
        probation, self._probation = self._probation, None
        if probation is None:
            return
        failed = self.model
        self.detector.close()
        self.detector = probation.previous
        self.config = self.config.model_copy(update={"detector": probation.previous_config})
        self.model = probation.previous_identity
        self._regroup_trackers()
        if self.telemetry is not None:
            self.telemetry.on_model(self.model)
            self.telemetry.on_model_swap("rolled_back")
        logger.error("model %s failed (%s): rolled back to %s", failed, error, self.model)

    def _remove_camera(self, name: str, *, clear_status: bool) -> None:
        """Stop camera `name` without waiting on the loop: its lasting events end now, its
        capture threads are joined in the background."""
        self._generations[name] = self._generations.get(name, 0) + 1  # ignore its late changes
        worker = self._worker(name)
        if worker is not None:
            self.workers.remove(worker)
            worker.source.slot.close()
            threading.Thread(
                target=worker.source.stop, name=f"camera-stop:{name}", daemon=True
            ).start()
            self._publish_events(worker, worker.finish())
        self.status.pop(name, None)
        if clear_status:
            self.publisher.clear_status(name)

    # ---- escalation and fusion ---------------------------------------------------------------

    def _detect_focus(
        self, batch: list[tuple[CameraWorker, CapturedFrame]]
    ) -> tuple[dict[str, list[tuple[Tile, Detections]]], int]:
        """The detector on every camera's focus crops (small tracks the cloud vouched for),
        in one batch, as many as fit in the frame period (`FocusBudget`): the crops' boxes per
        camera, in crop pixels, and the detector runs they took (0 when the detector failed)."""
        planned = [(w.name, f.image, tile) for w, f in batch for tile in w.focus_tiles(f)]
        side = 1
        if planned:
            period_s = min(1.0 / w.config.target_fps for w, _ in batch)
            most = self.config.escalation.focus.mosaic
            side, granted = self.focus_budget.allowed(period_s, len(planned), most)
            planned = planned[:granted]
        try:
            return detect_crops(self.detector, planned, side), runs_for(len(planned), side)
        except DetectionError as exc:  # the frames' own detections still count
            logger.error("detector failed on %d focus crop(s): %s", len(planned), exc)
            return {}, 0

    def _fuse_answers(self) -> None:
        if self.escalation is None:
            return
        for result in self.escalation.poll():
            self._fuse(result)
        state = self.cloud_state
        if state != self._last_cloud_state:
            level = logging.INFO if state == "connected" else logging.WARNING
            logger.log(level, "cloud service %s", state)
            self._last_cloud_state = state
            for worker in self.workers:  # the status topics say whether the cloud helps now
                self._publish_status(worker)

    def _fuse(self, result: EscalationResult) -> None:
        worker = self._worker(result.camera_id)
        if worker is None or not result.ok or result.result is None:
            return
        cloud = detections_from_result(result.result, self.detector.class_names)
        fused = worker.fuse(result.frame_id, cloud)
        if fused is not None and fused.dropped_late:
            logger.debug("camera %s: answer for frame %d too late", worker.name, result.frame_id)

    def _worker(self, name: str) -> CameraWorker | None:
        return next((w for w in self.workers if w.name == name), None)

    # ---- internals ---------------------------------------------------------------------------

    def _add_camera(self, camera: CameraConfig) -> CameraWorker | None:
        """Build camera `camera` (not started); None if it cannot run (its status says why)."""
        status = CameraStatus(camera.name)
        self.status[camera.name] = status
        generation = self._generations.get(camera.name, 0) + 1
        self._generations[camera.name] = generation
        try:
            url = camera_url(camera, self._environ)
        except SecretError as exc:
            status.changed("error", f"cannot read the camera password: {exc}")
            status.last_error = status.reason
            logger.error("camera %s: %s; it stays off", camera.name, status.reason)
            return None
        source = CameraSource(
            camera.name,
            url,
            camera.capture,
            slot=LatestFrameSlot(notify=self._wake),
            loop_file=camera.loop_file,
            every_frame=camera.file_replay == "every_frame",
            on_state_change=functools.partial(self._on_state_change, generation),
        )
        detector_threshold = self.config.detector.confidence_threshold
        tracker = CameraTracker.from_config(
            self.config.tracker, detector_threshold, self._embedder, self._class_keys()
        )
        # the detector's names: the config's, else the model's own (its metadata)
        names = self.detector.class_names
        for rule in camera.rules:
            unknown = [c for c in rule.classes if c not in names]
            if names and unknown:  # validate-config reports it; here it only never matches
                logger.warning(
                    "camera %s: rule %s names classes %s that the detector does not have",
                    camera.name,
                    rule.name,
                    unknown,
                )
        escalation = self.config.escalation
        worker = CameraWorker(
            camera,
            source,
            tracker,
            names,
            fusion=FusionSettings.from_config(
                escalation.fusion, camera.target_fps, self.detector.kept_class_ids
            ),
            escalator=self.escalation,
            focus=escalation.focus if self.escalation is not None else None,
        )
        self.workers.append(worker)
        return worker

    def _on_state_change(
        self, generation: int, camera: str, _old: CaptureState, new: CaptureState, reason: str
    ) -> None:
        # Called from capture threads: hand over to the frame loop, which owns the publisher.
        self._changes.put(_StateChange(camera, generation, new, reason, time.time()))
        self._wake.set()

    def _drain_state_changes(self) -> None:
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                return
            status = self.status.get(change.camera)
            if status is None or self._generations.get(change.camera) != change.generation:
                continue  # from a camera build that a reload has since removed
            status.changed(change.state.value, change.reason, change.at_s)
            worker = self._worker(change.camera)
            if worker is None:
                continue
            errors = worker.source.error_lines()
            status.last_error = errors[-1] if errors else None
            logger.info("camera %s: %s (%s)", change.camera, change.state.value, change.reason)
            self._publish_status(worker)

    def _refresh_metrics_if_due(self) -> None:
        now = time.monotonic()
        if self.telemetry is None or now < self._next_metrics_s:
            return
        self._next_metrics_s = now + 1.0
        self.telemetry.refresh(
            self.workers, self.status, self.publisher, media=self.media, webhook=self.webhook
        )

    def _publish_statuses_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_status_s:
            return
        self._next_status_s = now + self.config.mqtt.status_interval_s
        # every camera, those left off by an error (no worker) included
        for name, document in self.status_documents().items():
            self.publisher.publish_status(name, document)

    def _publish_status(self, worker: CameraWorker, *, final: bool = False) -> None:
        """Publish `worker`'s status; a `final` one (clean stop) never expires on the broker."""
        document = self._worker_document(worker)
        self.publisher.publish_status(worker.name, document, expires=not final)

    def _worker_document(self, worker: CameraWorker) -> dict[str, object]:
        stats = worker.source.stats()
        dropped = stats.drops + worker.counters.skipped_rate
        status = self.status[worker.name]
        return self._document(
            worker.name, status, worker.counters.analysed, dropped, stats.reconnects
        )

    def _document(
        self, name: str, status: CameraStatus, frames: int, dropped: int, reconnects: int
    ) -> dict[str, object]:
        document = status.document(
            agent=self.config.agent.id, frames=frames, dropped=dropped, reconnects=reconnects
        )
        document["cloud"] = self.cloud_state
        if self.escalation is not None:
            document["cloud_answers"] = self.escalation.deadline_status()
        document["model"] = self.model.document()
        return document

    def status_documents(self) -> dict[str, dict[str, object]]:
        """Every camera's status document (as on its MQTT status topic), by camera name; safe to
        call from another thread (the status page)."""
        documents: dict[str, dict[str, object]] = {}
        for name, status in list(self.status.items()):
            worker = self._worker(name)
            documents[name] = (
                self._document(name, status, 0, 0, 0)
                if worker is None
                else self._worker_document(worker)
            )
        return documents

    @property
    def cloud_state(self) -> str:
        """`off` (escalation disabled), `connected` or `unreachable` (the agent runs alone)."""
        if self.escalation is None:
            return "off"
        return "connected" if self.escalation.connected else "unreachable"

    def _publish_events(
        self, worker: CameraWorker, events: list[RuleEvent], outcome: FrameOutcome | None = None
    ) -> None:
        frame = outcome.frame if outcome is not None else None
        detections = outcome.detections if outcome is not None else None
        for event in events:
            self.alerts.emit(event, frame, detections, worker.config, self.detector.class_names)
        if self.telemetry is not None and events:
            self.telemetry.on_events(events)
