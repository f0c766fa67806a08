"""Fetch signed manifests and artifacts from a store: resume, verify, stay under a disk budget.

HTTP(S) goes through the standard library's `urllib.request` (TLS verified against the system
roots or a given CA file, `Range` requests for resume): no HTTP client of our own, and nothing
extra to install on an edge box. A `file://` base URL reads a local or mounted store.

An artifact is written to `<cache>/<hex>.part`, never past the manifest's size, and renamed to
`<cache>/<hex><suffix>` only once its sha256 matches: a file with the final name is always a
whole, verified artifact, so a box that loses power mid-download resumes or starts over, and
never loads half a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Set
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from fleet.envelope import MAX_DOCUMENT_BYTES
from fleet.manifest import ManifestError, ModelManifest
from fleet.names import check_sha256
from fleet.store import SignedManifest, blob_path, index_path, manifest_path

__all__ = ["ArtifactMismatch", "BudgetExceeded", "DownloadError", "Downloader"]

logger = logging.getLogger(__name__)

_CHUNK: Final = 256 * 1024
_CACHED = re.compile(r"^([0-9a-f]{64})(\.part|\.[A-Za-z0-9]{1,16})$")
_USER_AGENT: Final = "edge-cloud-video-analytics-fleet/1"


class DownloadError(Exception):
    """A manifest or artifact could not be fetched, did not verify, or does not fit the budget."""


class ArtifactMismatch(DownloadError):
    """The store served other bytes than the manifest names (hash or length): another try from
    the same store cannot mend it."""


class BudgetExceeded(DownloadError):
    """The artifact does not fit the disk budget beside the models that must be kept."""


@dataclass(frozen=True)
class _CacheEntry:
    path: Path
    sha256: str
    size: int
    mtime: float


class Downloader:
    """Reads one store (`base_url`) into one cache directory."""

    def __init__(
        self,
        base_url: str,
        cache_dir: str | Path,
        *,
        ca_path: str | Path | None = None,
        timeout_s: float = 30.0,
        budget_bytes: int | None = None,
    ) -> None:
        scheme = urllib.parse.urlsplit(base_url).scheme
        if scheme not in ("http", "https", "file"):
            raise ValueError(f"store URL {base_url!r}: expected http://, https:// or file://")
        if not 0 < timeout_s <= 3600:
            raise ValueError(f"timeout_s must be in (0, 3600], got {timeout_s}")
        if budget_bytes is not None and budget_bytes < 1:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        self.base_url = base_url.rstrip("/") + "/"
        self.cache_dir = Path(cache_dir)
        self.timeout_s = timeout_s
        self.budget_bytes = budget_bytes
        self._scheme = scheme
        self._context: ssl.SSLContext | None = None
        if scheme == "https":
            try:
                self._context = ssl.create_default_context(
                    cafile=None if ca_path is None else str(ca_path)
                )
            except (OSError, ssl.SSLError) as error:
                raise ValueError(f"cannot load CA file {ca_path}: {error}") from None

    # -- reading the store ------------------------------------------------------------------

    def _url(self, relative: str) -> str:
        return urllib.parse.urljoin(self.base_url, relative)

    @contextlib.contextmanager
    def _open(self, relative: str, offset: int = 0) -> Iterator[tuple[BinaryIO, int]]:
        """The resource from byte `offset` where the server honours it; yields (stream, start)."""
        url = self._url(relative)
        if self._scheme == "file":
            path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
            try:
                file = open(path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                raise DownloadError(f"{relative} is not in the store ({url})") from None
            except OSError as error:
                raise DownloadError(f"cannot read {url}: {error.strerror}") from None
            with file:
                file.seek(offset)
                yield file, offset
            return
        headers = {"User-Agent": _USER_AGENT}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - scheme checked
        try:
            response = urllib.request.urlopen(  # noqa: S310 - scheme checked above
                request, timeout=self.timeout_s, context=self._context
            )
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                raise DownloadError(f"{relative} is not in the store ({url})") from None
            if error.code == 416:  # the .part is as long as the file or longer: start over
                raise _RangeNotSatisfiable from None
            raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise DownloadError(f"cannot reach {url}: {reason}") from None
        with response:
            start = 0
            if response.status == 206:
                content_range = response.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {offset}-"):
                    raise DownloadError(f"{url}: Content-Range {content_range!r} is not {offset}-")
                start = offset
            yield response, start

    def _fetch_document(self, relative: str) -> bytes:
        try:
            with self._open(relative) as (stream, _):
                data = stream.read(MAX_DOCUMENT_BYTES + 1)
        except (OSError, _RangeNotSatisfiable) as error:
            raise DownloadError(f"reading {relative} failed: {error}") from None
        if len(data) > MAX_DOCUMENT_BYTES:
            raise DownloadError(f"{relative} is larger than {MAX_DOCUMENT_BYTES} bytes: refused")
        return data

    def manifest(self, name: str, version: str) -> SignedManifest:
        """The signed manifest of `name:version` (not yet verified: call `.verified(...)`)."""
        relative = manifest_path(name, version)
        try:
            return SignedManifest.parse(self._fetch_document(relative))
        except ManifestError as error:
            raise DownloadError(f"{relative}: {error}") from None

    def versions(self, name: str) -> list[str]:
        """The versions the store's index lists for `name`, oldest first."""
        import json

        relative = index_path(name)
        try:
            value = json.loads(self._fetch_document(relative))
        except ValueError as error:
            raise DownloadError(f"{relative} is not JSON: {error}") from None
        versions = value.get("versions") if isinstance(value, dict) else None
        if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
            raise DownloadError(f"{relative} has no list of versions")
        return versions

    # -- the cache --------------------------------------------------------------------------

    def final_path(self, manifest: ModelManifest) -> Path:
        """Where the verified artifact of `manifest` lives in the cache."""
        return self.cache_dir / f"{manifest.sha256}{manifest.suffix}"

    def part_path(self, sha256: str) -> Path:
        """Where a partial download of `sha256` is kept between attempts."""
        return self.cache_dir / f"{check_sha256(sha256)}.part"

    def _entries(self) -> list[_CacheEntry]:
        entries = []
        for path in self.cache_dir.iterdir():
            match = _CACHED.match(path.name)
            if match is None or not path.is_file():
                continue
            stat = path.stat()
            entries.append(_CacheEntry(path, match.group(1), stat.st_size, stat.st_mtime))
        return entries

    def cached_bytes(self) -> int:
        """Bytes the cache holds now (artifacts and partial downloads)."""
        return sum(entry.size for entry in self._entries())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / ".lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _make_room(self, manifest: ModelManifest, keep: Set[str]) -> None:
        """Evict least-recently-used artifacts not in `keep` until `manifest` fits the budget."""
        if self.budget_bytes is None:
            return
        entries = self._entries()
        have = sum(e.size for e in entries if e.sha256 == manifest.sha256)
        needed = manifest.bytes - have
        total = sum(e.size for e in entries)
        evictable = sorted(
            (e for e in entries if e.sha256 not in keep and e.sha256 != manifest.sha256),
            key=lambda e: e.mtime,
        )
        for entry in evictable:
            if total + needed <= self.budget_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()
            total -= entry.size
            logger.info(
                "evicted %s (%d bytes) to stay under the disk budget", entry.path.name, entry.size
            )
        if total + needed > self.budget_bytes:
            raise BudgetExceeded(
                f"{manifest.ref} ({manifest.bytes} bytes) does not fit the disk budget of "
                f"{self.budget_bytes} bytes: {total} bytes are cached and kept "
                f"({len(keep)} model(s) kept)"
            )

    # -- artifacts --------------------------------------------------------------------------

    def artifact(self, manifest: ModelManifest, keep: Set[str] = frozenset()) -> Path:
        """The verified artifact of `manifest` in the cache: fetched (resumed) when not there.

        `keep` holds digests that must not be evicted (the models running and the previous
        ones). Raises `DownloadError`: store unreachable, artifact missing, hash mismatch (the
        download is discarded), cut short (the partial file is kept for the next try), budget.
        """
        with self._locked():
            final = self.final_path(manifest)
            if final.is_file():
                if _sha256_of(final) == manifest.sha256:
                    os.utime(final)  # most recently used
                    return final
                logger.warning("cached %s does not match its hash: fetching again", final.name)
                final.unlink()
            self._make_room(manifest, keep)
            part = self.part_path(manifest.sha256)
            try:
                self._fetch_part(manifest, part)
            except _RangeNotSatisfiable:
                part.unlink(missing_ok=True)
                self._fetch_part(manifest, part)
            digest = _sha256_of(part)
            if digest != manifest.sha256:
                part.unlink(missing_ok=True)
                raise ArtifactMismatch(
                    f"hash mismatch for {manifest.ref}: the store's {blob_path(manifest.sha256)} "
                    f"hashes to {digest[:12]}; discarded, nothing loaded"
                )
            os.replace(part, final)
            _fsync_dir(self.cache_dir)
            logger.info("downloaded and verified %s (%d bytes)", manifest.ref, manifest.bytes)
            return final

    def _fetch_part(self, manifest: ModelManifest, part: Path) -> None:
        """Extend `part` towards `manifest.bytes`, resuming where it stops."""
        have = part.stat().st_size if part.is_file() else 0
        if have >= manifest.bytes:
            return  # complete (or too long: the hash check discards it)
        relative = blob_path(manifest.sha256)
        with self._open(relative, have) as (stream, start):
            if start != have:
                logger.info("%s: the server does not resume; starting over", relative)
            elif have:
                logger.info("%s: resuming at byte %d of %d", relative, have, manifest.bytes)
            mode = "ab" if start else "wb"
            written = start
            with open(part, mode) as out:
                try:
                    while written < manifest.bytes:
                        chunk = stream.read(min(_CHUNK, manifest.bytes - written))
                        if not chunk:
                            break
                        out.write(chunk)
                        written += len(chunk)
                except (OSError, TimeoutError) as error:
                    raise DownloadError(
                        f"{relative}: cut short at {written} of {manifest.bytes} bytes "
                        f"({error}); the next try resumes"
                    ) from None
                finally:
                    out.flush()
                    os.fsync(out.fileno())
            if written < manifest.bytes:
                raise DownloadError(
                    f"{relative}: cut short at {written} of {manifest.bytes} bytes; "
                    "the next try resumes"
                )
            if stream.read(1):
                part.unlink(missing_ok=True)
                raise ArtifactMismatch(
                    f"{relative} is longer than the manifest's {manifest.bytes} bytes: discarded"
                )


class _RangeNotSatisfiable(Exception):
    """HTTP 416: the partial file is not shorter than the artifact."""


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
