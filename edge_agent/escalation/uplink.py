"""The video uplink: one camera's escalated whole frames as an inter-coded H.264/HEVC stream.

Only escalated frames are encoded, in the order they are sent, so each one is coded against the
previous one; a fixed camera's background then costs next to nothing after the first keyframe
(bench.hybrid.uplink: about a tenth of the camera's own H.264 stream where independent JPEGs cost
more than all of it). Why PyAV: its wheels bundle FFmpeg with libx264 and libx265, so the edge needs
no system FFmpeg, and it exposes the codec context packet by packet (no container, no pipes),
which is what a per-frame request needs.

A session is one run of the encoder: it starts with a keyframe that carries the parameter sets
and numbers its packets 0, 1, 2, ... The cloud keeps a decoder per session. A new session (a
keyframe) starts when the stream to the cloud is new, when the cloud says it lost a reference
(`FrameResult.keyframe_required`), when a sent packet failed, when the picture size changes,
after `keyframe_interval_s`, and when the byte budget calls for another quality: the CRF is
chosen anew at each session start from the rate measured in the last one (+6 CRF is about half
the bytes), between `crf` and `max_crf`.

Pure apart from the codec: the caller passes `now` (monotonic seconds).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.config.uplink import UplinkConfig

logger = logging.getLogger(__name__)

PYAV_INSTALLED = importlib.util.find_spec("av") is not None
"""PyAV comes with the `edge` extra; without it the uplink is JPEG (said once)."""

BgrImage = npt.NDArray[np.uint8]

_ENCODERS = {"h264": "libx264", "hevc": "libx265"}
_TIME_BASE = Fraction(1, 1000)  # packet timestamps in milliseconds of the edge's clock
_RATE_SMOOTHING = 0.2
_CRF_PER_HALVING = 6.0  # x264/x265: +6 CRF is about half the bytes
_RESTART_OVER_BUDGET = 2.0  # restart early (new CRF) when the rate is this far over budget
_MIN_PACKETS_FOR_RATE = 4


class UplinkEncodeError(RuntimeError):
    """The encoder failed on a frame (the frame then goes as JPEG)."""


@dataclass(frozen=True)
class EncodedPacket:
    """One encoded escalated frame: `FrameRequest.video`'s fields, and the CRF it used."""

    codec: str
    data: bytes
    keyframe: bool
    session: str
    sequence: int
    width: int
    height: int
    crf: int


def coded_size(width: int, height: int, max_width: int) -> tuple[int, int]:
    """The picture size the encoder codes a `width` x `height` frame at: at most `max_width`
    wide (0: no limit), height in proportion, both even (4:2:0 chroma)."""
    if width < 2 or height < 2:
        raise UplinkEncodeError(f"cannot encode a {width}x{height} frame")
    if max_width and width > max_width:
        height = round(height * max_width / width)
        width = max_width
    return max(2, width - width % 2), max(2, height - height % 2)


class _Session:
    """An open encoder context and where its stream stands."""

    def __init__(self, codec: str, width: int, height: int, crf: int, config: UplinkConfig) -> None:
        import av  # lazy: optional: only where the video uplink is used

        self.id = uuid.uuid4().hex[:16]
        self.width, self.height, self.crf = width, height, crf
        self.next_sequence = 0  # also the packets encoded so far
        context = av.CodecContext.create(_ENCODERS[codec], "w")
        assert isinstance(context, av.VideoCodecContext)  # noqa: S101 - a video encoder name
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = _TIME_BASE
        context.options = _encoder_options(codec, crf, config.preset)
        self.context = context
        self.last_pts = -1

    def encode(self, image: BgrImage, pts: int, keyframe: bool) -> bytes:
        import av  # lazy: loaded by the constructor already

        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts = max(pts, self.last_pts + 1)  # strictly increasing, whatever the clock did
        self.last_pts = frame.pts
        if keyframe:
            frame.pict_type = av.video.frame.PictureType.I
        packets = self.context.encode(frame)
        # zero latency, no B-frames: one packet per frame, at once
        return b"".join(bytes(p) for p in packets)


def _encoder_options(codec: str, crf: int, preset: str) -> dict[str, str]:
    """Low-latency settings: no B-frames, no lookahead, no scene-cut keyframes (keyframes are
    the caller's), parameter sets repeated on every keyframe so a decoder can start at any."""
    if codec == "h264":
        return {
            "preset": preset,
            "tune": "zerolatency",
            "crf": str(crf),
            "bf": "0",
            "g": "1000000",
            "keyint_min": "1000000",
            "sc_threshold": "0",
            "x264-params": "repeat-headers=1:scenecut=0",
        }
    return {
        "preset": preset,
        "tune": "zerolatency",
        "crf": str(crf),
        "x265-params": (
            "bframes=0:keyint=1000000:min-keyint=1000000:scenecut=0:repeat-headers=1:"
            "log-level=error"
        ),
    }


