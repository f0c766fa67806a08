"""`MediaStore`: event snapshots, crops and clips, written off the frame loop, with retention.

In the frame loop (one thread) it only decides and queues: `record` (a `MediaRecorder` of the
alert fan-out) names the files an event start *will* have and queues the job; `observe` (an
agent outcome hook) hands every camera's frame, at `clips.fps`, to the worker by reference
(frames are never changed after capture). Neither waits: when the bounded queue is full the job
is dropped and counted, and `record` then promises nothing.

The worker thread draws, encodes and writes snapshots and crops, keeps each camera's ring of
JPEG clip frames, collects the frames of pending clips and runs the retention sweep on the
injected clock; a second thread encodes finished clips to video, so a long encode never holds
up the ring. Both run at a lower CPU priority (`worker_niceness`). Every file is written to a
temp name and renamed, so readers never see half a file.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from detection.detections import Detections
from edge_agent.alerts.sinks import EventContext
from edge_agent.capture.frames import CapturedFrame
from edge_agent.config.camera import CameraConfig
from edge_agent.config.media import MediaConfig
from edge_agent.media.clips import (
    CLIP_FORMATS,
    EncodedFrame,
    FrameRing,
    FrameSampler,
    PendingClip,
    write_clip,
)
from edge_agent.media.draw import annotate
from edge_agent.media.files import remove_temp_files, write_atomic
from edge_agent.media.images import crop_box, encode_jpeg, fit_width, is_image
from edge_agent.media.paths import event_files, media_url, resolve_inside
from edge_agent.media.retention import sweep
from edge_agent.rules import RuleEvent

__all__ = ["MediaStats", "MediaStore", "ObservedFrame"]

logger = logging.getLogger(__name__)

_POLL_S = 0.2  # how often an idle worker checks stalled clips, the sweep and closing
_DROP_LOG_INTERVAL_S = 60.0  # one warning a minute at most while jobs are being dropped
_DAY_S = 86_400.0
_MIB = 1024 * 1024


class ObservedFrame(Protocol):
    """What `observe` needs of an analysed frame (`pipeline.FrameOutcome` has it)."""

    @property
    def camera(self) -> str:
        """The camera's name."""
        ...

    @property
    def frame(self) -> CapturedFrame:
        """The frame as captured."""
        ...

    @property
    def detections(self) -> Detections:
        """Its tracked boxes."""
        ...


@dataclass(frozen=True, slots=True)
class MediaStats:
    """Counters of a `MediaStore` since it was made.

    `written`/`bytes_written`: files finished; `dropped`: event jobs (snapshots, crops, clips)
    lost to a full queue; `dropped_frames`: clip frames lost to it (gaps in clips); `failed`:
    jobs that raised (bad frame, encoder, disk); `deleted`/`deleted_bytes`: files removed by
    retention; `queued`: jobs waiting now; `pending_clips`: clips still collecting frames.
    """

    written: int
    bytes_written: int
    dropped: int
    dropped_frames: int
    failed: int
    deleted: int
    deleted_bytes: int
    queued: int
    pending_clips: int


@dataclass(frozen=True, slots=True)
class _EventJob:
    context: EventContext
    frame: CapturedFrame
    snapshot: Path | None
    crop: Path | None
    clip: Path | None


@dataclass(frozen=True, slots=True)
class _FrameJob:
    frame: CapturedFrame
    detections: Detections
    camera: CameraConfig | None
    class_names: tuple[str, ...]


_Job = _EventJob | _FrameJob


@dataclass
class _Counters:
    written: int = 0
    bytes_written: int = 0
    dropped: int = 0
    dropped_frames: int = 0
    failed: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    pending_clips: int = 0


_WAKE = object()  # put (when there is room) by `close`, so an idle worker notices at once


