"""Config of the cloud service (one YAML per service)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from configkit.base import StrictModel
from configkit.common import MetricsConfig
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at
from detection.config import DetectorConfig
from detection.runtimes.config import TensorRTConfig
from detection.slicing import SlicingConfig


class TlsConfig(StrictModel):
    """Server TLS; with `client_ca_path` set, clients must present a certificate (mutual TLS)."""

    cert_path: Path = Field(description="PEM certificate chain of the server.")
    key_path: Path = Field(description="PEM private key of the server.")
    client_ca_path: Path | None = Field(
        default=None, description="PEM CA bundle that client certificates must chain to (mTLS)."
    )


class ServerConfig(StrictModel):
    """gRPC listener: address, message limits, keepalive, TLS, auth and shutdown grace."""

    @model_validator(mode="after")
    def _one_token_source(self) -> Self:
        if self.auth_tokens_env is not None and self.auth_tokens_credential is not None:
            raise ValueError("set at most one of `auth_tokens_env` or `auth_tokens_credential`")
        return self

    @property
    def auth_tokens(self) -> SecretRef | None:
        """Where the bearer tokens come from; none: no auth."""
        if self.auth_tokens_env is not None:
            return SecretRef(env=self.auth_tokens_env)
        if self.auth_tokens_credential is not None:
            return SecretRef(credential=self.auth_tokens_credential)
        return None

    listen_address: str = Field(
        default="127.0.0.1:50051",
        pattern=r"^.+:\d{1,5}$",
        description="host:port to bind; port 0 picks a free port (tests).",
    )
    max_receive_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description=(
            "Largest request the transport takes. Keep it well above `decoder.max_jpeg_bytes`: "
            "a frame between the two is answered INVALID_ARGUMENT and its stream goes on, while "
            "one above this ends the whole stream with RESOURCE_EXHAUSTED (gRPC's own check)."
        ),
    )
    max_send_message_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="Largest reply."
    )
    max_concurrent_streams: int = Field(
        default=256, ge=1, le=100_000, description="HTTP/2 streams per connection."
    )
    worker_threads: int = Field(
        default=64,
        ge=1,
        le=4096,
        description=(
            "Threads serving RPC handlers. Each open frame stream (one per edge agent) holds one "
            "for its whole life, so this bounds the agents a replica serves."
        ),
    )
    reserved_threads: int = Field(
        default=4,
        ge=0,
        le=1024,
        description=(
            "Threads kept for short calls (health checks, reflection, DetectFrame): at most "
            "`worker_threads - reserved_threads` frame streams (at least 1) are open at once; "
            "one more is refused RESOURCE_EXHAUSTED at once, so a full replica still answers "
            "its health checks and a balancer places the stream on another replica."
        ),
    )

    @property
    def max_frame_streams(self) -> int:
        """Frame streams served at once (`worker_threads - reserved_threads`, at least 1)."""
        return max(1, self.worker_threads - self.reserved_threads)

    keepalive_time_ms: int = Field(
        default=30_000, ge=1000, le=3_600_000, description="Ping an idle connection this often."
    )
    keepalive_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        le=600_000,
        description="Drop the connection if a ping is unanswered.",
    )
    grace_period_s: float = Field(
        default=10.0, ge=0.0, le=600.0, description="Drain time for in-flight work on shutdown."
    )
    max_connection_age_s: float = Field(
        default=300.0,
        ge=0.0,
        le=86_400.0,
        description=(
            "Connections older than this (+-10 % jitter) are asked to go away (HTTP/2 GOAWAY), so "
            "clients re-resolve and long-lived streams spread onto replicas added since; 0: never."
        ),
    )
    max_connection_age_grace_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3_600.0,
        description=(
            "How long the streams of a connection asked to go away may still run before they "
            "are cancelled; the edge client moves to a new stream well before (it rotates on "
            "GOAWAY) and resends what was unanswered."
        ),
    )
    tls: TlsConfig | None = Field(default=None, description="TLS; none serves plaintext.")
    auth_tokens_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Environment variable holding comma-separated bearer tokens; none: no auth.",
    )
    auth_tokens_credential: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.@-]+$",
        description=(
            "systemd credential (file `$CREDENTIALS_DIRECTORY/<name>`) holding comma-separated "
            "bearer tokens; an alternative to `auth_tokens_env`."
        ),
    )
    reflection: bool = Field(default=True, description="Serve gRPC server reflection.")


class BatchingConfig(StrictModel):
    """Dynamic batcher: how large a batch may grow and how long a frame may wait for one.

    Queues and fairness are per stream key (agent_id, camera_id): one agent's gRPC stream carries
    several cameras, and each camera is queued and served round-robin on its own.
    """

    max_batch_size: int = Field(default=16, ge=1, le=256, description="Largest batch run at once.")
    preferred_batch_sizes: list[int] = Field(
        default_factory=list,
        max_length=256,
        description="Batch sizes to prefer (engine profiles), increasing; empty: any size.",
    )
    max_queue_delay_ms: float = Field(
        default=5.0, ge=0.0, le=1_000.0, description="Longest a frame waits for a fuller batch."
    )
    max_queue_frames: int = Field(
        default=1_024,
        ge=1,
        le=1_000_000,
        description="Frames queued across all streams; beyond it: RESOURCE_EXHAUSTED.",
    )
    per_stream_queue_frames: int = Field(
        default=64,
        ge=1,
        le=1_000_000,
        description="Frames queued per stream, so one busy camera cannot starve the others.",
    )
    default_deadline_ms: int = Field(
        default=1_000,
        ge=1,
        le=600_000,
        description="Deadline of a frame whose request carries none; late frames are dropped.",
    )
    max_stream_inflight_frames: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description=(
            "Frames of one gRPC stream submitted but not yet sent back; beyond it the server "
            "stops reading that stream (HTTP/2 flow control). Queue bounds are per camera."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        sizes = self.preferred_batch_sizes
        for index, size in enumerate(sizes):
            if not 1 <= size <= self.max_batch_size:
                raise config_error_at(
                    ("preferred_batch_sizes", index),
                    f"preferred batch size {size} is outside 1..max_batch_size "
                    f"({self.max_batch_size})",
                )
            if index and size <= sizes[index - 1]:
                raise config_error_at(
                    ("preferred_batch_sizes", index),
                    "preferred_batch_sizes must be strictly increasing",
                )
        if self.per_stream_queue_frames > self.max_queue_frames:
            raise config_error_at(
                ("per_stream_queue_frames",),
                f"per_stream_queue_frames ({self.per_stream_queue_frames}) exceeds "
                f"max_queue_frames ({self.max_queue_frames})",
            )
        return self


VideoCodec = Literal["h264", "hevc"]
_VIDEO_CODECS: tuple[VideoCodec, ...] = ("h264", "hevc")


class VideoUplinkConfig(StrictModel):
    """Decoding the edges' video uplink (`FrameRequest.video`): a decoder per camera session."""

    codecs: list[VideoCodec] = Field(
        default_factory=lambda: list(_VIDEO_CODECS),
        max_length=2,
        description=(
            "Codecs announced to edge agents at the start of each stream and decoded; empty: "
            "this replica takes JPEG only (agents then send JPEG)."
        ),
    )
    max_sessions: int = Field(
        default=1_024,
        ge=1,
        le=1_000_000,
        description=(
            "Decoders kept (one per camera of each connected agent); past it the least recently "
            "used is dropped and its camera's next frame is answered `keyframe_required`."
        ),
    )
    session_idle_s: float = Field(
        default=300.0,
        gt=0.0,
        le=86_400.0,
        description="A decoder unused this long is dropped.",
    )
    max_packet_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1_024,
        le=256 * 1024 * 1024,
        description="Largest video packet accepted.",
    )


