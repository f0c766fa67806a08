"""The URL a camera is opened with: the configured one, with credentials from secrets."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from edge_agent.config.camera import CameraConfig


def camera_url(camera: CameraConfig, environ: Mapping[str, str] | None = None) -> str:
    """`camera.url` with `username` and the resolved password put into its authority.

    File paths and URLs without a configured user come back unchanged. Raises `SecretError`
    when the password's secret cannot be resolved. The result holds the password: never log it
    (use `redact_url`).
    """
    if "://" not in camera.url or camera.username is None:
        return camera.url
    parts = urlsplit(camera.url)
    user = quote(camera.username, safe="")
    if camera.password is not None:
        user += ":" + quote(camera.password.resolve(environ=environ), safe="")
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and status messages."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{parts.username}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