class MediaStore:
    """Records event media under `config.directory` (see the module docstring).

    `cameras` and `class_names` let clip frames be annotated from the first frame on; both are
    also learned from the events' contexts. `clock` gives wall time (Unix seconds) for
    retention, clip time-outs and log pacing. Call `record` and `observe` from one thread.
    """

    def __init__(
        self,
        config: MediaConfig,
        *,
        cameras: Sequence[CameraConfig] = (),
        class_names: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.root = config.directory.expanduser().resolve()
        self._clock = clock
        self._clip_format = CLIP_FORMATS[config.clips.codec]
        # frame-loop side
        self._cameras: dict[str, CameraConfig] = {c.name: c for c in cameras}
        self._class_names = tuple(class_names)
        self._samplers: dict[str, FrameSampler] = {}
        self._accepting = config.enabled
        # queues and threads
        self._jobs: queue.Queue[_Job | object] = queue.Queue(maxsize=config.queue_limit)
        self._clip_jobs: queue.Queue[PendingClip] = queue.Queue(maxsize=config.queue_limit)
        self._closing = threading.Event()
        self._worker_done = threading.Event()
        self._threads: list[threading.Thread] = []
        # worker side
        self._rings: dict[str, FrameRing] = {}
        self._pending: list[PendingClip] = []
        self._next_sweep_s = clock()
        # shared: counters, and jobs queued or running in both queues (for `wait_idle`)
        self._lock = threading.Condition()
        self._counts = _Counters()
        self._outstanding = 0
        self._next_drop_log_s = 0.0
        self._next_failure_log_s = 0.0

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the folder and start the threads; without a usable folder nothing is
        recorded (logged), and the agent goes on."""
        if not self.config.enabled or self._threads:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.error("media folder %s unusable, no media recorded: %s", self.root, exc)
            self._accepting = False
            return
        self._threads = [
            threading.Thread(target=self._run_worker, name="media-writer", daemon=True),
            threading.Thread(target=self._run_clip_writer, name="media-clips", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking work, write what is queued and every pending clip with the frames it
        has, within `timeout_s` (what is left after that is logged and lost)."""
        self._accepting = False
        self._closing.set()
        try:
            self._jobs.put_nowait(_WAKE)
        except queue.Full:
            pass  # a busy worker sees `_closing` after the jobs ahead
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning(
                "media: %s still busy after %.1f s; %d job(s) not written",
                ", ".join(alive),
                timeout_s,
                self._jobs.qsize() + self._clip_jobs.qsize(),
            )

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until nothing is queued or being written (clips still
        collecting frames do not count); whether that is so."""
        with self._lock:
            return self._lock.wait_for(lambda: self._outstanding == 0, timeout=timeout_s)

    # ---- the frame loop's side -----------------------------------------------------------------

    def set_cameras(self, cameras: Sequence[CameraConfig], class_names: Sequence[str]) -> None:
        """Draw clip frames with these camera configs and class names from now on (after a
        config reload; frames already in the rings keep their drawing)."""
        self._cameras = {camera.name: camera for camera in cameras}
        self._class_names = tuple(class_names)

    def record(self, context: EventContext) -> Mapping[str, object]:
        """Queue the snapshot, crop and clip of an event start that has a frame; their
        references (`{"snapshot": {"path": <relative>, "url": ...}, ...}`), or `{}`."""
        frame = context.frame
        event = context.event
        if not self._accepting or event.phase != "start" or frame is None:
            return {}
        if not is_image(frame.image):
            return {}
        if context.camera is not None:
            self._cameras[frame.camera] = context.camera
        if context.class_names:
            self._class_names = tuple(context.class_names)
        config = self.config
        files = event_files(
            event.camera, context.event_id, frame.capture_time_s, self._clip_format.suffix
        )
        planned: dict[str, str] = {}
        if config.snapshot:
            planned["snapshot"] = files.snapshot
        if config.crop and event.box is not None:
            if crop_box(frame.image, event.box, config.crop_margin) is not None:
                planned["crop"] = files.crop
        if config.clips.enabled and frame.camera in self._samplers:  # its frames come in
            planned["clip"] = files.clip
        if not planned:
            return {}
        job = _EventJob(
            context,
            frame,
            self._absolute(planned.get("snapshot")),
            self._absolute(planned.get("crop")),
            self._absolute(planned.get("clip")),
        )
        if not self._submit(job):
            return {}
        return {kind: self._reference(relative) for kind, relative in planned.items()}

    def observe(self, outcome: ObservedFrame) -> None:
        """An agent hook: hand the frame to the clip ring when due at `clips.fps`."""
        if not self._accepting or not self.config.clips.enabled:
            return
        sampler = self._samplers.get(outcome.camera)
        if sampler is None:
            sampler = self._samplers[outcome.camera] = FrameSampler(self.config.clips.fps)
        if not sampler.due(outcome.frame.capture_time_s):
            return
        camera = self._cameras.get(outcome.camera)
        self._submit(_FrameJob(outcome.frame, outcome.detections, camera, self._class_names))

    # ---- for the web server and metrics --------------------------------------------------------

    def resolve(self, relative: str) -> Path | None:
        """The finished file at `relative` (a path as in the references) under the folder, or
        None: nothing outside the folder (no `..`, absolute paths or escaping symlinks), no
        temp files, nothing missing."""
        return resolve_inside(self.root, relative)

    def stats(self) -> MediaStats:
        """The counters now."""
        with self._lock:
            c = self._counts
            return MediaStats(
                c.written,
                c.bytes_written,
                c.dropped,
                c.dropped_frames,
                c.failed,
                c.deleted,
                c.deleted_bytes,
                self._jobs.qsize() + self._clip_jobs.qsize(),
                c.pending_clips,
            )

    # ---- queueing ------------------------------------------------------------------------------

    def _absolute(self, relative: str | None) -> Path | None:
        return None if relative is None else self.root / relative

    def _reference(self, relative: str) -> dict[str, object]:
        reference: dict[str, object] = {"path": relative}
        url = media_url(self.config.base_url, relative)
        if url is not None:
            reference["url"] = url
        return reference

    def _submit(self, job: _Job) -> bool:
        with self._lock:
            self._outstanding += 1
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self._job_done()
            self._note_drop(frame=isinstance(job, _FrameJob))
            return False
        return True

    def _job_done(self) -> None:
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._lock.notify_all()

    def _note_drop(self, *, frame: bool) -> None:
        now = self._clock()
        with self._lock:
            if frame:
                self._counts.dropped_frames += 1
            else:
                self._counts.dropped += 1
            if now < self._next_drop_log_s:
                return
            self._next_drop_log_s = now + _DROP_LOG_INTERVAL_S
            dropped, dropped_frames = self._counts.dropped, self._counts.dropped_frames
        logger.warning(
            "media queue full (%d): %d event job(s) and %d clip frame(s) dropped so far",
            self.config.queue_limit,
            dropped,
            dropped_frames,
        )

    def _wrote(self, size: int) -> None:
        with self._lock:
            self._counts.written += 1
            self._counts.bytes_written += size

    def _failed(self) -> None:
        with self._lock:
            self._counts.failed += 1

    def _pending_changed(self, delta: int) -> None:
        with self._lock:
            self._counts.pending_clips += delta

    # ---- the worker ----------------------------------------------------------------------------

    def _run_worker(self) -> None:
        _lower_priority(self.config.worker_niceness)
        try:
            removed = remove_temp_files(self.root)
            if removed:
                logger.info("media: removed %d unfinished file(s) left by a crash", removed)
        except OSError as exc:
            logger.warning("media: cannot clear temp files under %s: %s", self.root, exc)
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=_POLL_S)
                except queue.Empty:
                    job = None
                if job is not None and job is not _WAKE:
                    self._handle(job)
                self._finish_stalled_clips()
                self._sweep_if_due()
                if self._closing.is_set() and self._jobs.empty():
                    break
            pending, self._pending = self._pending, []
            for clip in pending:  # written with the frames they have
                self._hand_over(clip)
            self._pending_changed(-len(pending))
        finally:
            self._worker_done.set()

    def _handle(self, job: object) -> None:
        try:
            if isinstance(job, _FrameJob):
                self._keep_frame(job)
            elif isinstance(job, _EventJob):
                self._record_event(job)
        except Exception as exc:  # one bad frame or a full disk must not stop the recording
            self._failed()
            now = self._clock()
            if now >= self._next_failure_log_s:  # a broken stream fails at `clips.fps`
                self._next_failure_log_s = now + _DROP_LOG_INTERVAL_S
                logger.warning("media: a job failed (%s); %d so far", exc, self.stats().failed)
        finally:
            self._job_done()

    def _record_event(self, job: _EventJob) -> None:
        context, frame = job.context, job.frame
        config = self.config
        if job.snapshot is not None:
            self._write_picture(job.snapshot, partial(self._snapshot_jpeg, context, frame))
        if job.crop is not None:
            self._write_picture(job.crop, partial(self._crop_jpeg, context.event, frame))
        if job.clip is not None:
            clips = config.clips
            clip = PendingClip.around(
                context.event_id,
                frame.camera,
                job.clip,
                frame.capture_time_s,
                pre_s=clips.pre_s,
                post_s=clips.post_s,
                fps=clips.fps,
                deadline_s=self._clock() + clips.stall_timeout_s,
            )
            ring = self._rings.get(clip.camera)
            if ring is not None:
                clip.add_all(ring.since(clip.start_s - clip.period_s))
            if clip.complete:
                self._hand_over(clip)
            else:
                self._pending.append(clip)
                self._pending_changed(1)

    def _write_picture(self, path: Path, make: Callable[[], bytes]) -> None:
        try:
            size = write_atomic(path, make())
        except Exception:  # the clip may still come out
            self._failed()
            logger.exception("media: cannot write %s", path.name)
            return
        self._wrote(size)

    def _snapshot_jpeg(self, context: EventContext, frame: CapturedFrame) -> bytes:
        image = frame.image
        if context.camera is not None:
            event = context.event
            image = annotate(
                image,
                context.camera,
                context.detections,
                context.class_names,
                highlight=event.box,
                highlight_text=_event_text(event),
            )
        return encode_jpeg(image, self.config.jpeg_quality)

    def _crop_jpeg(self, event: RuleEvent, frame: CapturedFrame) -> bytes:
        part = None
        if event.box is not None:
            part = crop_box(frame.image, event.box, self.config.crop_margin)
        if part is None:
            raise ValueError(f"the box {event.box} is outside the frame")
        return encode_jpeg(part, self.config.jpeg_quality)

    def _keep_frame(self, job: _FrameJob) -> None:
        frame = job.frame
        image = frame.image
        if not is_image(image):
            raise ValueError(f"camera {frame.camera}: frame {frame.index} is not a BGR image")
        if job.camera is not None:
            image = annotate(image, job.camera, job.detections, job.class_names)
        clips = self.config.clips
        small = fit_width(image, clips.max_width)
        jpeg = encode_jpeg(small, self.config.jpeg_quality)
        encoded = EncodedFrame(frame.capture_time_s, jpeg, (small.shape[1], small.shape[0]))
        ring = self._rings.get(frame.camera)
        if ring is None:
            ring = self._rings[frame.camera] = FrameRing(clips.pre_s + 1.0 / clips.fps)
        ring.add(encoded)
        deadline_s = self._clock() + clips.stall_timeout_s  # the camera is still sending
        for clip in self._pending:
            if clip.camera == frame.camera:
                clip.add(encoded)
                clip.deadline_s = deadline_s
        self._hand_over_complete()

    def _finish_stalled_clips(self) -> None:
        now = self._clock()
        for clip in self._pending:
            if now >= clip.deadline_s:
                clip.complete = True
        self._hand_over_complete()

    def _hand_over_complete(self) -> None:
        done = [c for c in self._pending if c.complete]
        if not done:
            return
        self._pending = [c for c in self._pending if not c.complete]
        for clip in done:
            self._hand_over(clip)
        self._pending_changed(-len(done))  # after: `wait_idle` sees the clips queued

    def _hand_over(self, clip: PendingClip) -> None:
        if not clip.frames:
            logger.warning("media: no frames for the clip of event %s", clip.event_id)
            self._failed()
            return
        with self._lock:
            self._outstanding += 1
        try:
            self._clip_jobs.put_nowait(clip)
        except queue.Full:
            self._job_done()
            self._note_drop(frame=False)

    def _sweep_if_due(self) -> None:
        now = self._clock()
        if now < self._next_sweep_s:
            return
        self._next_sweep_s = now + self.config.sweep_interval_s
        config = self.config
        try:
            result = sweep(
                self.root,
                now,
                config.retention_days * _DAY_S,
                int(config.max_disk_mb * _MIB),
            )
        except Exception:  # retention failing must not stop the recording
            logger.exception("media retention sweep failed")
            return
        if result.deleted:
            with self._lock:
                self._counts.deleted += result.deleted
                self._counts.deleted_bytes += result.deleted_bytes
            logger.info(
                "media retention: deleted %d file(s), %.1f MiB; %.1f MiB kept",
                result.deleted,
                result.deleted_bytes / _MIB,
                result.kept_bytes / _MIB,
            )

    # ---- the clip writer -----------------------------------------------------------------------

    def _run_clip_writer(self) -> None:
        _lower_priority(self.config.worker_niceness)
        clips = self.config.clips
        while True:
            try:
                clip = self._clip_jobs.get(timeout=_POLL_S)
            except queue.Empty:
                if self._worker_done.is_set() and self._clip_jobs.empty():
                    return
                continue
            try:
                size = write_clip(clip.path, clip.frames, clips.fps, clips.codec)
                self._wrote(size)
            except Exception:
                self._failed()
                logger.exception("media: cannot write the clip of event %s", clip.event_id)
            finally:
                self._job_done()


def _event_text(event: RuleEvent) -> str:
    """The caption of the event's box: rule, object and track."""
    what = event.label if event.label is not None else ""
    track = f" #{event.track_id}" if event.track_id >= 0 else ""
    return f"{event.rule}: {what}{track}".rstrip(": ")


def _lower_priority(niceness: int) -> None:
    """Give the calling thread (Linux: nice is per thread) the nice value `niceness`."""
    if niceness <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except OSError as exc:  # e.g. already nicer than that in a container that forbids it
        logger.debug("media: cannot renice the %s thread: %s", threading.current_thread(), exc)
