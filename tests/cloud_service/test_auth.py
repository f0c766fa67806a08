"""Bearer-token auth through real gRPC: missing, wrong and right tokens; health is exempt."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud_service.auth import AuthConfigError, tokens_from_env
from cloud_service.config import ServerConfig
from cloud_service.processor import DetectorFrameProcessor
from tests.fixtures.grpc_server import (
    FAKE_MODEL,
    FakeDetector,
    RunningServer,
    ServerFactory,
    make_request,
)

TOKENS_ENV = "ANALYTICS_TEST_TOKENS"
RPC_TIMEOUT_S = 10.0


@pytest.fixture
def authed_server(
    grpc_server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> RunningServer:
    monkeypatch.setenv(TOKENS_ENV, " token-one , token-two ,")
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_env=TOKENS_ENV)
    return grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "token-one"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Basic token-one"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer token-one"),), grpc.StatusCode.OK),
        ((("authorization", "bearer token-two"),), grpc.StatusCode.OK),
    ],
)
def test_unary_auth(
    authed_server: RunningServer,
    metadata: tuple[tuple[str, str], ...],
    expected: grpc.StatusCode,
) -> None:
    try:
        _, call = authed_server.stub.DetectFrame.with_call(
            make_request(), metadata=metadata, timeout=RPC_TIMEOUT_S
        )
        code = call.code()
    except grpc.RpcError as exc:
        code = exc.code()
    assert code == expected


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer token-two"),), grpc.StatusCode.OK),
    ],
)
def test_stream_auth(
    authed_server: RunningServer,
    metadata: tuple[tuple[str, str], ...],
    expected: grpc.StatusCode,
) -> None:
    # An empty request stream: a rejected call must fail without waiting for any frame.
    call = authed_server.stub.StreamFrames(iter([]), metadata=metadata, timeout=RPC_TIMEOUT_S)
    try:
        list(call)
    except grpc.RpcError:
        pass
    assert call.code() == expected


def test_health_needs_no_token(authed_server: RunningServer) -> None:
    health = health_pb2_grpc.HealthStub(authed_server.channel)

    response = health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)

    assert response.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("value", [None, "", " , ,"])
def test_auth_without_tokens_refuses_to_start(
    grpc_server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(TOKENS_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKENS_ENV, value)
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_env=TOKENS_ENV)

    with pytest.raises(AuthConfigError, match=TOKENS_ENV):
        grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)


def test_tokens_from_env_splits_and_strips() -> None:
    assert tokens_from_env("T", {"T": "a, b ,,c"}) == frozenset({"a", "b", "c"})


def test_tokens_from_a_systemd_credential(
    grpc_server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "cloud-tokens").write_text("cred-token\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_credential="cloud-tokens")
    server = grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)
    metadata = (("authorization", "Bearer cred-token"),)
    _, call = server.stub.DetectFrame.with_call(
        make_request(), metadata=metadata, timeout=RPC_TIMEOUT_S
    )
    assert call.code() == grpc.StatusCode.OK
    with pytest.raises(grpc.RpcError) as refused:
        server.stub.DetectFrame(make_request(), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_missing_credential_refuses_to_start(
    grpc_server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    config = ServerConfig(listen_address="127.0.0.1:0", auth_tokens_credential="absent")
    with pytest.raises(AuthConfigError, match="absent"):
        grpc_server_factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config)


def test_only_one_token_source_may_be_set() -> None:
    with pytest.raises(ValueError, match="at most one of"):
        ServerConfig(auth_tokens_env="T", auth_tokens_credential="t")
