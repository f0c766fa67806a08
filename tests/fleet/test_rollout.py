"""Rollout documents: who should run what, signed, and the topics they travel on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.manifest import ManifestError, ModelRef
from fleet.rollout import (
    Rollout,
    SignedRollout,
    desired,
    events_topic,
    rollout_topic,
    status_topic,
)
from fleet.signing import SignatureError, Signer, Verifier

MODEL = ModelRef("edge-det", "2.0.0", "ab" * 32)


def _rollout(stage: str = "canary", **changes: object) -> Rollout:
    fields: dict[str, object] = {
        "rollout_id": "r-1",
        "group": "default",
        "model": MODEL,
        "stage": stage,
        "canary": ["box-1"],
        "issued_at": "2026-12-05T04:00:00Z",
        "soak_s": 60.0,
    }
    fields.update(changes)
    return Rollout.model_validate(fields)


@pytest.mark.parametrize(
    ("stage", "agent", "expected"),
    [
        ("canary", "box-1", MODEL),
        ("canary", "box-2", None),
        ("all", "box-1", MODEL),
        ("all", "box-2", MODEL),
        ("halted", "box-1", None),
        ("halted", "box-2", None),
    ],
)
def test_desired(stage: str, agent: str, expected: ModelRef | None) -> None:
    assert desired(_rollout(stage), agent) == expected


def test_signed_rollout_round_trip(key: tuple[Path, str]) -> None:
    signed = SignedRollout.sign(_rollout(), Signer.from_file(key[0]))
    parsed = SignedRollout.parse(signed.to_bytes())
    assert parsed == signed
    assert parsed.verified(Verifier([key[1]])) == _rollout()
    payload = json.loads(signed.to_bytes())
    assert set(payload) == {"rollout", "signatures"}
    assert payload["rollout"]["model"] == MODEL.as_json()


def test_an_altered_rollout_is_refused(key: tuple[Path, str]) -> None:
    payload = json.loads(SignedRollout.sign(_rollout(), Signer.from_file(key[0])).to_bytes())
    payload["rollout"]["stage"] = "all"
    with pytest.raises(SignatureError, match="bad signature"):
        SignedRollout.parse(json.dumps(payload).encode()).verified(Verifier([key[1]]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stage": "everyone"}, "stage"),
        ({"canary": ["a/b"]}, "canary agent id"),
        ({"soak_s": -1}, "soak_s"),
        ({"group": "#"}, "group"),
        ({"model": {"name": "m", "version": "1", "sha256": "zz"}}, "sha256"),
    ],
)
def test_bad_rollouts(changes: dict[str, object], message: str) -> None:
    document = _rollout().model_dump(mode="json") | changes
    payload = json.dumps({"rollout": document, "signatures": []}).encode()
    with pytest.raises(ManifestError, match=message):
        SignedRollout.parse(payload)


def test_topics() -> None:
    assert rollout_topic("va", "default") == "va/fleet/rollouts/default"
    assert status_topic("va/site-1", "box-1") == "va/site-1/fleet/status/box-1"
    assert events_topic("va", "box-1") == "va/fleet/events/box-1"
    with pytest.raises(ValueError, match="agent id"):
        status_topic("va", "box/+")
