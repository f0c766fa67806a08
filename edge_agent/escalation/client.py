"""Asynchronous escalation client: one `StreamFrames` stream per agent, off the frame loop.

`submit` never blocks: it queues a frame or refuses it (window or queue full, not connected).
A background thread keeps the stream open, reopens it with jittered exponential back-off when
it breaks, and hands every frame exactly one `EscalationResult`: the cloud's answer, or a local
failure (answer overdue, stream broke for good, client closed) with its reason.

Streams move between cloud replicas without losing frames:
- When the connection under the stream is asked to go away (the server's `max_connection_age`
  sends HTTP/2 GOAWAY; the channel leaves READY), the client *rotates*: it half-closes the old
  stream, which still delivers the answers of its frames in flight, and opens a new one (on a new
  connection, which the channel's load balancer places). Frames submitted meanwhile wait in the
  send queue; nothing is refused.
- When a stream that was answering breaks with UNAVAILABLE or INTERNAL (a replica died, a
  connection was cut after its grace, an Envoy in between reset the stream),
  the frames it left unanswered are sent once more on the next stream while their deadline
  allows, and the client reconnects at once if that stream had been healthy. An answer is
  delivered once: a second answer for the same request is counted as late and dropped.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from configkit.secrets import SecretError
from edge_agent.capture.backoff import Backoff
from edge_agent.config.escalation import EscalationConfig
from protos.analytics.v1 import analytics_pb2 as pb
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceStub
from protos.analytics.v1.timestamps import timestamp_from_seconds
from protos.analytics.v1.uplink import UPLINK_CODECS_METADATA_KEY

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_MS_PER_S = 1000.0
_CODES_BY_VALUE: dict[int, grpc.StatusCode] = {int(code.value[0]): code for code in grpc.StatusCode}
_OVERLOAD_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
# How a stream that was answering ends when its replica dies or its connection ages out:
# directly UNAVAILABLE; through Envoy the upstream reset arrives as INTERNAL (RST_STREAM).
_TRANSPORT_BREAK_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)


class EscalationClientError(RuntimeError):
    """The client cannot be set up (token or CA file unavailable)."""


class ClientState(enum.Enum):
    """Where the connection to the cloud stands."""

    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    BACKING_OFF = "backing_off"
    UNAUTHENTICATED = "unauthenticated"
    CLOSED = "closed"


@dataclass(frozen=True)
class EscalationResult:
    """The outcome of one submitted frame.

    `result` is the cloud's answer (its own per-frame `status` gives `code`), or None when the
    frame failed on the edge side: the stream broke, no answer came in time, the client closed.
    """

    camera_id: str
    frame_id: int
    request_id: str
    code: grpc.StatusCode
    message: str
    result: pb.FrameResult | None
    rtt_s: float | None

    @property
    def ok(self) -> bool:
        """The cloud answered with detections."""
        return self.code is grpc.StatusCode.OK and self.result is not None

    @property
    def overloaded(self) -> bool:
        """The cloud refused the frame for load (RESOURCE_EXHAUSTED / UNAVAILABLE)."""
        return self.result is not None and self.code in _OVERLOAD_CODES

    @property
    def queue_time_ms(self) -> float | None:
        """Time the frame waited in the cloud's queue; None without an answer."""
        return None if self.result is None else float(self.result.timings.queue_time_ms)


@dataclass(frozen=True)
class ClientStats:
    """Counters of an `EscalationClient`, for metrics and status.

    `answered` counts answers from the cloud (any status), `failed` frames that got none.
    """

    state: ClientState
    last_error: str | None
    sent: int
    answered: int
    failed: int
    dropped_full: int
    dropped_disconnected: int
    late_answers: int
    results_dropped: int
    reconnects: int
    in_flight: int
    rotations: int
    resent: int
    rtt_last_s: float | None
    rtt_samples_s: tuple[float, ...]


@dataclass
class _Counters:
    sent: int = 0
    answered: int = 0
    failed: int = 0
    dropped_full: int = 0
    dropped_disconnected: int = 0
    late_answers: int = 0
    results_dropped: int = 0
    reconnects: int = 0
    rotations: int = 0
    resent: int = 0


@dataclass
class _Pending:
    camera_id: str
    frame_id: int
    expires_at: float
    request: pb.FrameRequest
    sent_at: float | None = None
    resent: bool = False


