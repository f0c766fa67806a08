"""`fleet` run as a process against a real Mosquitto and a directory store.

Agents are played here by plain paho clients that publish the retained status documents the
agent side (edge_agent/fleet) publishes, so the operator's side is tested on its own; the fleet
test with real agent processes lives beside the agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from fleet.rollout import Rollout, SignedRollout, rollout_topic, status_topic
from fleet.signing import Verifier
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder

from .conftest import write_artifact

pytestmark = pytest.mark.process

PREFIX = "va"
OLD = {"name": "det", "version": "1", "sha256": "ab" * 32}


def fleet(*args: str | Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def broker_args(broker: MosquittoBroker) -> list[str]:
    return ["--broker", f"{broker.host}:{broker.port}", "--prefix", PREFIX, "--wait-s", "0.5"]


def rollout(
    action: str, setup: dict[str, Any], broker: MosquittoBroker, *args: str
) -> subprocess.CompletedProcess[str]:
    """`fleet rollout ACTION` on the test's store, key and broker, then `args`."""
    store, key = setup["store"], setup["key"]
    return fleet("rollout", action, "--store", store, "--key", key, *broker_args(broker), *args)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    key = tmp_path / "fleet.pem"
    made = fleet("keygen", key)
    assert made.returncode == 0, made.stderr
    public = made.stdout.split("public key: ")[1].split()[0]
    store = tmp_path / "store"
    model = write_artifact(tmp_path / "m.onnx", 50_000)
    published = fleet(
        "publish",
        "--store",
        store,
        "--key",
        key,
        "--name",
        "det",
        "--version",
        "2",
        "--admitted",
        "map50=0.7",
        "--input",
        "320x320",
        "--classes",
        "person,car",
        model,
    )
    assert published.returncode == 0, published.stderr
    sha = published.stdout.split("sha256 ")[1].split()[0]
    return {"key": key, "public": public, "store": store, "sha": sha, "model": model}