class VideoUplinkEncoder:
    """One camera's escalated frames as a video stream (see the module docstring).

    `budget_bytes_per_s` is the camera's byte budget the quality follows.
    """

    def __init__(
        self,
        config: UplinkConfig,
        *,
        budget_bytes_per_s: float,
    ) -> None:
        if config.codec == "jpeg":
            raise ValueError("the jpeg uplink has no video encoder")
        if budget_bytes_per_s <= 0:
            raise ValueError(f"budget_bytes_per_s must be > 0, got {budget_bytes_per_s}")
        self.codec = config.codec
        self._config = config
        self._budget = float(budget_bytes_per_s)
        self._session: _Session | None = None
        self._session_started_s = 0.0
        self._crf = config.crf
        self._rate_bytes_per_s: float | None = None  # P-frame bytes per second of the last run
        self._last_packet_s: float | None = None

    @property
    def crf(self) -> int:
        """The CRF of the current (or next) session."""
        return self._crf

    @property
    def session(self) -> str | None:
        """The current session id; None before the first frame and after `restart`."""
        return None if self._session is None else self._session.id

    def restart(self) -> None:
        """Start a new session with the next frame (a new stream, a lost packet)."""
        self._end_session()

    def keyframe_required(self, session: str) -> None:
        """The cloud could not decode a packet of `session`, or it was never answered: the
        next frame starts a new session, unless one started since anyway."""
        current = self._session
        if current is not None and current.id == session:
            self._end_session()

    def encode(self, image: BgrImage, now: float) -> EncodedPacket:
        """Encode one escalated frame (BGR) at `now` (monotonic seconds); raises
        `UplinkEncodeError` (the session is then ended: the next frame is a keyframe)."""
        import av  # lazy: optional: the edge extra brings it (PYAV_INSTALLED)

        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise UplinkEncodeError(f"expected a BGR uint8 image, got {image.shape} {image.dtype}")
        height, width = image.shape[:2]
        coded_w, coded_h = coded_size(width, height, self._config.max_width)
        session = self._session
        if session is not None and self._should_restart(session, coded_w, coded_h, now):
            self._end_session()
            session = None
        try:
            if session is None:
                self._crf = self._next_crf()
                session = _Session(self.codec, coded_w, coded_h, self._crf, self._config)
                self._session, self._session_started_s = session, now
                logger.debug(
                    "uplink %s session %s: %dx%d at CRF %d",
                    self.codec, session.id, coded_w, coded_h, self._crf,
                )  # fmt: skip
            keyframe = session.next_sequence == 0
            picture: BgrImage = image
            if (coded_w, coded_h) != (width, height):
                resized = cv2.resize(image, (coded_w, coded_h), interpolation=cv2.INTER_AREA)
                picture = np.asarray(resized, dtype=np.uint8)
            data = session.encode(np.ascontiguousarray(picture), round(now * 1000.0), keyframe)
        except (av.FFmpegError, ValueError, OSError, MemoryError) as exc:
            self._end_session()
            raise UplinkEncodeError(f"{self.codec} encoder failed: {exc}") from exc
        if not data:
            self._end_session()
            raise UplinkEncodeError(f"{self.codec} encoder returned no packet for a frame")
        packet = EncodedPacket(
            codec=self.codec,
            data=data,
            keyframe=keyframe,
            session=session.id,
            sequence=session.next_sequence,
            width=coded_w,
            height=coded_h,
            crf=session.crf,
        )
        session.next_sequence += 1
        self._observe_rate(len(data), keyframe, now)
        return packet

    # -- internals --------------------------------------------------------------------------

    def _should_restart(self, session: _Session, width: int, height: int, now: float) -> bool:
        if (width, height) != (session.width, session.height):
            return True
        if now - self._session_started_s >= self._config.keyframe_interval_s:
            return True
        rate = self._rate_bytes_per_s
        over = rate is not None and rate > _RESTART_OVER_BUDGET * self._budget
        # quality falls early when far over budget (one keyframe buys every later frame cheaper)
        enough = session.next_sequence >= _MIN_PACKETS_FOR_RATE
        return over and enough and session.crf < self._config.max_crf

    def _next_crf(self) -> int:
        """The CRF for a new session: the configured one, raised while the measured rate of
        the last session was over the camera's byte budget (lowered back as it falls under)."""
        rate = self._rate_bytes_per_s
        if rate is None or rate <= 0.0:
            return self._crf
        step = _CRF_PER_HALVING * math.log2(rate / self._budget)
        wanted = self._crf + math.ceil(step) if step > 0 else self._crf + math.floor(step / 2)
        return int(min(max(wanted, self._config.crf), self._config.max_crf))

    def _observe_rate(self, n_bytes: int, keyframe: bool, now: float) -> None:
        """Running estimate of the P-frame bytes per second (keyframes are rare by design)."""
        last, self._last_packet_s = self._last_packet_s, now
        if keyframe or last is None or now <= last:
            return
        # bytes per second at the rate frames are being escalated
        sample = n_bytes / max(now - last, 1e-3)
        previous = self._rate_bytes_per_s
        self._rate_bytes_per_s = (
            sample
            if previous is None
            else (1 - _RATE_SMOOTHING) * previous + _RATE_SMOOTHING * sample
        )

    def _end_session(self) -> None:
        self._session = None  # the encoder is freed with its last reference


