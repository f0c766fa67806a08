"""Atomic file writes: a temp file in the same folder, synced, then renamed over the target.

A reader (the web server, a sync job) sees either no file or the whole file, and a crash leaves
at most a `.tmp-...` file, which `remove_temp_files` clears at the next start.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from edge_agent.media.paths import TEMP_PREFIX, is_temp_name

__all__ = ["commit_temp", "remove_temp_files", "temp_path_for", "write_atomic"]

logger = logging.getLogger(__name__)


def temp_path_for(path: Path) -> Path:
    """A unique temp name next to `path`, keeping its name (and so its extension) at the end:
    OpenCV picks the video container from the extension."""
    return path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{path.name}")


def commit_temp(temp: Path, path: Path) -> int:
    """Sync `temp` to disk and rename it to `path` (atomic on one file system); its size."""
    try:
        with temp.open("rb+") as handle:
            os.fsync(handle.fileno())  # the data before the rename, or a crash may keep 0 bytes
        size = temp.stat().st_size
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return size


def write_atomic(path: Path, data: bytes) -> int:
    """Write `data` to `path` atomically (creating its folder); the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path)
    try:
        temp.write_bytes(data)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return commit_temp(temp, path)


def remove_temp_files(root: Path) -> int:
    """Delete the temp files a crash left anywhere under `root`; how many."""
    removed = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if is_temp_name(name):
                try:
                    (Path(folder) / name).unlink()
                    removed += 1
                except OSError as exc:
                    logger.warning("cannot remove leftover temp file %s: %s", name, exc)
    return removed
