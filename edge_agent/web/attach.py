"""`attach_status_page`: the status page of a running `EdgeAgent`, wired in one call."""

from __future__ import annotations

from collections.abc import Mapping

from edge_agent.config.web import WebConfig
from edge_agent.pipeline.agent import EdgeAgent
from edge_agent.web.live import LiveView
from edge_agent.web.server import MediaResolver, ReloadAction, StatusServer

__all__ = ["attach_status_page"]


def attach_status_page(
    agent: EdgeAgent,
    config: WebConfig,
    *,
    environ: Mapping[str, str] | None = None,
    media_resolver: MediaResolver | None = None,
    reload: ReloadAction | None = None,
) -> StatusServer | None:
    """Serve `agent`'s status page as `config` says; None when the page is disabled.

    The page's `LiveView` sees every analysed frame (an agent hook) and every event (an alert
    sink). Raises `SecretError` (auth secret unavailable) or `OSError` (address not bindable)
    before anything is attached to the agent. The caller closes the server. `reload` serves
    `POST /api/reload`; after any reload the view follows the new cameras.
    """
    if not config.enabled:
        return None
    view = LiveView.from_config(config)
    cameras = [camera for camera in agent.config.cameras if camera.enabled]
    view.set_cameras(cameras, agent.detector.class_names)
    server = StatusServer(
        config, view, agent.status_documents, media_resolver, environ=environ, reload=reload
    )
    server.start()
    agent.hooks.append(view.observe)
    agent.alerts.sinks.append(view)
    agent.reload_listeners.append(
        lambda new, _plan: view.set_cameras(
            [camera for camera in new.cameras if camera.enabled], agent.detector.class_names
        )
    )
    return server
