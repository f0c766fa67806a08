"""The test world's RTSP camera: `testbed/rtsp_server.py` (GStreamer) run by the system python3.

`RtspServer(clip)` serves an H.264 MP4 in an endless loop on a free loopback port (`url`,
`start()`, `stop()`, `restart()`, `kill()`, `log_tail()`); `rtsp_server_unavailable_reason()`
says why it cannot run here (no python3-gi or GStreamer parts), or None. The tests' fixtures and
the demo both use it.
"""

from __future__ import annotations

import logging
import subprocess
from functools import cache
from pathlib import Path

from testbed.processes import ManagedProcess, free_tcp_port

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = REPO_ROOT / "testbed" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"
RTSP_HOST = "127.0.0.1"
_EXIT_MISSING_DEPENDENCY = 3  # testbed/rtsp_server.py --check


class RtspServer:
    """The test RTSP server on a fixed loopback port; `stop()` and `start()` keep the URL."""

    def __init__(self, clip: Path, *, mount: str = "stream", port: int | None = None) -> None:
        self.clip = clip
        self.host = RTSP_HOST
        self.port = port if port is not None else free_tcp_port(self.host)
        self.mount = mount.strip("/")
        self.url = f"rtsp://{self.host}:{self.port}/{self.mount}"
        self.process = ManagedProcess(
            f"rtsp-server:{self.port}",
            [
                SYSTEM_PYTHON,
                str(SERVER_SCRIPT),
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--mount",
                self.mount,
                "--clip",
                str(clip),
            ],  # fmt: skip
            # Printed after the listening socket is bound.
            ready_pattern=r"^READY (rtsp://\S+)$",
        )

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.process.running

    def start(self, *, ready_timeout_s: float = 15.0) -> None:
        """Start the server and wait until it listens."""
        self.process.start(ready_timeout_s=ready_timeout_s)

    def stop(self, *, term_timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); open client connections are closed."""
        self.process.stop(term_timeout_s=term_timeout_s)

    def kill(self) -> None:
        """SIGKILL the server, as in a crash."""
        self.process.kill()

    def restart(self, *, ready_timeout_s: float = 15.0) -> None:
        """Stop and start again on the same port and mount."""
        self.process.restart(ready_timeout_s=ready_timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        """The server's last log lines (all runs), for assertion messages."""
        return self.process.output_tail(lines)

    def __repr__(self) -> str:
        return f"RtspServer({self.url}, running={self.running})"


@cache
def rtsp_server_unavailable_reason(check_timeout_s: float = 30.0) -> str | None:
    """Why the RTSP server cannot run here (missing python3-gi / GStreamer parts), or None."""
    if not Path(SYSTEM_PYTHON).is_file():
        return f"{SYSTEM_PYTHON} not found (the RTSP server needs the system python3-gi)"
    result = subprocess.run(  # noqa: S603 - fixed argument list
        [SYSTEM_PYTHON, str(SERVER_SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=check_timeout_s,
        check=False,
    )
    if result.returncode == _EXIT_MISSING_DEPENDENCY:
        return result.stderr.strip() or "GStreamer RTSP server dependencies missing"
    if result.returncode != 0:
        raise RuntimeError(
            f"{SERVER_SCRIPT} --check exited with {result.returncode}:\n{result.stderr[-2000:]}"
        )
    return None
