"""`FleetUpdater` in-process on a real Mosquitto and a real store directory: what it refuses.

The agent is built (real detector, real publisher) but its cameras are never started: every case
here is refused before a swap, so no frame loop is needed. Each bad input must give one clear
`ERROR` line, a `refused` event on the events topic and no change of model; the fleet test
(`test_fleet_e2e.py`) covers what is accepted, with agent processes.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.config import EdgeAgentConfig
from edge_agent.fleet.state import FleetState, load_state
from edge_agent.fleet.updater import FleetUpdater
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline import EdgeAgent
from fleet.manifest import ModelRef, utc_now_iso
from fleet.rollout import Rollout, SignedRollout, events_topic, rollout_topic, status_topic
from fleet.signing import Signer, generate_key
from fleet.store import DirectoryStore
from tests.fixtures.agent_process import CLASS_NAMES, REPO_ROOT
from tests.fixtures.mqtt import MosquittoBroker, MqttRecorder

EDGE_ONNX = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx"
EDGE_TFLITE = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"
COCO_ONNX = REPO_ROOT / "models" / "coco" / "nanodet-coco-int8.onnx"
PREFIX = "fleet-unit"
AGENT = "box-1"
WAIT_S = 30.0


class World:
    """A store with a signing key, an agent that is not started, its updater, a recorder."""

    def __init__(self, tmp_path: Path, broker: MosquittoBroker) -> None:
        self.signer_key = tmp_path / "key.pem"
        public = generate_key(self.signer_key)
        self.signer = Signer.from_file(self.signer_key)
        self.store = DirectoryStore(tmp_path / "store")
        self.broker = broker
        self.state_dir = tmp_path / "fleet"
        config = EdgeAgentConfig.model_validate(
            {
                "agent": {"id": AGENT},
                "cameras": [{"name": "cam", "url": "rtsp://127.0.0.1:9/none"}],
                "detector": {
                    "runtime": {"type": "onnxruntime", "model_path": str(EDGE_ONNX)},
                    "class_names": CLASS_NAMES,
                    "input_size": [320, 320],
                },
                "mqtt": {
                    "host": broker.host,
                    "port": broker.port,
                    "topic_prefix": PREFIX,
                    "outbox_path": str(tmp_path / "outbox.sqlite3"),
                },
                "metrics": {"enabled": False},
                "fleet": {
                    "enabled": True,
                    "store_url": (tmp_path / "store").as_uri(),
                    "trusted_keys": [public],
                    "state_dir": str(self.state_dir),
                    "disk_budget_mb": 1.0,  # the 10 MB edge model does not fit
                    "status_interval_s": 1.0,
                },
            }
        )
        self.recorder = MqttRecorder(broker, f"{PREFIX}/fleet/#")
        self.metrics = EdgeMetrics()
        self.agent = EdgeAgent.from_config(config, metrics=self.metrics)
        self.updater = FleetUpdater(self.agent, config.detector, FleetState(), metrics=self.metrics)
        self.updater.start()

    def publish(self, model: Path, version: str, **facts: Any) -> ModelRef:
        return self.store.publish(model, "edge", version, self.signer, **facts).manifest.ref

    def roll_out(self, payload: bytes) -> None:
        info = self.recorder.client.publish(
            rollout_topic(PREFIX, "default"), payload, qos=1, retain=True
        )
        info.wait_for_publish(WAIT_S)

    def rollout(self, ref: ModelRef, group: str = "default") -> bytes:
        rollout = Rollout(
            rollout_id=f"r-{ref.version}",
            group=group,
            model=ref,
            stage="all",
            issued_at=utc_now_iso(),
        )
        return SignedRollout.sign(rollout, self.signer).to_bytes()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(m.payload) for m in self.recorder.on(events_topic(PREFIX, AGENT))]

    def wait_refusals(self, count: int) -> dict[str, Any]:
        self.recorder.wait_for(
            lambda _: len([e for e in self.events() if e["event"] == "refused"]) >= count,
            timeout_s=WAIT_S,
        )
        return [e for e in self.events() if e["event"] == "refused"][count - 1]

    def close(self) -> None:
        self.updater.close()
        self.agent.close(flush_timeout_s=1.0)
        self.recorder.client.publish(rollout_topic(PREFIX, "default"), b"", retain=True)
        self.recorder.close()


@pytest.fixture
def world(tmp_path: Path, mosquitto_broker: MosquittoBroker) -> Iterator[World]:
    started = World(tmp_path, mosquitto_broker)
    yield started
    started.close()


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name == "edge_agent.fleet.updater"
    ]


def test_every_bad_rollout_or_model_is_refused_with_one_line_and_nothing_loads(
    world: World, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    running = world.agent.model
    cases: list[tuple[bytes, str]] = [
        (b"not a rollout", "rollout on fleet-unit/fleet/rollouts/default refused"),
        (b'{"rollout": {}, "signatures": []}', "refused: invalid rollout"),
    ]
    lite = world.publish(EDGE_TFLITE, "lite")
    coco = world.publish(COCO_ONNX, "coco", input_size=(320, 416))
    copy = tmp_path / "edge-copy.onnx"
    shutil.copyfile(EDGE_ONNX, copy)
    with copy.open("ab") as handle:
        handle.write(b"\0")  # other bytes: another digest, ONNX Runtime never reads them here
    big = world.publish(copy, "big", classes=CLASS_NAMES, input_size=(320, 320))
    cases += [
        (world.rollout(lite, group="other"), "names group 'other'"),
        (world.rollout(lite), "runs on litert, this box's detector on onnxruntime"),
        (world.rollout(coco), "names classes"),
        (world.rollout(big), "does not fit the disk budget"),
    ]
    for count, (payload, message) in enumerate(cases, start=1):
        world.roll_out(payload)
        event = world.wait_refusals(count)
        assert message in event["reason"], event
        errors = _errors(caplog)
        assert len(errors) == count, errors
        assert message in errors[-1] and errors[-1].endswith("nothing loaded"), errors[-1]

    assert world.agent.model == running  # nothing was swapped
    state = load_state(world.state_dir)
    assert lite.sha256 in state.rejected and coco.sha256 in state.rejected
    assert big.sha256 not in state.rejected  # a bigger budget and a restart try it again
    assert state.current is None and state.trial is None
    world.recorder.wait_for(
        lambda messages: any(
            m.topic == status_topic(PREFIX, AGENT) and json.loads(m.payload)["state"] == "refused"
            for m in messages
        ),
        timeout_s=WAIT_S,
    )
    registry = world.metrics.registry
    refused = registry.get_sample_value("edge_agent_fleet_updates_total", {"outcome": "refused"})
    assert refused == len(cases)


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"ca_path": "/nonexistent/ca.pem"}, "cannot start the fleet updater: cannot load CA file"),
        ({"state_dir": "/proc/fleet-state"}, "cannot start the fleet updater: [Errno"),
        ({"state_dir": "{tmp}/a-file"}, "cannot read or write the fleet state"),
    ],
)
def test_run_refuses_a_fleet_it_cannot_start_with_one_line(
    tmp_path: Path, fleet: dict[str, str], message: str
) -> None:
    import io

    import yaml

    from edge_agent.run_command import EXIT_FAILED, run_agent

    public = generate_key(tmp_path / "key.pem")
    (tmp_path / "a-file").write_text("not a folder")
    fleet = {key: value.replace("{tmp}", str(tmp_path)) for key, value in fleet.items()}
    document = {
        "agent": {"id": AGENT},
        "cameras": [{"name": "cam", "url": "rtsp://127.0.0.1:9/none"}],
        "detector": {
            "runtime": {"type": "onnxruntime", "model_path": str(EDGE_ONNX)},
            "class_names": CLASS_NAMES,
            "input_size": [320, 320],
        },
        "mqtt": {"outbox_path": str(tmp_path / "outbox.sqlite3")},
        "metrics": {"enabled": False},
        "fleet": {
            "enabled": True,
            "store_url": "https://models.example.net/",
            "trusted_keys": [public],
            "state_dir": str(tmp_path / "fleet"),
            **fleet,
        },
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(document))
    err = io.StringIO()
    assert run_agent(path, err=err, max_runtime_s=5.0) == EXIT_FAILED
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
