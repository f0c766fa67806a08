"""Running the agent as a service: systemd readiness, status and watchdog notifications."""

from edge_agent.service.systemd import SystemdNotifier, watchdog_timeout_s

__all__ = ["SystemdNotifier", "watchdog_timeout_s"]