class DecoderConfig(StrictModel):
    """JPEG decoding of incoming frames: batched NVJPEG on the GPU or a CPU codec."""

    type: Literal["cpu", "nvjpeg"] = Field(
        default="cpu", description="`nvjpeg` decodes on the GPU; `cpu` is the fallback."
    )
    threads: int = Field(
        default=4,
        ge=1,
        le=256,
        description="CPU codec: decoding threads; nvImageCodec: its CPU (parsing) threads.",
    )
    cpu_codec: Literal["auto", "simplejpeg", "turbojpeg", "opencv"] = Field(
        default="auto",
        description="CPU codec; `auto` is simplejpeg where installed, else OpenCV.",
    )
    nvjpeg_backend: Literal["auto", "nvimgcodec", "torchvision"] = Field(
        default="auto",
        description="GPU decoder library; `auto` tries nvImageCodec, then torchvision.",
    )
    device_id: int = Field(default=0, ge=0, le=63, description="CUDA device of the GPU decoder.")
    fallback_to_cpu: bool = Field(
        default=True,
        description="If the GPU decoder cannot start: decode on the CPU (logged), not fail.",
    )
    max_image_pixels: int = Field(
        default=3840 * 2160,
        ge=1,
        le=100_000_000,
        description="Reject frames larger than this (width x height), before decoding them.",
    )
    max_jpeg_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1_024,
        le=256 * 1024 * 1024,
        description="Largest JPEG accepted.",
    )
    video: VideoUplinkConfig = Field(
        default_factory=VideoUplinkConfig,
        description="The video uplink: whole frames as packets of a per-camera H.264/HEVC stream.",
    )


