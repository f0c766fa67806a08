"""The agent's local status page: live annotated frames, camera states and recent events.

- `LiveView` (live.py): the newest frame per camera and the recent events, handed over by the
  frame loop (an agent hook and an alert sink) and drawn + encoded only when a client asks.
- `StatusServer` (server.py): the HTTP server (hypercorn, its own thread); `StatusApp` (app.py):
  the routes and every check made on a request head before its body is read.
- `status_report` (report.py): the `/api/status` document; `render_page` (page.py): the HTML.
- `attach_status_page` (attach.py): all of it on a running `EdgeAgent`, from `web:` config.
"""

from edge_agent.web.attach import attach_status_page
from edge_agent.web.auth import Authenticator
from edge_agent.web.live import FrameInfo, JpegFrame, LiveView
from edge_agent.web.page import CONTENT_SECURITY_POLICY, render_page
from edge_agent.web.report import status_report
from edge_agent.web.server import MediaResolver, StatusServer, StatusSource

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "Authenticator",
    "FrameInfo",
    "JpegFrame",
    "LiveView",
    "MediaResolver",
    "StatusServer",
    "StatusSource",
    "attach_status_page",
    "render_page",
    "status_report",
]
