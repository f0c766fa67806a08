"""The fleet's model store served as a user would serve it: nginx over HTTPS, a test CA.

`make_test_pki(directory)` makes a throw-away CA and a server certificate for 127.0.0.1 and
localhost with `cryptography` (pyca; no `openssl` CLI needed). `StoreServer(root, work_dir,
pki)` runs Debian's nginx on a free loopback port, serving the store directory as it is: static
files, `Range` requests (how an edge box resumes a cut download), an access log of each
request's status and range for the tests to read. `limit_rate_bytes_s` slows the answers so a
test can cut a download half way.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pwd
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.processes import ManagedProcess, free_tcp_port, tcp_port_accepts

__all__ = ["NGINX_FALLBACK", "StoreServer", "StorePki", "make_test_pki", "nginx_executable"]

NGINX_FALLBACK = Path("/usr/sbin/nginx")
HOST = "127.0.0.1"


def nginx_executable() -> str | None:
    """The nginx binary, or None when it is not installed (scripts/install-system-deps)."""
    found = shutil.which("nginx")
    if found is not None:
        return found
    return str(NGINX_FALLBACK) if NGINX_FALLBACK.is_file() else None


@dataclass(frozen=True)
class StorePki:
    """A CA certificate and a server certificate + key signed by it (PEM files)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_test_pki(directory: Path, *, ca_name: str = "fleet-test-ca") -> StorePki:
    """A P-256 CA valid for two days and a server certificate for 127.0.0.1 and localhost."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = StorePki(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    return pki


def nginx_config(
    root: Path, port: int, pki: StorePki, work_dir: Path, limit_rate_bytes_s: int = 0
) -> str:
    """An nginx.conf that serves `root` read-only over HTTPS on 127.0.0.1:`port`."""
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
    temp = work_dir / "tmp"
    return f"""
{user}
worker_processes 1;
daemon off;
pid {work_dir / "nginx.pid"};
error_log stderr warn;
events {{ worker_connections 64; }}
http {{
    types {{ application/json json; }}
    default_type application/octet-stream;
    log_format store '$status $body_bytes_sent "$http_range" $request_uri';
    access_log {work_dir / "access.log"} store;
    client_body_temp_path {temp / "body"};
    proxy_temp_path {temp / "proxy"};
    fastcgi_temp_path {temp / "fastcgi"};
    uwsgi_temp_path {temp / "uwsgi"};
    scgi_temp_path {temp / "scgi"};
    sendfile on;
    server {{
        listen {HOST}:{port} ssl;
        server_name localhost;
        ssl_certificate {pki.server_cert};
        ssl_certificate_key {pki.server_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        root {root};
        limit_rate {limit_rate_bytes_s};
        location / {{
            limit_except GET {{ deny all; }}
        }}
        location ~ /\\. {{ deny all; }}
    }}
}}
"""


class StoreServer:
    """nginx serving a store directory over HTTPS on a free loopback port."""

    def __init__(
        self,
        root: Path,
        work_dir: Path,
        pki: StorePki,
        *,
        limit_rate_bytes_s: int = 0,
        executable: str | None = None,
    ) -> None:
        binary = executable or nginx_executable()
        if binary is None:
            raise FileNotFoundError("nginx not found (scripts/install-system-deps installs it)")
        self.root = root
        self.work_dir = work_dir
        self.port = free_tcp_port(HOST)
        (work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.config_path = work_dir / "nginx.conf"
        self.config_path.write_text(
            nginx_config(root, self.port, pki, work_dir, limit_rate_bytes_s)
        )
        self.process = ManagedProcess(
            f"nginx:{self.port}",
            [binary, "-p", str(work_dir), "-c", str(self.config_path), "-e", "stderr"],
            ready_check=lambda: tcp_port_accepts(HOST, self.port),
        )

    @property
    def url(self) -> str:
        """The store's base URL."""
        return f"https://{HOST}:{self.port}/"

    def start(self, *, ready_timeout_s: float = 10.0) -> None:
        """Start nginx and wait until it accepts connections."""
        self.process.start(ready_timeout_s=ready_timeout_s)

    def stop(self) -> None:
        """Stop nginx (SIGTERM, then SIGKILL)."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL nginx, as in a crash: open downloads are cut."""
        pid = self.process.pid
        if pid is not None and self.process.running:
            # the master and its worker share the process group ManagedProcess started: a killed
            # master alone would leave the worker serving
            os.killpg(pid, signal.SIGKILL)
        self.process.stop()

    def access_log(self) -> list[str]:
        """Lines `status bytes "range" uri`, one per request served so far."""
        path = self.work_dir / "access.log"
        return path.read_text().splitlines() if path.is_file() else []
