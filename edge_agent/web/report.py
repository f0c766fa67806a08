"""What `/api/status` returns and the page shows: cameras with their status, recent events.

```json
{"schema": "edge-status-page/v1", "generated": "2026-12-02T10:00:00.000Z", "agent": "edge-01",
 "cameras": [{"name": "dock", "status": {...the camera's status document...},
              "frame": {"index": 812, "captured": "...", "age_s": 0.04, "width": 640,
                        "height": 360, "url": "/api/cameras/dock/frame.jpg?f=812"}}],
 "events": [{"event": {...edge-alert/v1 payload...},
             "links": {"snapshot": "/media/dock/....jpg", "crop": null, "clip": null}}]}
```

`frame` is null before a camera's first analysed frame, `status` null for a camera the agent
has no status for. `links` are what a browser can open: `/media/<path>` for media the server
can serve (a relative `path` and a resolver), else the reference's own `url` when it is an
http(s) or site-absolute URL, else null.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from edge_agent.alerts.payload import iso_utc
from edge_agent.web.live import LiveView

__all__ = [
    "MEDIA_KINDS",
    "SCHEMA",
    "frame_url",
    "media_link",
    "safe_relative_path",
    "status_report",
]

SCHEMA = "edge-status-page/v1"
MEDIA_KINDS = ("snapshot", "crop", "clip")


def safe_relative_path(raw: str) -> str | None:
    """`raw` if it is a plain relative POSIX path (no leading `/`, empty part, part starting
    with `.` (`..`, hidden and temp files), backslash or NUL), else None: what `/media/` passes
    on to the resolver."""
    if not raw or "\x00" in raw or "\\" in raw or raw.startswith("/"):
        return None
    if any(not part or part.startswith(".") for part in raw.split("/")):
        return None
    return raw


def frame_url(camera: str, index: int | None = None) -> str:
    """The URL of a camera's live frame; `index` makes each frame a new URL for the browser."""
    url = f"/api/cameras/{quote(camera, safe='')}/frame.jpg"
    return url if index is None else f"{url}?f={index}"


def media_link(reference: object, local_media: bool) -> str | None:
    """A URL the page can open for one media reference (`{"path": ..., "url": ...}`)."""
    if not isinstance(reference, Mapping):
        return None
    path, url = reference.get("path"), reference.get("url")
    if local_media and isinstance(path, str) and safe_relative_path(path) is not None:
        return "/media/" + quote(path)
    if isinstance(url, str):
        if url.startswith(("http://", "https://")):
            return url
        if url.startswith("/") and not url.startswith("//"):
            return url
    return None


def _event_entry(payload: Mapping[str, object], local_media: bool) -> dict[str, object]:
    media = payload.get("media")
    references = media if isinstance(media, Mapping) else {}
    links = {kind: media_link(references.get(kind), local_media) for kind in MEDIA_KINDS}
    return {"event": dict(payload), "links": links}


def status_report(
    view: LiveView,
    documents: Mapping[str, Mapping[str, object]],
    now_s: float,
    *,
    local_media: bool,
) -> dict[str, object]:
    """The `/api/status` document (module docstring) at wall time `now_s`."""
    names = view.cameras()
    names += [name for name in documents if name not in names]
    cameras: list[dict[str, object]] = []
    for name in names:
        info = view.frame_info(name)
        frame = None
        if info is not None:
            frame = {
                "index": info.index,
                "captured": iso_utc(info.capture_time_s),
                "age_s": round(max(0.0, now_s - info.capture_time_s), 2),
                "width": info.width,
                "height": info.height,
                "url": frame_url(name, info.index),
            }
        document = documents.get(name)
        status = dict(document) if document is not None else None
        cameras.append({"name": name, "status": status, "frame": frame})
    agent = next((d.get("agent") for d in documents.values() if d.get("agent")), None)
    return {
        "schema": SCHEMA,
        "generated": iso_utc(now_s),
        "agent": agent if isinstance(agent, str) else None,
        "cameras": cameras,
        "events": [_event_entry(p, local_media) for p in view.recent_events()],
    }