class CloudMetricsConfig(MetricsConfig):
    """The Prometheus endpoint, and how many client-chosen label values it keeps."""

    max_stream_labels: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description=(
            "Distinct (agent_id, camera_id) label pairs of `frames_total` at once; a new pair "
            "past that takes the slot of one silent for `stream_label_idle_s`, else counts as "
            "`other`, so no client can grow the series without bound."
        ),
    )
    stream_label_idle_s: float = Field(
        default=600.0,
        ge=0.0,
        le=86_400.0,
        description=(
            "Silence after which a stream key's label slot may go to a new key (its series "
            "are removed); 0: the least recently answered key always makes room."
        ),
    )


class CandidateConfig(StrictModel):
    """A candidate model taking a share of the traffic next to `engine` (an A/B test, a canary).

    Which frames go to it is decided by a stable hash, so an agent (or a frame) always lands on
    the same side while the share stays the same; answers carry the candidate's name and
    version, and the metrics count frames per model version.
    """

    engine: DetectorConfig = Field(
        description="The candidate detector: another model file, or another Triton version."
    )
    share: float = Field(
        gt=0.0, le=1.0, description="Fraction of agents (or frames) answered by the candidate."
    )
    assign_by: Literal["agent", "frame"] = Field(
        default="agent",
        description=(
            "`agent`: every frame of an agent goes to the same model (tracks stay consistent); "
            "`frame`: each frame is assigned on its own (a finer split on few agents)."
        ),
    )
    model_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Name reported with the candidate's answers; none: from its model.",
    )
    model_version: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$",
        description="Version reported with the candidate's answers; none: from its model.",
    )

    @field_validator("engine")
    @classmethod
    def _fixed_input_unless_asked(cls, engine: DetectorConfig) -> DetectorConfig:
        return fixed_letterbox_unless_asked(engine)


def fixed_letterbox_unless_asked(engine: DetectorConfig) -> DetectorConfig:
    """`engine` with `letterbox: fixed` unless the config set `letterbox` itself.

    Frames from many cameras batch together in the cloud: one input shape keeps batches whole
    (and TensorRT engines on one profile).
    """
    if "letterbox" in engine.model_fields_set:
        return engine
    return engine.model_copy(update={"letterbox": "fixed"})