ResultCallback = Callable[[EscalationResult], None]


def channel_options(config: EscalationConfig) -> list[tuple[str, int | str]]:
    """Load balancing, keepalive, reconnect back-off and message limits of the cloud channel."""
    connection = config.connection
    return [
        ("grpc.lb_policy_name", config.load_balancing),
        ("grpc.keepalive_time_ms", connection.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", connection.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", connection.reconnect_min_backoff_ms),
        ("grpc.min_reconnect_backoff_ms", connection.reconnect_min_backoff_ms),
        ("grpc.max_reconnect_backoff_ms", connection.reconnect_max_backoff_ms),
        ("grpc.max_send_message_length", connection.max_message_bytes),
        ("grpc.max_receive_message_length", connection.max_message_bytes),
    ]


def _status_code(value: int) -> grpc.StatusCode:
    return _CODES_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


class EscalationClient:
    """Sends frames to the cloud on one bidi stream and delivers one result per frame.

    Results go to `on_result` (called on the client's threads: keep it short and thread-safe)
    or, without one, to a bounded queue read with `poll_results`. `start` resolves the token and
    starts the background thread; `close` stops it and fails the frames still in flight.
    """

    def __init__(
        self,
        config: EscalationConfig,
        agent_id: str,
        *,
        on_result: ResultCallback | None = None,
        environ: Mapping[str, str] | None = None,
        credentials_dir: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] | None = None,
        rtt_samples_kept: int = 256,
    ) -> None:
        if config.cloud_address is None:
            raise EscalationClientError("escalation.cloud_address is not set")
        self._config = config
        self._agent_id = agent_id
        self._target = config.cloud_address
        self._on_result = on_result
        self._clock = clock
        self._wall_clock = wall_clock
        self._metadata = self._auth_metadata(config, environ, credentials_dir)
        self._credentials = self._channel_credentials(config)
        connection = config.connection
        self._backoff = Backoff(
            connection.reconnect_min_backoff_ms / _MS_PER_S,
            connection.reconnect_max_backoff_ms / _MS_PER_S,
            connection.reconnect_jitter_fraction,
            rng,
        )
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._connected_event = threading.Event()
        # One send queue per stream, so a retired stream's request iterator cannot take frames
        # meant for its successor; unbounded: `submit` enforces `send_queue_frames`, resent
        # frames may go above it.
        self._send_queue: queue.Queue[pb.FrameRequest] = queue.Queue()
        self._pending: dict[str, _Pending] = {}
        self._results: deque[EscalationResult] = deque()
        self._rtt: deque[float] = deque(maxlen=rtt_samples_kept)
        self._state = ClientState.IDLE
        self._last_error: str | None = None
        self._was_connected = False
        self._generation = 0
        self._stream_open = False
        self._rotating = False
        self._stream_answers = 0
        self._channel_ready = False
        self._streams_opened = 0
        self._uplink_codecs: frozenset[str] = frozenset()
        self._uplink_logged: bool | None = None
        self._call: grpc.RpcContext | None = None
        self._channel: grpc.Channel | None = None
        self._thread: threading.Thread | None = None
        self._counts = _Counters()

    @staticmethod
    def _auth_metadata(
        config: EscalationConfig,
        environ: Mapping[str, str] | None,
        credentials_dir: str | Path | None,
    ) -> tuple[tuple[str, str], ...]:
        if config.auth_token is None:
            return ()
        try:
            token = config.auth_token.resolve(
                environ if environ is not None else os.environ, credentials_dir
            ).strip()
        except SecretError as exc:
            raise EscalationClientError(f"escalation auth token: {exc}") from exc
        if not config.tls:
            logger.warning(
                "the escalation bearer token is sent without TLS to %s", config.cloud_address
            )
        return (("authorization", f"Bearer {token}"),)

    @staticmethod
    def _channel_credentials(config: EscalationConfig) -> grpc.ChannelCredentials | None:
        if not config.tls:
            return None
        root: bytes | None = None
        if config.tls_ca_path is not None:
            try:
                root = config.tls_ca_path.read_bytes()
            except OSError as exc:
                raise EscalationClientError(
                    f"escalation CA file {config.tls_ca_path}: {exc}"
                ) from exc
        return grpc.ssl_channel_credentials(root_certificates=root)

    # -- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Open the channel and start the stream thread (returns at once)."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the escalation client was already started")
            options = channel_options(self._config)
            if self._credentials is None:
                self._channel = grpc.insecure_channel(self._target, options=options)
            else:
                self._channel = grpc.secure_channel(self._target, self._credentials, options)
            self._state = ClientState.CONNECTING
            self._thread = threading.Thread(target=self._run, name="escalation-stream", daemon=True)
        self._channel.subscribe(self._on_connectivity, try_to_connect=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the stream; frames still in flight get a CANCELLED result."""
        self._closing.set()
        with self._lock:
            call, thread, channel = self._call, self._thread, self._channel
            self._set_state(ClientState.CLOSED)
        if call is not None:
            call.cancel()
        if thread is not None:
            thread.join(timeout_s)
        self._fail_pending(grpc.StatusCode.CANCELLED, "escalation client closed")
        if channel is not None:
            channel.unsubscribe(self._on_connectivity)
            channel.close()

    def __enter__(self) -> EscalationClient:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def submit(self, request: pb.FrameRequest) -> bool:
        """Queue `request` for the cloud; False (and counted) when it cannot go now.

        Never blocks. A request without `request_id` or `deadline` is copied and given one
        (a fresh id; now + `deadline_ms`). `request_id`s must be unique among frames in flight.
        """
        with self._lock:
            if self._state is not ClientState.CONNECTED:  # before copying a large request
                self._counts.dropped_disconnected += 1
                return False
        request = self._completed(request)
        max_in_flight = self._config.max_in_flight
        with self._lock:
            if self._state is not ClientState.CONNECTED:
                self._counts.dropped_disconnected += 1
                return False
            queued = self._send_queue.qsize()
            if (
                len(self._pending) >= max_in_flight
                or queued >= self._config.connection.send_queue_frames
            ):
                self._counts.dropped_full += 1
                return False
            if request.request_id in self._pending:
                raise ValueError(f"request_id {request.request_id!r} is already in flight")
            remaining_s = request.deadline.ToNanoseconds() / 1e9 - self._wall_clock()
            grace_s = self._config.connection.answer_grace_ms / _MS_PER_S
            self._pending[request.request_id] = _Pending(
                request.camera_id, request.frame_id, self._clock() + remaining_s + grace_s, request
            )
            self._send_queue.put_nowait(request)
        return True

    def poll_results(self, max_results: int | None = None) -> list[EscalationResult]:
        """Results delivered since the last poll, oldest first (none when `on_result` is set)."""
        out: list[EscalationResult] = []
        with self._lock:
            while self._results and (max_results is None or len(out) < max_results):
                out.append(self._results.popleft())
        return out

    @property
    def connected(self) -> bool:
        """The stream is open on a ready connection: `submit` accepts frames."""
        with self._lock:
            return self._state is ClientState.CONNECTED

    @property
    def stream_id(self) -> int:
        """Counts the streams opened so far: a change means a new stream (maybe to another
        replica), where a video uplink starts again with a keyframe."""
        with self._lock:
            return self._streams_opened

    @property
    def uplink_codecs(self) -> frozenset[str]:
        """Video codecs the replica of the current stream announced (empty: JPEG only, or not
        known yet)."""
        with self._lock:
            return self._uplink_codecs

    @property
    def in_flight(self) -> int:
        """Frames submitted and not yet answered or failed (queued to send included)."""
        with self._lock:
            return len(self._pending)

    def has_room(self) -> bool:
        """Whether `submit` would take a frame now (connected, window and queue not full): a
        frame is encoded only when it can go."""
        with self._lock:
            return (
                self._state is ClientState.CONNECTED
                and len(self._pending) < self._config.max_in_flight
                and self._send_queue.qsize() < self._config.connection.send_queue_frames
            )

    @property
    def state(self) -> ClientState:
        """The connection state."""
        with self._lock:
            return self._state

    def wait_connected(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` for the stream to be connected (start-up, tests)."""
        return self._connected_event.wait(timeout_s)

    def stats(self) -> ClientStats:
        """A snapshot of the counters."""
        with self._lock:
            counts = self._counts
            return ClientStats(
                state=self._state,
                last_error=self._last_error,
                sent=counts.sent,
                answered=counts.answered,
                failed=counts.failed,
                dropped_full=counts.dropped_full,
                dropped_disconnected=counts.dropped_disconnected,
                late_answers=counts.late_answers,
                results_dropped=counts.results_dropped,
                reconnects=counts.reconnects,
                in_flight=len(self._pending),
                rotations=counts.rotations,
                resent=counts.resent,
                rtt_last_s=self._rtt[-1] if self._rtt else None,
                rtt_samples_s=tuple(self._rtt),
            )

    # -- internals --------------------------------------------------------------------------

    def _completed(self, request: pb.FrameRequest) -> pb.FrameRequest:
        if request.request_id and request.HasField("deadline"):
            return request
        copy = pb.FrameRequest()
        copy.CopyFrom(request)
        if not copy.request_id:
            copy.request_id = uuid.uuid4().hex
        if not copy.HasField("deadline"):
            deadline_s = self._wall_clock() + self._config.deadline_ms / _MS_PER_S
            copy.deadline.CopyFrom(timestamp_from_seconds(deadline_s))
        if not copy.agent_id:
            copy.agent_id = self._agent_id
        return copy

    def _set_state(self, state: ClientState) -> None:
        """Change state (lock held); CLOSED is final."""
        if self._state is ClientState.CLOSED:
            return
        self._state = state
        if state is ClientState.CONNECTED:
            self._connected_event.set()
        else:
            self._connected_event.clear()

    def _on_connectivity(self, connectivity: grpc.ChannelConnectivity) -> None:
        with self._lock:
            was_ready = self._channel_ready
            self._channel_ready = connectivity is grpc.ChannelConnectivity.READY
            if self._channel_ready and self._stream_open:
                self._became_connected()
            elif not self._channel_ready and self._state is ClientState.CONNECTED:
                # only the fall from READY means "going away", not the states of a reconnect
                rotate = was_ready and self._stream_open and not self._closing.is_set()
                if rotate and not self._rotating:
                    self._rotate()
                elif not self._stream_open:
                    self._set_state(ClientState.CONNECTING)
                # else: a rotated stream waits for its new connection; frames queue meanwhile

    def _rotate(self) -> None:
        """Lock held: the connection goes away; drain the stream, queue frames for the next.

        The request iterator of the current stream returns (the call half-closes), the server
        answers what it was sent and ends the stream; `_run` then opens the next one at once.
        If the connection is really broken, the stream breaks instead and `_after_break` runs.
        """
        self._rotating = True
        self._generation += 1
        self._swap_send_queue()
        logger.info(
            "escalation connection to %s is going away: moving to a new stream", self._target
        )

    def _swap_send_queue(self) -> None:
        """Lock held: a fresh send queue for the next stream, with the frames not yet sent."""
        old, self._send_queue = self._send_queue, queue.Queue()
        while True:
            try:
                self._send_queue.put_nowait(old.get_nowait())
            except queue.Empty:
                return

    def _became_connected(self) -> None:
        """Lock held: the stream is open on a ready channel."""
        if self._state is ClientState.CONNECTED or self._closing.is_set():
            return
        self._set_state(ClientState.CONNECTED)
        self._was_connected = True
        # While the token is being rejected, every retry "connects" until the server's answer.
        retrying_auth = (self._last_error or "").startswith("UNAUTHENTICATED")
        log = logger.debug if retrying_auth else logger.info
        log("escalation stream to %s connected", self._target)

    def _run(self) -> None:
        channel = self._channel
        assert channel is not None  # noqa: S101 - set by start() before the thread runs
        stub = InferenceServiceStub(channel)
        while not self._closing.is_set():
            code, message = self._stream_once(stub)
            if self._closing.is_set():
                break
            if self._rotated(code):
                continue
            delay_s = self._after_break(code, message)
            self._closing.wait(delay_s)
            with self._lock:
                self._counts.reconnects += 1
                self._set_state(ClientState.CONNECTING)

    def _stream_once(self, stub: InferenceServiceStub) -> tuple[grpc.StatusCode, str]:
        """Run one stream until it ends; the status it ended with."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            requests = self._requests(generation, self._send_queue)
            call = stub.StreamFrames(requests, metadata=self._metadata)
            self._call = call
            self._stream_open = True
            self._stream_answers = 0
            self._streams_opened += 1
            self._uplink_codecs = frozenset()
            if self._channel_ready:
                self._became_connected()
        try:
            self._read_uplink_codecs(call)
            for result in call:
                self._on_answer(result)
            return grpc.StatusCode.OK, "the cloud ended the stream"
        except grpc.RpcError as exc:
            return exc.code(), str(exc.details() or "")
        except Exception as exc:  # keep the thread alive: a bug here must not stop escalation
            logger.exception("escalation stream failed unexpectedly")
            return grpc.StatusCode.UNKNOWN, repr(exc)
        finally:
            with self._lock:
                self._stream_open = False
                self._call = None
                if not self._rotating:  # a rotation retired the iterator and swapped the queue
                    self._generation += 1  # retire this stream's request iterator
                    self._swap_send_queue()
                    if self._state is ClientState.CONNECTED:
                        self._set_state(ClientState.CONNECTING)

    def _read_uplink_codecs(self, call: grpc.Call) -> None:
        """The codecs the replica announces at the start of the stream (see the .proto); an
        older replica sends none (its headers come with its first answer) and gets JPEG."""
        metadata = call.initial_metadata() or ()
        if not metadata and not call.is_active():  # the stream failed before the replica spoke
            return
        announced = next(
            (str(value) for key, value in metadata if key == UPLINK_CODECS_METADATA_KEY), ""
        )
        codecs = frozenset(c.strip() for c in announced.split(",") if c.strip())
        with self._lock:
            self._uplink_codecs = codecs
            wanted = self._config.uplink.codec
            takes_video = wanted == "jpeg" or wanted in codecs
            if takes_video == self._uplink_logged:
                return
            first, self._uplink_logged = self._uplink_logged is None, takes_video
        if takes_video and not first:
            logger.info("the cloud at %s takes the %s uplink again", self._target, wanted)
        elif not takes_video:
            logger.warning(
                "the cloud at %s does not decode the %s uplink (it announced %s): escalated "
                "frames go as JPEG, which costs several times the bytes; upgrade the cloud "
                "service or set escalation.uplink.codec: jpeg",
                self._target,
                wanted,
                ", ".join(sorted(codecs)) or "no video codec",
            )

    def _rotated(self, code: grpc.StatusCode) -> bool:
        """After a stream ends: True when it was a rotation that drained cleanly."""
        with self._lock:
            rotating, self._rotating = self._rotating, False
            if not rotating:
                return False
            self._counts.rotations += 1
            if code is grpc.StatusCode.OK:
                return True
            # the drain itself broke: treat it as a break (resend, back off)
            if self._state is ClientState.CONNECTED:
                self._set_state(ClientState.CONNECTING)
            return False

    def _after_break(self, code: grpc.StatusCode, message: str) -> float:
        """Resend or fail the frames in flight, record the error; the wait before reconnecting."""
        if code is grpc.StatusCode.OK:  # the cloud ended a stream the client had not closed
            code = grpc.StatusCode.UNAVAILABLE
        error = f"{code.name}: {message}" if message else code.name
        with self._lock:
            # a stream that was answering broke (a replica died or was drained): resend and go
            # to another replica at once; a stream that never answered fails its frames, backs off
            healthy = self._stream_answers > 0  # reset when the next stream opens
        if healthy and code in _TRANSPORT_BREAK_CODES:
            failed = self._resend_unanswered(f"stream to the cloud broke ({error})")
        else:
            failed = self._fail_pending(code, f"stream to the cloud broke ({error})")
        unauthenticated = code is grpc.StatusCode.UNAUTHENTICATED
        with self._lock:
            # Log a break once: the first after being connected, or when the error changes.
            fresh = error != self._last_error or (self._was_connected and not unauthenticated)
            self._was_connected = False
            self._last_error = error
            if unauthenticated:
                self._set_state(ClientState.UNAUTHENTICATED)
                delay_s = self._config.connection.auth_retry_ms / _MS_PER_S
            else:
                self._set_state(ClientState.BACKING_OFF)
                delay_s = 0.0 if healthy else self._backoff.next_delay_s()
        if unauthenticated:
            log = logger.error if fresh else logger.debug
            log(
                "the cloud at %s rejected the escalation token (%s); retrying in %.0f s",
                self._target,
                error,
                delay_s,
            )
        else:
            # a healthy stream cut with nothing lost (a connection aged out, a replica left) is
            # routine; a break that failed frames or keeps failing is worth a warning
            if not fresh:
                log = logger.debug
            elif failed or not healthy:
                log = logger.warning
            else:
                log = logger.info
            log(
                "escalation stream to %s broke (%s, %s frames failed); reconnecting in %.2f s",
                self._target,
                error,
                failed,
                delay_s,
            )
        return delay_s

    def _requests(
        self, generation: int, send_queue: queue.Queue[pb.FrameRequest]
    ) -> Iterator[pb.FrameRequest]:
        """The request side of one stream: frames from its send queue, until retired."""
        while True:
            with self._lock:
                if generation != self._generation or self._closing.is_set():
                    return
            try:
                request = send_queue.get(timeout=_POLL_S)
            except queue.Empty:
                self._fail_overdue()
                continue
            with self._lock:
                entry = self._pending.get(request.request_id)
                if entry is None:
                    continue  # failed already when its stream broke
                entry.sent_at = self._clock()
                self._counts.sent += 1
            yield request

    def _on_answer(self, result: pb.FrameResult) -> None:
        now = self._clock()
        with self._lock:
            entry = self._pending.pop(result.request_id, None)
            if entry is None:
                self._counts.late_answers += 1
                return
            self._counts.answered += 1
            self._stream_answers += 1
            rtt_s = None if entry.sent_at is None else now - entry.sent_at
            if rtt_s is not None:
                self._rtt.append(rtt_s)
            self._backoff.reset()
            self._last_error = None
        self._deliver(
            EscalationResult(
                camera_id=result.camera_id,
                frame_id=result.frame_id,
                request_id=result.request_id,
                code=_status_code(result.status.code),
                message=result.status.message,
                result=result,
                rtt_s=rtt_s,
            )
        )

    def _fail_overdue(self) -> None:
        now = self._clock()
        with self._lock:
            overdue = [(rid, p) for rid, p in self._pending.items() if p.expires_at <= now]
            for rid, _ in overdue:
                del self._pending[rid]
            self._counts.failed += len(overdue)
        for rid, entry in overdue:
            self._deliver(
                self._failure(
                    rid, entry, grpc.StatusCode.DEADLINE_EXCEEDED, "no answer before the deadline"
                )
            )

    def _resend_unanswered(self, message: str) -> int:
        """After a healthy stream broke: queue each unanswered frame once more if it has time left.

        Frames never sent stay queued. A frame already resent once, or past its deadline, fails
        with UNAVAILABLE. How many failed.
        """
        now = self._clock()
        grace_s = self._config.connection.answer_grace_ms / _MS_PER_S
        failed: list[tuple[str, _Pending]] = []
        with self._lock:
            for rid, entry in list(self._pending.items()):
                if entry.sent_at is None:
                    continue  # still in the send queue
                if entry.resent or entry.expires_at - grace_s <= now:
                    failed.append((rid, entry))
                    del self._pending[rid]
                    continue
                entry.resent, entry.sent_at = True, None
                self._counts.resent += 1
                self._send_queue.put_nowait(entry.request)
            self._counts.failed += len(failed)
        for rid, entry in failed:
            self._deliver(self._failure(rid, entry, grpc.StatusCode.UNAVAILABLE, message))
        return len(failed)

    def _fail_pending(self, code: grpc.StatusCode, message: str) -> int:
        """Fail every frame in flight (and drop the queued ones); how many there were."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._counts.failed += len(pending)
            while True:
                try:
                    self._send_queue.get_nowait()
                except queue.Empty:
                    break
        for rid, entry in pending.items():
            self._deliver(self._failure(rid, entry, code, message))
        return len(pending)

    @staticmethod
    def _failure(
        request_id: str, entry: _Pending, code: grpc.StatusCode, message: str
    ) -> EscalationResult:
        return EscalationResult(
            camera_id=entry.camera_id,
            frame_id=entry.frame_id,
            request_id=request_id,
            code=code,
            message=message,
            result=None,
            rtt_s=None,
        )

    def _deliver(self, result: EscalationResult) -> None:
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:
                logger.exception("escalation result callback failed")
            return
        with self._lock:
            if len(self._results) >= self._config.connection.result_queue_frames:
                self._results.popleft()
                self._counts.results_dropped += 1
            self._results.append(result)