def test_publish_and_verify(setup: dict[str, Any], tmp_path: Path) -> None:
    ok = fleet("verify", "--store", setup["store"], "--trust", setup["public"], "det:2")
    assert ok.returncode == 0, ok.stderr
    assert "ok: det:2@" in ok.stdout and "artifact hash matches" in ok.stdout
    manifest = json.loads((setup["store"] / "models/det/2.json").read_text())["manifest"]
    assert manifest["admitted"] == {"map50": 0.7}
    assert manifest["classes"] == ["person", "car"]

    fleet("keygen", tmp_path / "other.pem")
    other = fleet("pubkey", "--key", tmp_path / "other.pem").stdout.strip()
    refused = fleet("verify", "--store", setup["store"], "--trust", other, "det:2")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("fleet: refused: no signature by a trusted key")

    blob = setup["store"] / f"blobs/sha256/{setup['sha']}"
    blob.write_bytes(b"x" + blob.read_bytes()[1:])
    tampered = fleet("verify", "--store", setup["store"], "--trust", setup["public"], "det:2")
    assert tampered.returncode == 1
    assert "refused: hash mismatch" in tampered.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["publish", "--store", "S", "--key", "K", "--name", "a/b", "--version", "1", "m"],
            "not a valid name",
        ),
        (
            ["publish", "--store", "S", "--key", "NOKEY", "--name", "a", "--version", "1", "m"],
            "cannot read key NOKEY",
        ),
        (["verify", "--store", "S", "--trust", "AAAA", "det:2"], "an Ed25519 key is 32 bytes"),
        (["verify", "--store", "S", "--trust", "x", "det"], "expected NAME:VERSION"),
        (["list", "--broker", "127.0.0.1:9"], "cannot reach the broker at 127.0.0.1:9"),
        (["list", "--broker", "nowhere"], "expected host:port"),
        (["list", "--wait-s", "0"], "expected 0.1..60 seconds"),
        (
            [
                "publish",
                "--store",
                "S",
                "--key",
                "K",
                "--name",
                "a",
                "--version",
                "1",
                "--admitted",
                "map=high",
                "m",
            ],
            "expected NAME=NUMBER",
        ),
    ],
)
def test_bad_input_is_one_clear_line(setup: dict[str, Any], args: list[str], message: str) -> None:
    args = [setup["key"] if a == "K" else setup["store"] if a == "S" else a for a in args]
    result = fleet(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_publish_of_a_missing_model(setup: dict[str, Any]) -> None:
    result = fleet(
        "publish",
        "--store",
        setup["store"],
        "--key",
        setup["key"],
        "--name",
        "det",
        "--version",
        "3",
        setup["store"] / "missing.onnx",
    )
    assert (result.returncode, result.stderr.strip()) == (
        2,
        f"fleet: model file not found: {setup['store'] / 'missing.onnx'}",
    )


def _rollout(recorder: MqttRecorder, group: str = "default") -> Rollout:
    topic = rollout_topic(PREFIX, group)
    retained = [m for m in recorder.on(topic) if m.payload]
    assert retained, f"nothing on {topic}"
    return SignedRollout.parse(retained[-1].payload).rollout


def test_rollout_start_promote_halt(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker
) -> None:
    common = ["--key", setup["key"], *broker_args(mosquitto_broker)]
    started = fleet(
        "rollout",
        "start",
        "--store",
        setup["store"],
        *common,
        "--model",
        "det:2",
        "--canary",
        "box-1,box-2",
        "--soak",
        "30",
    )
    assert started.returncode == 0, started.stderr
    recorder = MqttRecorder(mosquitto_broker, f"{PREFIX}/fleet/rollouts/#")
    try:
        recorder.wait_for(lambda got: any(m.payload for m in got))
        message = recorder.on(rollout_topic(PREFIX, "default"))[0]
        assert (message.qos, message.retain) == (1, True)
        signed = SignedRollout.parse(message.payload)
        rollout = signed.verified(Verifier([setup["public"]]))
        assert rollout.stage == "canary" and rollout.canary == ["box-1", "box-2"]
        assert rollout.model.sha256 == setup["sha"] and rollout.soak_s == 30

        assert fleet("promote", *common).returncode == 0
        recorder.wait_for(lambda got: len(got) >= 2)
        assert _rollout(recorder).stage == "all"
        assert _rollout(recorder).rollout_id == rollout.rollout_id

        assert fleet("halt", *common).returncode == 0
        recorder.wait_for(lambda got: len(got) >= 3)
        assert _rollout(recorder).stage == "halted"
        refused = fleet("promote", *common)
        assert refused.returncode == 2 and "is halted: start anew" in refused.stderr

        cleared = fleet("rollout", "clear", *broker_args(mosquitto_broker))
        assert cleared.returncode == 0
        recorder.wait_for(lambda got: got[-1].payload == b"")
        nothing = fleet("promote", *common)
        assert nothing.returncode == 2 and "has no rollout to all" in nothing.stderr
    finally:
        recorder.close()


def test_rollout_of_an_unpublished_model(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker
) -> None:
    result = rollout(
        "start",
        setup,
        mosquitto_broker,
        "--model",
        "det:9",
    )
    assert result.returncode == 2 and "models/det/9.json is not in the store" in result.stderr


def _status(agent: str, **fields: Any) -> bytes:
    document: dict[str, Any] = {
        "agent_id": agent,
        "site": "site-a",
        "groups": ["default"],
        "state": "idle",
        "model": None,
        "previous": None,
        "desired": None,
        "cameras": {},
        "rejected": [],
        "detail": "",
        "updated_at": "2026-12-05T04:00:00Z",
    }
    document.update(fields)
    return json.dumps(document).encode()


def _publish(broker: MosquittoBroker, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
    client.connect(broker.host, broker.port)
    client.loop_start()
    client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def test_list_reads_the_retained_status_documents(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker
) -> None:
    sha = setup["sha"]
    new = {"name": "det", "version": "2", "sha256": sha}
    old = {"name": "det", "version": "1", "sha256": "ab" * 32}
    started = rollout(
        "start",
        setup,
        mosquitto_broker,
        "--model",
        "det:2",
        "--canary",
        "box-1,box-3",
    )
    assert started.returncode == 0, started.stderr
    statuses: dict[str, dict[str, Any]] = {
        "box-1": {"model": new, "previous": old, "cameras": {"gate": "det:2", "dock": "det:2"}},
        "box-2": {"model": old, "cameras": {"gate": "det:1"}},
        "box-3": {"model": old, "state": "rolled_back", "rejected": [sha], "detail": "worse"},
    }
    for agent, fields in statuses.items():
        _publish(mosquitto_broker, status_topic(PREFIX, agent), _status(agent, **fields))
    _publish(mosquitto_broker, status_topic(PREFIX, "broken"), b"not json")
    _publish(mosquitto_broker, f"{PREFIX}/box-1/availability", b"online")
    _publish(mosquitto_broker, f"{PREFIX}/box-3/availability", b"offline")

    listed = fleet("list", *broker_args(mosquitto_broker))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("group default: det:2@") and "canary box-1, box-3" in lines[0]
    rows = {line.split()[0]: line for line in lines[3:]}
    assert set(rows) == {"box-1", "box-2", "box-3"}
    assert "dock=det:2, gate=det:2" in rows["box-1"]

    as_json = fleet("list", "--json", *broker_args(mosquitto_broker))
    table = {row["agent"]: row for row in json.loads(as_json.stdout)}
    assert (table["box-1"]["behind"], table["box-1"]["rolled_back"]) == (False, False)
    assert (table["box-2"]["behind"], table["box-2"]["desired"]) == (False, "-")  # not canary
    assert (table["box-3"]["behind"], table["box-3"]["rolled_back"]) == (False, True)
    assert [table[b]["online"] for b in ("box-1", "box-2", "box-3")] == ["yes", "?", "no"]
    assert table["box-3"]["state"] == "rolled_back"
    assert "not a status document" in as_json.stderr  # the broken one, logged and skipped


class PlayedAgent:
    """A paho client that answers rollouts as an agent would: runs or rolls back the model."""

    def __init__(
        self, broker: MosquittoBroker, agent: str, respond: Callable[[Rollout], bytes | None]
    ) -> None:
        self.agent = agent
        self.respond = respond
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"agent-{agent}")
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port)
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.loop_start()
        # as an agent does on start: its status, retained (the controller's roster of the group)
        self.client.publish(
            status_topic(PREFIX, agent), _status(agent, model=OLD), qos=1, retain=True
        ).wait_for_publish(10)
        self.client.subscribe(f"{PREFIX}/fleet/rollouts/+", qos=1)
        assert subscribed.wait(10)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            return
        answer = self.respond(SignedRollout.parse(bytes(msg.payload)).rollout)
        if answer is not None:
            client.publish(status_topic(PREFIX, self.agent), answer, qos=1, retain=True)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def agents(mosquitto_broker: MosquittoBroker) -> Iterator[list[PlayedAgent]]:
    played: list[PlayedAgent] = []
    yield played
    for agent in played:
        agent.close()


