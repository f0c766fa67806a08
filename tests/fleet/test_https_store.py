"""A published store served by a real nginx over HTTPS (test CA), downloaded by the Downloader.

What a user would run: the store directory as nginx's root, TLS with the site's certificate, and
agents configured with the CA file. Exercised: a whole download, resume after a cut (a `.part`
left by an earlier try, and nginx killed half way), a tampered blob, a wrong or missing signature,
a wrong CA, and the disk budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.download import Downloader, DownloadError
from fleet.signing import SignatureError, Signer, Verifier, generate_key
from fleet.store import SignedManifest, blob_path
from testbed.static_store import StorePki, StoreServer, make_test_pki, nginx_executable

from .conftest import Published, write_artifact

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(
        nginx_executable() is None, reason="nginx not installed (scripts/install-system-deps)"
    ),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> StorePki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def servers() -> Iterator[list[StoreServer]]:
    """The nginx servers a test starts (`_serve`), stopped after it."""
    started: list[StoreServer] = []
    yield started
    for server in started:
        server.stop()


def _serve(
    started: list[StoreServer], published: Published, pki: StorePki, tmp_path: Path, **kw: int
) -> StoreServer:
    server = StoreServer(
        published.store.root,
        tmp_path / f"nginx-{len(started)}",
        pki,
        **kw,  # type: ignore[arg-type]
    )
    started.append(server)
    server.start()
    return server


def _downloader(server: StoreServer, pki: StorePki, cache: Path, **kw: object) -> Downloader:
    return Downloader(server.url, cache, ca_path=pki.ca_cert, timeout_s=10, **kw)  # type: ignore[arg-type]


def test_whole_download_over_https(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    server = _serve(servers, published, pki, tmp_path)
    downloader = _downloader(server, pki, tmp_path / "cache")
    manifest = downloader.manifest("edge-det", "1.0.0").verified(Verifier([published.public_b64]))
    path = downloader.artifact(manifest)
    assert path.read_bytes() == published.artifact.read_bytes()
    assert downloader.versions("edge-det") == ["1.0.0"]
    log = server.access_log()
    assert f'200 {manifest.bytes} "-" /{blob_path(manifest.sha256)}' in log


def test_resume_from_a_part_left_by_an_earlier_try(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    server = _serve(servers, published, pki, tmp_path)
    downloader = _downloader(server, pki, tmp_path / "cache")
    manifest = published.signed.manifest
    whole = published.artifact.read_bytes()
    downloader.cache_dir.mkdir()
    downloader.part_path(manifest.sha256).write_bytes(whole[:100_000])
    assert downloader.artifact(manifest).read_bytes() == whole
    rest = manifest.bytes - 100_000
    assert f'206 {rest} "bytes=100000-" /{blob_path(manifest.sha256)}' in server.access_log()


def test_resume_after_the_server_dies_half_way(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    big = write_artifact(tmp_path / "big.onnx", 1_500_000, seed=3)
    manifest = published.store.publish(
        big, "big", "1", published.signer, runtime="onnx", classes=[], input_size=(320, 320)
    ).manifest
    slow = _serve(servers, published, pki, tmp_path, limit_rate_bytes_s=300_000)
    downloader = _downloader(slow, pki, tmp_path / "cache")
    part = downloader.part_path(manifest.sha256)
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            downloader.artifact(manifest)
        except DownloadError as error:
            errors.append(error)

    thread = threading.Thread(target=fetch)
    thread.start()
    deadline = time.monotonic() + 30
    while not (part.is_file() and part.stat().st_size >= 200_000) and time.monotonic() < deadline:
        time.sleep(0.05)
    slow.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1 and "cut short at" in str(errors[0]), errors
    assert "the next try resumes" in str(errors[0])
    kept = part.stat().st_size
    assert 0 < kept < manifest.bytes
    assert not downloader.final_path(manifest).exists()

    again = _serve(servers, published, pki, tmp_path)
    resumed = _downloader(again, pki, tmp_path / "cache")
    assert resumed.artifact(manifest).read_bytes() == big.read_bytes()
    assert f'206 {manifest.bytes - kept} "bytes={kept}-"' in " ".join(again.access_log())


def test_a_tampered_blob_is_refused_and_nothing_can_load(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    manifest = published.signed.manifest
    blob = published.store.root / blob_path(manifest.sha256)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    server = _serve(servers, published, pki, tmp_path)
    downloader = _downloader(server, pki, tmp_path / "cache")
    with pytest.raises(DownloadError, match="hash mismatch .* discarded, nothing loaded"):
        downloader.artifact(manifest)
    assert [p.name for p in downloader.cache_dir.iterdir()] == [".lock"]


def test_a_wrong_or_missing_signature_is_refused(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    server = _serve(servers, published, pki, tmp_path)
    downloader = _downloader(server, pki, tmp_path / "cache")
    generate_key(tmp_path / "stranger.pem")
    stranger = Signer.from_file(tmp_path / "stranger.pem")
    path = published.store.root / "models/edge-det/1.0.0.json"
    path.write_bytes(SignedManifest.sign(published.signed.manifest, stranger).to_bytes())
    signed = downloader.manifest("edge-det", "1.0.0")
    with pytest.raises(SignatureError) as refused:
        signed.verified(Verifier([published.public_b64]))
    message = str(refused.value)
    assert message.startswith(f"no signature by a trusted key: signed by {stranger.key_id}")
    assert "\n" not in message

    path.write_bytes(SignedManifest(published.signed.manifest, ()).to_bytes())
    with pytest.raises(SignatureError, match="^unsigned: the document carries no signature$"):
        downloader.manifest("edge-det", "1.0.0").verified(Verifier([published.public_b64]))


def test_a_server_the_ca_does_not_vouch_for(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    server = _serve(servers, published, pki, tmp_path)
    other = make_test_pki(tmp_path / "other-pki", ca_name="someone-else")
    downloader = Downloader(server.url, tmp_path / "cache", ca_path=other.ca_cert, timeout_s=10)
    with pytest.raises(DownloadError, match="cannot reach .*CERTIFICATE_VERIFY_FAILED"):
        downloader.manifest("edge-det", "1.0.0")


def test_budget_eviction_over_https(
    published: Published, pki: StorePki, tmp_path: Path, servers: list[StoreServer]
) -> None:
    manifests = [published.signed.manifest]
    for version in ("2", "3"):
        artifact = write_artifact(tmp_path / f"m{version}.onnx", 300_000, seed=int(version))
        manifests.append(
            published.store.publish(
                artifact,
                "edge-det",
                version,
                published.signer,
                runtime="onnx",
                classes=[],
                input_size=(320, 320),
            ).manifest
        )
    server = _serve(servers, published, pki, tmp_path)
    downloader = _downloader(server, pki, tmp_path / "cache", budget_bytes=650_000)
    oldest = downloader.artifact(manifests[0])
    kept = downloader.artifact(manifests[1])
    newest = downloader.artifact(manifests[2], keep={manifests[1].sha256})
    assert not oldest.exists() and kept.exists() and newest.exists()
    with pytest.raises(DownloadError, match="does not fit the disk budget"):
        downloader.artifact(manifests[0], keep={manifests[1].sha256, manifests[2].sha256})
