"""Build and run the gRPC server: options, TLS/mTLS, auth, health, reflection, graceful stop."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

# Stubs: types-grpcio-health-checking / types-grpcio-reflection (not installed everywhere yet).
from grpc_health.v1 import (
    health,
    health_pb2,
    health_pb2_grpc,
)
from grpc_reflection.v1alpha import reflection

from cloud_service.auth import BearerTokenInterceptor, tokens_from_secret
from cloud_service.config import ServerConfig, TlsConfig
from cloud_service.handlers import add_inference_service
from configkit.signals import stop_on_signals
from protos.analytics.v1 import analytics_pb2
from protos.analytics.v1.analytics_pb2_grpc import InferenceServiceServicer

logger = logging.getLogger(__name__)

SERVICE_NAME: str = analytics_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


class ServerBindError(OSError):
    """The listen address could not be bound."""


class DrainingServer(grpc.Server):
    """A `grpc.Server` whose `stop` first marks every health status NOT_SERVING.

    Health watchers (load balancers, kubelet) see NOT_SERVING while in-flight calls drain.
    """

    def __init__(self, server: grpc.Server, health_servicer: health.HealthServicer) -> None:
        self._server = server
        self.health = health_servicer

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]
    ) -> None:
        """Delegate to the wrapped server."""
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Delegate to the wrapped server."""
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        """Delegate to the wrapped server."""
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        """Delegate to the wrapped server."""
        return self._server.add_secure_port(address, server_credentials)

    def start(self) -> None:
        """Start serving."""
        self._server.start()

    def stop(self, grace: float | None) -> threading.Event:
        """Report NOT_SERVING, then stop accepting calls and give in-flight ones `grace` seconds."""
        self.health.enter_graceful_shutdown()
        return self._server.stop(grace)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server stops or `timeout` seconds pass; True on timeout."""
        return self._server.wait_for_termination(timeout)


def _channel_options(config: ServerConfig) -> list[tuple[str, int]]:
    age: list[tuple[str, int]] = []
    if config.max_connection_age_s > 0:
        age = [
            ("grpc.max_connection_age_ms", round(config.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", round(config.max_connection_age_grace_s * 1000)),
        ]
    return [
        *age,
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
        ("grpc.max_concurrent_streams", config.max_concurrent_streams),
        ("grpc.keepalive_time_ms", config.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", config.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        # Accept client keepalive pings as often as we send ours, instead of answering a
        # long-lived idle stream's pings with GOAWAY "too_many_pings".
        ("grpc.http2.min_recv_ping_interval_without_data_ms", config.keepalive_time_ms),
        ("grpc.http2.max_pings_without_data", 0),
        # Never share a port with another process: a second server must fail to bind.
        ("grpc.so_reuseport", 0),
    ]


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; mutual TLS when `tls.client_ca_path` is set."""
    key_pair = (tls.key_path.read_bytes(), tls.cert_path.read_bytes())
    client_ca = tls.client_ca_path.read_bytes() if tls.client_ca_path else None
    return grpc.ssl_server_credentials(
        [key_pair], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _bind(server: grpc.Server, config: ServerConfig) -> int:
    try:
        if config.tls is None:
            port = server.add_insecure_port(config.listen_address)
        else:
            port = server.add_secure_port(config.listen_address, server_credentials(config.tls))
    except RuntimeError as exc:
        raise ServerBindError(f"cannot bind {config.listen_address}: {exc}") from exc
    if port == 0:
        raise ServerBindError(f"cannot bind {config.listen_address}")
    return port


def create_server(
    config: ServerConfig, servicer: InferenceServiceServicer
) -> tuple[DrainingServer, int]:
    """A configured, bound, not yet started server and its port (a free one for port 0).

    Health reports SERVING for "" and `SERVICE_NAME` until `stop`; reflection lists the inference,
    health and reflection services when `config.reflection` is set.
    """
    interceptors: list[grpc.ServerInterceptor] = []
    if config.auth_tokens is not None:
        interceptors.append(BearerTokenInterceptor(tokens_from_secret(config.auth_tokens)))
    inner = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=config.worker_threads, thread_name_prefix="grpc-worker"
        ),
        interceptors=interceptors,
        options=_channel_options(config),
    )
    add_inference_service(servicer, inner)
    health_servicer = health.HealthServicer()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, inner)
    if config.reflection:
        names = (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            REFLECTION_V1,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, inner)
        _add_reflection_v1(reflection.ReflectionServicer(names), inner)
    port = _bind(inner, config)
    logger.info(
        "gRPC server bound to %s (port %s, tls=%s, mtls=%s, auth=%s)",
        config.listen_address,
        port,
        config.tls is not None,
        config.tls is not None and config.tls.client_ca_path is not None,
        config.auth_tokens is not None,
    )
    return DrainingServer(inner, health_servicer), port


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def _add_reflection_v1(servicer: Any, server: grpc.Server) -> None:
    """Serve reflection under its stable `v1` name too (grpcurl and Postman try v1 first).

    `grpcio-reflection` ships only `v1alpha`; the two protocols differ in the package name only,
    so v1alpha's servicer and messages answer v1 on the wire.
    """
    from grpc_reflection.v1alpha import reflection_pb2

    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


def serve_until_signalled(
    server: grpc.Server,
    grace_period_s: float,
    *,
    stop_event: threading.Event | None = None,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Start `server`, wait for a signal (or `stop_event`), then stop with `grace_period_s`.

    Installs signal handlers, so call it from the main thread; previous handlers are restored.
    """
    stop = stop_event if stop_event is not None else threading.Event()
    with stop_on_signals(stop, signals, what=f"draining for up to {grace_period_s:.1f} s"):
        server.start()
        logger.info("serving")
        stop.wait()
        server.stop(grace_period_s).wait()
        logger.info("stopped")


def wait_until_serving(
    channel: grpc.Channel,
    timeout_s: float,
    *,
    poll_interval_s: float = 0.2,
    still_running: Callable[[], bool] | None = None,
) -> None:
    """Poll the standard health service on `channel` until it reports SERVING.

    `still_running` (e.g. a server process's liveness) stops the wait early with a RuntimeError;
    running out of `timeout_s` raises TimeoutError.
    """
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if still_running is not None and not still_running():
            raise RuntimeError("the server stopped before it reported SERVING")
        try:
            # the stub package declares the HealthStub methods only on its channel-bound type
            reply = stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(poll_interval_s)
    raise TimeoutError(f"the server did not report SERVING within {timeout_s:g} s")