def _taker(agent: str) -> Callable[[Rollout], bytes | None]:
    def respond(rollout: Rollout) -> bytes | None:
        ref = rollout.model.as_json()
        if rollout.stage == "all" or agent in rollout.canary and rollout.stage == "canary":
            return _status(agent, model=ref, state="evaluating", cameras={"gate": "det:2"})
        return None

    return respond


def test_rollout_run_promotes_after_the_soak(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker, agents: list[PlayedAgent]
) -> None:
    for name in ("box-1", "box-2", "box-3"):
        agents.append(PlayedAgent(mosquitto_broker, name, _taker(name)))
    result = rollout(
        "run",
        setup,
        mosquitto_broker,
        "--model",
        "det:2",
        "--canary",
        "box-1",
        "--soak",
        "1",
        "--canary-timeout-s",
        "30",
        "--wait-all-s",
        "30",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "canary runs det:2@" in result.stdout
    assert "stage all" in result.stdout
    assert "all 3 agent(s) of default run det:2@" in result.stdout


def test_rollout_run_halts_when_the_canary_rolls_back(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker, agents: list[PlayedAgent]
) -> None:
    def rolls_back(rollout: Rollout) -> bytes | None:
        if rollout.stage != "canary":
            return None
        return _status(
            "box-1",
            state="rolled_back",
            rejected=[rollout.model.sha256],
            detail="detections per frame fell 60 %",
            desired=rollout.model.as_json(),
        )

    agents.append(PlayedAgent(mosquitto_broker, "box-1", rolls_back))
    recorder = MqttRecorder(mosquitto_broker, f"{PREFIX}/fleet/rollouts/#")
    try:
        result = rollout(
            "run",
            setup,
            mosquitto_broker,
            "--model",
            "det:2",
            "--canary",
            "box-1",
            "--soak",
            "60",
            "--canary-timeout-s",
            "30",
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert "halted: box-1 rolled it back: detections per frame fell 60 %" in result.stdout
        recorder.wait_for(lambda got: len(got) >= 2)
        assert _rollout(recorder).stage == "halted"
    finally:
        recorder.close()


def test_rollout_run_halts_when_the_canary_does_not_answer(
    setup: dict[str, Any], mosquitto_broker: MosquittoBroker
) -> None:
    result = rollout(
        "run",
        setup,
        mosquitto_broker,
        "--model",
        "det:2",
        "--canary",
        "box-9",
        "--canary-timeout-s",
        "2",
    )
    assert result.returncode == 1
    assert "the canary did not take it in 2 s (waiting for box-9 (no status yet))" in result.stdout