@dataclass
class UplinkCounters:
    """What the uplink did, for the status line, the demo summary and benchmarks."""

    video_frames: int = 0
    keyframes: int = 0
    video_bytes: int = 0
    jpeg_not_announced: int = 0  # the replica did not announce the codec
    jpeg_encoder_failed: int = 0
    keyframes_asked: int = 0  # the cloud answered keyframe_required, or a packet got no answer


UplinkKind = Literal["keyframe", "inter", "jpeg_not_announced", "jpeg_encoder_failed"]
"""How a whole frame went: a video keyframe or inter frame, or JPEG and why."""


class CameraUplinks:
    """Every camera's video uplink: which whole frames go as video packets, and when a camera's
    stream starts again with a keyframe (a new gRPC stream, a packet the cloud could not decode
    or never answered, a packet that could not be sent).

    Not thread-safe: one escalation encoder thread calls `encode`/`sent`/`unsent`, and the
    frame loop calls `answered` under the stage's lock.
    """

    def __init__(
        self,
        config: UplinkConfig,
        *,
        camera_budget_bytes_per_s: float,
        on_frame: Callable[[str, UplinkKind], None] | None = None,
    ) -> None:
        if config.codec != "jpeg" and not PYAV_INSTALLED:
            logger.warning(
                "escalation.uplink.codec is %s but PyAV (the `av` package, in the edge extra) is "
                "not installed: escalated frames go as JPEG",
                config.codec,
            )
            config = config.model_copy(update={"codec": "jpeg"})
        self.config = config
        self.counters = UplinkCounters()
        self._budget = camera_budget_bytes_per_s
        self._encoders: dict[str, VideoUplinkEncoder] = {}
        self._stream_ids: dict[str, int] = {}
        self._in_flight: dict[str, tuple[str, str]] = {}  # request id -> (camera, session)
        self._failed_cameras: set[str] = set()
        self._on_frame = on_frame

    @property
    def enabled(self) -> bool:
        """Whether whole frames go as video at all (`codec` is not `jpeg`)."""
        return self.config.codec != "jpeg"

    def encode(
        self, camera: str, image: BgrImage, now: float, *, stream_id: int, codecs: frozenset[str]
    ) -> EncodedPacket | None:
        """The packet of one escalated whole frame, or None when it goes as JPEG (the replica
        does not announce the codec, or the encoder failed: logged once per camera)."""
        if not self.enabled:
            return None
        if self.config.codec not in codecs:
            self.counters.jpeg_not_announced += 1
            self._observe(camera, "jpeg_not_announced")
            return None
        encoder = self._encoders.get(camera)
        if encoder is None:
            encoder = VideoUplinkEncoder(self.config, budget_bytes_per_s=self._budget)
            self._encoders[camera] = encoder
        if self._stream_ids.get(camera) != stream_id:
            encoder.restart()  # a new stream may reach another replica: start with a keyframe
            self._stream_ids[camera] = stream_id
        try:
            packet = encoder.encode(image, now)
        except UplinkEncodeError as exc:
            self.counters.jpeg_encoder_failed += 1
            self._observe(camera, "jpeg_encoder_failed")
            log = logger.debug if camera in self._failed_cameras else logger.warning
            self._failed_cameras.add(camera)
            log("camera %s: %s; this frame goes as JPEG", camera, exc)
            return None
        self._failed_cameras.discard(camera)
        self.counters.video_frames += 1
        self.counters.video_bytes += len(packet.data)
        self.counters.keyframes += int(packet.keyframe)
        self._observe(camera, "keyframe" if packet.keyframe else "inter")
        return packet

    def sent(self, request_id: str, camera: str, packet: EncodedPacket) -> None:
        """A packet went out under `request_id`: its answer (or its failure) comes back."""
        self._in_flight[request_id] = (camera, packet.session)

    def unsent(self, camera: str, packet: EncodedPacket) -> None:
        """A packet could not be sent: the cloud will miss it, so the camera starts again."""
        self._restart(camera, packet.session)

    def answered(self, request_id: str, *, answered: bool, keyframe_required: bool) -> None:
        """The outcome of a sent request. Without an answer the cloud may or may not have
        decoded the packet, so the camera starts again as when the cloud asks for it."""
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return
        if keyframe_required or not answered:
            self.counters.keyframes_asked += 1
            self._restart(*entry)

    def _restart(self, camera: str, session: str) -> None:
        encoder = self._encoders.get(camera)
        if encoder is not None:
            encoder.keyframe_required(session)

    def _observe(self, camera: str, kind: UplinkKind) -> None:
        if self._on_frame is not None:
            self._on_frame(camera, kind)
