"""The operator's pure logic: the canary verdict, group progress and the fleet table."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.controller import canary_verdict, group_progress
from fleet.manifest import ManifestError, ModelRef
from fleet.rollout import Rollout
from fleet.status import AgentStatus, fleet_rows, parse_status, render_table

NEW = {"name": "det", "version": "2", "sha256": "cd" * 32}
OLD = {"name": "det", "version": "1", "sha256": "ab" * 32}


def _status(agent: str, **fields: Any) -> AgentStatus:
    return AgentStatus.model_validate({"agent_id": agent, "groups": ["default"], **fields})


@pytest.mark.parametrize(
    ("statuses", "kind", "detail"),
    [
        ({}, "waiting", "box-1 (no status yet)"),
        ({"box-1": {"model": OLD, "state": "downloading"}}, "waiting", "box-1 (downloading)"),
        ({"box-1": {"model": NEW, "state": "evaluating"}}, "running", "all 1 canary"),
        (
            {
                "box-1": {
                    "model": OLD,
                    "state": "rolled_back",
                    "rejected": [NEW["sha256"]],
                    "detail": "worse",
                }
            },
            "failed",
            "box-1 rolled it back: worse",
        ),
        (
            {
                "box-1": {
                    "model": OLD,
                    "state": "refused",
                    "rejected": [NEW["sha256"]],
                    "detail": "bad signature",
                }
            },
            "failed",
            "box-1 refused it: bad signature",
        ),
        ({"box-1": {"model": OLD, "state": "refused", "desired": NEW}}, "failed", "is refused"),
        ({"box-1": {"model": OLD, "state": "refused", "desired": OLD}}, "waiting", "box-1"),
    ],
)
def test_canary_verdict(statuses: dict[str, Any], kind: str, detail: str) -> None:
    verdict = canary_verdict(
        NEW["sha256"], ["box-1"], {a: _status(a, **f) for a, f in statuses.items()}
    )
    assert verdict.kind == kind
    assert detail in verdict.detail


def test_group_progress() -> None:
    statuses = {
        "a": _status("a", model=NEW),
        "b": _status("b", model=OLD),
        "c": _status("c", model=OLD, groups=["lab"]),
    }
    assert group_progress(NEW["sha256"], "default", statuses) == (["a"], ["b"])


def test_fleet_rows_and_table() -> None:
    rollout = Rollout(
        rollout_id="r1",
        group="default",
        model=ModelRef(**NEW),
        stage="all",
        canary=[],
        issued_at="2026-12-05T04:00:00Z",
    )
    rows = fleet_rows(
        [
            _status("b", site="s1", model=OLD, cameras={"gate": "det:1"}),
            _status("a", site="s1", model=NEW, cameras={"gate": "det:2"}),
            _status("c", site="s0", model=OLD, state="rolled_back", rejected=[NEW["sha256"]]),
        ],
        {"default": rollout},
        {"a": "online", "c": "offline"},
    )
    assert [(r.agent, r.online, r.behind, r.rolled_back) for r in rows] == [
        ("c", "no", False, True),
        ("a", "yes", False, False),
        ("b", "?", True, False),
    ]
    table = render_table(rows).splitlines()
    assert table[0].split() == [
        "agent",
        "site",
        "online",
        "model",
        "per",
        "camera",
        "desired",
        "state",
        "behind",
        "rolled",
        "back",
    ]
    assert table[4].split() == ["b", "s1", "?", "gate=det:1", "det:2", "idle", "yes", "no"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{", "not a status document"),
        (b'{"agent_id": "a/b"}', "not a status document"),
        (b"x" * 70_000, "too large"),
    ],
)
def test_bad_status_documents(payload: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_status(payload)
