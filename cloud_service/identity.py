"""Checks on the identity fields a client chooses (`agent_id`, `camera_id`, `request_id`).

These strings key the batcher's fairness queues, appear in logs and (agent and camera) become
Prometheus label values, so a frame with an empty, overlong or odd one is answered
INVALID_ARGUMENT at admission, before it reaches a queue or a metric.
"""

from __future__ import annotations

import re

from protos.analytics.v1 import analytics_pb2 as pb

MAX_ID_LENGTH = 256  # an edge request id is `agent/camera/frame`: up to 150
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]*")
"""Letters, digits and `. _ : @ / -`, starting with a letter or digit (hostnames, UUIDs,
`site/camera-3`); nothing that needs escaping in a log line or a label value."""


def id_problem(name: str, value: str, *, required: bool = True) -> str | None:
    """Why `value` is not acceptable as the identity field `name`; None when it is."""
    if not value:
        return f"{name} is empty" if required else None
    if len(value) > MAX_ID_LENGTH:
        return f"{name} is {len(value)} characters long (at most {MAX_ID_LENGTH})"
    if ID_PATTERN.fullmatch(value) is None:
        return (
            f"{name} {value[:40]!r} has characters outside letters, digits and . _ : @ / - "
            "(or does not start with a letter or digit)"
        )
    return None


def request_problem(request: pb.FrameRequest) -> str | None:
    """The first identity problem of `request`, or None."""
    return (
        id_problem("agent_id", request.agent_id)
        or id_problem("camera_id", request.camera_id)
        or id_problem("request_id", request.request_id, required=False)
    )