class TtaConfig(StrictModel):
    """Test-time augmentation of the cloud detector: the frame is also detected mirrored."""

    flip: bool = Field(
        default=False,
        description=(
            "Also detect on the horizontally mirrored frame (boxes mapped back) and merge both "
            "answers per class, the more confident box kept: two passes, about 1.5x the time "
            "per frame on CPU. Against the hand-verified truth at 480x640, mAP50 0.86 against "
            "0.85 (bench.models.cloud_truth)."
        ),
    )
    merge_iou: float = Field(
        default=0.55,
        gt=0.0,
        le=1.0,
        description="IoU above which a box and a box of the same class in the mirror's answer "
        "are one object.",
    )


class CloudServiceConfig(StrictModel):
    """Config of one cloud service replica: gRPC server, batching, decoding, engine, metrics."""

    server: ServerConfig = Field(default_factory=ServerConfig, description="gRPC listener.")
    batching: BatchingConfig = Field(
        default_factory=BatchingConfig, description="Dynamic batching across streams."
    )
    decoder: DecoderConfig = Field(default_factory=DecoderConfig, description="JPEG decoding.")
    engine: DetectorConfig = Field(description="The cloud detector (large model).")
    slicing: SlicingConfig = Field(
        default_factory=SlicingConfig,
        description="Sliced inference: whole frames also run as native-scale tiles (off).",
    )
    tta: TtaConfig = Field(
        default_factory=TtaConfig,
        description="Test-time augmentation: the mirrored frame too (off).",
    )
    model_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description=(
            "Model name reported with every answer; none: the model's `model_name` metadata, "
            "else its file name without the extension."
        ),
    )
    model_version: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$",
        description=(
            "Model version reported with every answer; none: on a `triton` engine the version "
            "Triton answered with (it follows Triton's swaps), else the model's `model_version` "
            'metadata, else "1".'
        ),
    )
    metrics: CloudMetricsConfig = Field(
        default_factory=lambda: CloudMetricsConfig(listen_port=9109),
        description="Prometheus metrics endpoint.",
    )

    candidate: CandidateConfig | None = Field(
        default=None,
        description="A second model answering a share of the frames (A/B test); none: off.",
    )

    @field_validator("engine")
    @classmethod
    def _fixed_input_unless_asked(cls, engine: DetectorConfig) -> DetectorConfig:
        return fixed_letterbox_unless_asked(engine)

    @model_validator(mode="after")
    def _check_across_sections(self) -> Self:
        engines = [("engine", self.engine)]
        if self.candidate is not None:
            engines.append(("candidate.engine", self.candidate.engine))
        for where, engine in engines:
            runtime = engine.runtime
            if isinstance(runtime, TensorRTConfig) and self.batching.max_batch_size > (
                runtime.max_batch_size
            ):
                raise config_error_at(
                    ("batching", "max_batch_size"),
                    f"batching.max_batch_size ({self.batching.max_batch_size}) exceeds the "
                    f"engine's {where}.runtime.max_batch_size ({runtime.max_batch_size})",
                )
        if self.decoder.max_jpeg_bytes > self.server.max_receive_message_bytes:
            raise config_error_at(
                ("decoder", "max_jpeg_bytes"),
                f"decoder.max_jpeg_bytes ({self.decoder.max_jpeg_bytes}) exceeds "
                f"server.max_receive_message_bytes ({self.server.max_receive_message_bytes})",
            )
        return self

    def summary(self, served: str | None = None) -> str:
        """One line for `validate-config` and start-up; a name or version left to the model
        reads `<metadata>` unless `served` gives what the loaded models say (`name:version`)."""
        name = self.model_name or "<metadata>"
        version = self.model_version or "<metadata>"
        return (
            f"model {served or f'{name}:{version}'} on {self.engine.runtime.type}, "
            f"decoder {self.decoder.type}, max batch {self.batching.max_batch_size}, "
            f"listening on {self.server.listen_address}"
        )
