"""Retention of the media folder: files past their age go first, then the oldest ones until the
folder fits its size budget.

`plan_deletions` is the pure rule; `scan` and `sweep` do the file system work. Ages come from
the files' modification times against an injected `now_s`, so a test moves time, not files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.media.paths import is_temp_name

__all__ = ["StoredFile", "SweepResult", "plan_deletions", "scan", "sweep"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One media file: where, how big, when last written (Unix seconds)."""

    path: Path
    size: int
    mtime_s: float


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: files and bytes deleted, bytes kept."""

    deleted: int
    deleted_bytes: int
    kept_bytes: int


def plan_deletions(
    files: Sequence[StoredFile], now_s: float, max_age_s: float, max_bytes: int
) -> list[StoredFile]:
    """The files to delete: those older than `max_age_s` at `now_s`, then the oldest of the
    rest until the others together take at most `max_bytes`."""
    expired = [f for f in files if now_s - f.mtime_s > max_age_s]
    kept = sorted((f for f in files if now_s - f.mtime_s <= max_age_s), key=_age_order)
    total = sum(f.size for f in kept)
    over: list[StoredFile] = []
    for stored in kept:
        if total <= max_bytes:
            break
        over.append(stored)
        total -= stored.size
    return expired + over


def _age_order(stored: StoredFile) -> tuple[float, str]:
    return (stored.mtime_s, str(stored.path))  # the path settles ties: the same order each run


def scan(root: Path) -> list[StoredFile]:
    """Every finished media file under `root` (temp files left out)."""
    found: list[StoredFile] = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if is_temp_name(name):
                continue
            path = Path(folder) / name
            try:
                info = path.stat()
            except OSError:  # deleted meanwhile
                continue
            found.append(StoredFile(path, info.st_size, info.st_mtime))
    return found


def sweep(root: Path, now_s: float, max_age_s: float, max_bytes: int) -> SweepResult:
    """Apply `plan_deletions` under `root`, then remove the folders it left empty."""
    files = scan(root)
    doomed = plan_deletions(files, now_s, max_age_s, max_bytes)
    deleted = deleted_bytes = 0
    for stored in doomed:
        try:
            stored.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("media retention: cannot delete %s: %s", stored.path, exc)
            continue
        deleted += 1
        deleted_bytes += stored.size
    _remove_empty_folders(root, {f.path.parent for f in doomed})
    kept = sum(f.size for f in files) - deleted_bytes
    return SweepResult(deleted, deleted_bytes, kept)


def _remove_empty_folders(root: Path, folders: set[Path]) -> None:
    """Remove each of `folders` and its parents up to (not including) `root` once empty."""
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        current = folder
        while current != root and current.is_relative_to(root):
            try:
                current.rmdir()
            except OSError:  # not empty (or already gone): its parents are not empty either
                break
            current = current.parent
