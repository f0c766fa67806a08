"""The downloader against a `file://` store: verify, resume, discard, budget.

The same code over HTTPS (nginx, Range requests, a cut connection) is in test_https_store.py.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.download import ArtifactMismatch, BudgetExceeded, Downloader, DownloadError
from fleet.store import blob_path

from .conftest import Published, write_artifact


def _downloader(published: Published, cache: Path, **kwargs: object) -> Downloader:
    return Downloader(published.store.root.as_uri(), cache, **kwargs)  # type: ignore[arg-type]


def test_manifest_and_artifact(published: Published, tmp_path: Path) -> None:
    downloader = _downloader(published, tmp_path / "cache")
    signed = downloader.manifest("edge-det", "1.0.0")
    assert signed == published.signed
    assert downloader.versions("edge-det") == ["1.0.0"]
    path = downloader.artifact(signed.manifest)
    assert path.name == f"{signed.manifest.sha256}.onnx"
    assert path.read_bytes() == published.artifact.read_bytes()
    assert downloader.artifact(signed.manifest) == path  # cached
    assert not downloader.part_path(signed.manifest.sha256).exists()


def test_a_missing_model_is_a_clear_error(published: Published, tmp_path: Path) -> None:
    downloader = _downloader(published, tmp_path / "cache")
    with pytest.raises(DownloadError, match=r"models/edge-det/9\.json is not in the store"):
        downloader.manifest("edge-det", "9")


def test_resume_continues_a_partial_file(published: Published, tmp_path: Path) -> None:
    downloader = _downloader(published, tmp_path / "cache")
    manifest = published.signed.manifest
    whole = published.artifact.read_bytes()
    downloader.cache_dir.mkdir()
    downloader.part_path(manifest.sha256).write_bytes(whole[:123_457])
    assert downloader.artifact(manifest).read_bytes() == whole


def test_a_part_with_wrong_bytes_is_discarded_and_the_next_try_succeeds(
    published: Published, tmp_path: Path
) -> None:
    downloader = _downloader(published, tmp_path / "cache")
    manifest = published.signed.manifest
    downloader.cache_dir.mkdir()
    downloader.part_path(manifest.sha256).write_bytes(b"\0" * 1000)
    with pytest.raises(ArtifactMismatch, match="hash mismatch .* discarded, nothing loaded"):
        downloader.artifact(manifest)
    assert not downloader.part_path(manifest.sha256).exists()
    assert not downloader.final_path(manifest).exists()
    assert downloader.artifact(manifest).read_bytes() == published.artifact.read_bytes()


def test_a_tampered_blob_is_refused_and_nothing_is_left(
    published: Published, tmp_path: Path
) -> None:
    manifest = published.signed.manifest
    blob = published.store.root / blob_path(manifest.sha256)
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.write_bytes(bytes(data))
    downloader = _downloader(published, tmp_path / "cache")
    with pytest.raises(ArtifactMismatch, match="hash mismatch"):
        downloader.artifact(manifest)
    assert list(downloader.cache_dir.glob("*.onnx")) == []
    assert list(downloader.cache_dir.glob("*.part")) == []


def test_a_longer_blob_is_refused(published: Published, tmp_path: Path) -> None:
    manifest = published.signed.manifest
    blob = published.store.root / blob_path(manifest.sha256)
    blob.write_bytes(blob.read_bytes() + b"more")
    downloader = _downloader(published, tmp_path / "cache")
    with pytest.raises(ArtifactMismatch, match="longer than the manifest"):
        downloader.artifact(manifest)
    assert list(downloader.cache_dir.iterdir()) == [downloader.cache_dir / ".lock"]


def test_a_shorter_blob_keeps_the_part_for_the_next_try(
    published: Published, tmp_path: Path
) -> None:
    manifest = published.signed.manifest
    blob = published.store.root / blob_path(manifest.sha256)
    whole = blob.read_bytes()
    blob.write_bytes(whole[:200_000])
    downloader = _downloader(published, tmp_path / "cache")
    with pytest.raises(DownloadError, match="cut short at 200000 of 300000 bytes") as cut:
        downloader.artifact(manifest)
    assert not isinstance(cut.value, ArtifactMismatch | BudgetExceeded)  # another try mends it
    assert downloader.part_path(manifest.sha256).stat().st_size == 200_000
    blob.write_bytes(whole)
    assert downloader.artifact(manifest).read_bytes() == whole


def test_a_corrupted_cached_file_is_fetched_again(published: Published, tmp_path: Path) -> None:
    downloader = _downloader(published, tmp_path / "cache")
    manifest = published.signed.manifest
    path = downloader.artifact(manifest)
    path.write_bytes(b"bit rot")
    assert downloader.artifact(manifest).read_bytes() == published.artifact.read_bytes()


def _publish(published: Published, tmp_path: Path, version: str, size: int) -> object:
    artifact = write_artifact(tmp_path / f"m{version}.onnx", size, seed=int(version))
    return published.store.publish(
        artifact,
        "edge-det",
        version,
        published.signer,
        runtime="onnx",
        classes=[],
        input_size=(320, 320),
    ).manifest


def test_budget_evicts_least_recently_used_but_not_kept(
    published: Published, tmp_path: Path
) -> None:
    first = published.signed.manifest  # 300 kB
    second = _publish(published, tmp_path, "2", 300_000)
    third = _publish(published, tmp_path, "3", 300_000)
    downloader = _downloader(published, tmp_path / "cache", budget_bytes=700_000)
    a = downloader.artifact(first)
    os.utime(a, (1, 1))  # long ago
    b = downloader.artifact(second)  # type: ignore[arg-type]
    assert downloader.cached_bytes() == 600_000
    downloader.artifact(third, keep={first.sha256})  # type: ignore[arg-type]
    assert a.exists() and not b.exists()  # the older one was kept on request
    assert downloader.cached_bytes() == 600_000


def test_budget_refuses_what_cannot_fit(published: Published, tmp_path: Path) -> None:
    first = published.signed.manifest
    second = _publish(published, tmp_path, "2", 300_000)
    downloader = _downloader(published, tmp_path / "cache", budget_bytes=500_000)
    downloader.artifact(first)
    with pytest.raises(BudgetExceeded, match="does not fit the disk budget of 500000 bytes"):
        downloader.artifact(second, keep={first.sha256})  # type: ignore[arg-type]
    small = Downloader(published.store.root.as_uri(), tmp_path / "c2", budget_bytes=1000)
    with pytest.raises(BudgetExceeded, match="does not fit"):
        small.artifact(first)


@pytest.mark.parametrize(
    ("url", "kwargs", "message"),
    [
        ("ftp://x/", {}, "expected http://, https:// or file://"),
        ("https://x/", {"timeout_s": 0}, "timeout_s"),
        ("https://x/", {"budget_bytes": 0}, "budget_bytes"),
        ("https://x/", {"ca_path": "/nonexistent/ca.pem"}, "cannot load CA file"),
    ],
)
def test_bad_settings(url: str, kwargs: dict[str, object], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        Downloader(url, tmp_path, **kwargs)  # type: ignore[arg-type]


def test_an_unreachable_store(tmp_path: Path, published: Published) -> None:
    downloader = Downloader("http://127.0.0.1:9/", tmp_path / "cache", timeout_s=5)
    with pytest.raises(DownloadError, match="cannot reach"):
        downloader.manifest("edge-det", "1.0.0")
    with pytest.raises(DownloadError, match="cannot reach"):
        downloader.artifact(published.signed.manifest)


@pytest.fixture
def plain_http_store(published: Published) -> Iterator[str]:
    """The store behind the standard library's HTTP server, which ignores `Range` (answers 200)."""
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(published.store.root)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_server_without_range_support_starts_over(
    published: Published, plain_http_store: str, tmp_path: Path
) -> None:
    downloader = Downloader(plain_http_store, tmp_path / "cache", timeout_s=10)
    manifest = downloader.manifest("edge-det", "1.0.0").manifest
    whole = published.artifact.read_bytes()
    downloader.cache_dir.mkdir()
    downloader.part_path(manifest.sha256).write_bytes(whole[:1000])
    assert downloader.artifact(manifest).read_bytes() == whole
