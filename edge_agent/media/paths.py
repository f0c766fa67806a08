"""Where an event's media go under the media folder, their URLs, and safe lookups of them.

Layout: `<camera>/<YYYY-MM-DD>/<event id>.jpg` (snapshot), `..._crop.jpg` and `..._clip.<ext>`,
the date being the event's in UTC (no jumps at daylight-saving changes, the same as the
payload's timestamps). Files being written are named `.tmp-...` in the same folder and are
never served, counted or kept across a restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "TEMP_PREFIX",
    "EventFiles",
    "event_files",
    "is_temp_name",
    "media_url",
    "resolve_inside",
    "safe_component",
]

TEMP_PREFIX = ".tmp-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, slots=True)
class EventFiles:
    """Paths (POSIX, relative to the media folder) of one event's snapshot, crop and clip."""

    snapshot: str
    crop: str
    clip: str


def safe_component(text: str) -> str:
    """`text` usable as one path component: characters other than letters, digits, `_`, `.`
    and `-` become `_`, and it never starts with `.` (so never `..` nor a temp file)."""
    cleaned = _UNSAFE.sub("_", text)
    if not cleaned or cleaned.startswith("."):
        cleaned = "_" + cleaned
    return cleaned


def event_files(camera: str, event_id: str, timestamp_s: float, clip_suffix: str) -> EventFiles:
    """The relative paths of the media of event `event_id` of `camera` at `timestamp_s` (Unix);
    `clip_suffix` is the clip's extension with its dot (`.mp4`)."""
    day = datetime.fromtimestamp(timestamp_s, UTC).strftime("%Y-%m-%d")
    stem = f"{safe_component(camera)}/{day}/{safe_component(event_id)}"
    return EventFiles(f"{stem}.jpg", f"{stem}_crop.jpg", f"{stem}_clip{clip_suffix}")


def media_url(base_url: str | None, relative: str) -> str | None:
    """`base_url` + `/` + `relative` (percent-encoded), or None without a base URL."""
    if base_url is None:
        return None
    return f"{base_url.rstrip('/')}/{quote(relative, safe='/')}"


def is_temp_name(name: str) -> bool:
    """Whether a file name is that of a file still being written (or left by a crash)."""
    return name.startswith(TEMP_PREFIX)


def resolve_inside(root: Path, relative: str) -> Path | None:
    """The existing regular file `relative` names under `root` (absolute, resolved), or None:
    for an absolute path, a `..`, `.` or empty part, a backslash or NUL, a hidden or temp file,
    or a symlink leading outside `root`."""
    if not relative or "\x00" in relative or "\\" in relative or relative.startswith("/"):
        return None
    parts = relative.split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        return None
    try:
        candidate = (root / Path(*parts)).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate
