"""TLS and mutual TLS through real gRPC, with certificates made by the `openssl` CLI."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from cloud_service.config import ServerConfig, TlsConfig
from cloud_service.processor import DetectorFrameProcessor
from tests.fixtures.grpc_server import FAKE_MODEL, FakeDetector, ServerFactory, make_request

RPC_TIMEOUT_S = 5.0
OK = grpc.StatusCode.OK.value[0]

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


@dataclass(frozen=True)
class Pki:
    """A throw-away CA with a server and a client certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(name: str, cwd: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}", "-days", "2",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )  # fmt: skip


def _make_leaf(name: str, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=cwd,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    cwd = tmp_path_factory.mktemp("pki")
    _make_ca("ca", cwd)
    _make_ca("other-ca", cwd)
    _make_leaf(
        "server",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        cwd,
    )
    _make_leaf("client", "extendedKeyUsage=clientAuth\n", cwd)
    return Pki(
        ca_cert=cwd / "ca.crt",
        server_cert=cwd / "server.crt",
        server_key=cwd / "server.key",
        client_cert=cwd / "client.crt",
        client_key=cwd / "client.key",
        other_ca_cert=cwd / "other-ca.crt",
    )


def _call(
    factory: ServerFactory, tls: TlsConfig, credentials: grpc.ChannelCredentials | None
) -> int:
    """Status code of one DetectFrame call (the per-frame code when the RPC succeeds)."""
    config = ServerConfig(listen_address="127.0.0.1:0", tls=tls)
    running = factory(DetectorFrameProcessor(FakeDetector(), FAKE_MODEL), config, credentials)
    try:
        return running.stub.DetectFrame(make_request(), timeout=RPC_TIMEOUT_S).status.code
    except grpc.RpcError as exc:
        return int(exc.code().value[0])


def test_tls_with_trusted_ca_works(grpc_server_factory: ServerFactory, pki: Pki) -> None:
    tls = TlsConfig(cert_path=pki.server_cert, key_path=pki.server_key)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())

    assert _call(grpc_server_factory, tls, credentials) == OK


@pytest.mark.parametrize("client", ["plaintext", "untrusted-ca"])
def test_tls_rejects_plaintext_and_untrusted_server(
    grpc_server_factory: ServerFactory, pki: Pki, client: str
) -> None:
    tls = TlsConfig(cert_path=pki.server_cert, key_path=pki.server_key)
    credentials = (
        None
        if client == "plaintext"
        else grpc.ssl_channel_credentials(root_certificates=pki.other_ca_cert.read_bytes())
    )

    assert _call(grpc_server_factory, tls, credentials) == grpc.StatusCode.UNAVAILABLE.value[0]


@pytest.mark.parametrize(
    ("with_client_cert", "expected"),
    [(True, grpc.StatusCode.OK), (False, grpc.StatusCode.UNAVAILABLE)],
)
def test_mutual_tls_requires_a_client_certificate(
    grpc_server_factory: ServerFactory, pki: Pki, with_client_cert: bool, expected: grpc.StatusCode
) -> None:
    tls = TlsConfig(cert_path=pki.server_cert, key_path=pki.server_key, client_ca_path=pki.ca_cert)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=pki.client_key.read_bytes() if with_client_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if with_client_cert else None,
    )

    assert _call(grpc_server_factory, tls, credentials) == expected.value[0]
