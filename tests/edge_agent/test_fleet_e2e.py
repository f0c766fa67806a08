"""A fleet of real agents updates its model: real RTSP camera, bridged brokers, the store on nginx.

Several `edge-agent run` processes watch the generated `events` scene from a real RTSP server;
they connect to a site Mosquitto bridged to a central one (both from the shipped
`deploy/mosquitto/*.conf`); the model store is a published directory served by nginx over HTTPS
(`testbed.static_store`, with a test CA and a rate limit, so a download takes seconds and can be
cut). The operator side is the real `fleet` command on the central broker: `fleet publish`,
`fleet rollout run` (canary, soak, promote or halt), `fleet rollout start`, `fleet halt`.

The models are the committed ONNX edge model re-published: `edge:2` and `edge:4` are copies
with one metadata entry changed (new bytes, same behaviour); `edge:3` has every class score
multiplied by 0.02 (`onnx` graph edit), so it finds almost nothing: the "refused offline,
forced through" model that the canary must roll back on its own evidence.

Measured here and printed (run with `-s`): the rollout time per agent (rollout issued to the
agent's `swapped` event) and the canary's rollback window (swap to rollback).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from testbed.alert_check import EDGE_INPUT_SIZE, SCENE_CAMERA, scene_agent_config
from testbed.scenes.writer import SceneFolder
from testbed.static_store import StoreServer, make_test_pki, nginx_executable
from tests.edge_agent.test_mqtt_bridge import BRIDGE_RESTART, HOST, ShippedBroker
from tests.fixtures.agent_process import CLASS_NAMES, REPO_ROOT, AgentProcess
from tests.fixtures.mqtt import MqttRecorder
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.rtsp import RtspServerFactory
from tests.fixtures.scenes import scene_video

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

EDGE_ONNX = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx"
PREFIX = "video-analytics"  # the shipped bridge forwards the default prefix
GROUP = "default"
NAME = "edge"
WAIT_S = 180.0  # generous: a loaded 2-core box runs several agents, brokers and nginx
RATE_BYTES_S = 2 * 1024 * 1024  # a 10 MB model takes ~5 s: long enough to cut
WINDOW_S = 12.0  # evidence window: most of the scene's 14.4 s loop


# ---- models -----------------------------------------------------------------------------------


def _variant(out: Path, note: str, score_scale: float | None = None, pad_bytes: int = 0) -> Path:
    """The committed edge model with a metadata entry `note` (new bytes; `pad_bytes` more of
    them, for a slower download); with `score_scale`, every class score of its `(B, 4 + C, N)`
    output multiplied by it."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    model = onnx.load(str(EDGE_ONNX))
    if score_scale is not None:
        graph = model.graph
        output = graph.output[0].name
        raw = f"{output}_unscaled"
        for node in graph.node:
            node.output[:] = [raw if name == output else name for name in node.output]
        classes = len(CLASS_NAMES)
        scale = np.array([1.0] * 4 + [score_scale] * classes, dtype=np.float32)
        graph.initializer.append(numpy_helper.from_array(scale.reshape(1, 4 + classes, 1), "s"))
        graph.node.append(helper.make_node("Mul", [raw, "s"], [output], name="fleet_test_scale"))
    entry = model.metadata_props.add()
    entry.key, entry.value = "fleet_test_note", note + " " * pad_bytes
    onnx.save(model, str(out))
    return out


# ---- the world --------------------------------------------------------------------------------


def _fleet(
    *args: str, check: bool = True, timeout_s: float = WAIT_S
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"fleet {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@dataclass
class Fleet:
    """Brokers, camera, store and the operator's key; agents are started by `agent`."""

    tmp: Path
    site: ShippedBroker
    central: ShippedBroker
    camera_url: str
    store_dir: Path
    store: StoreServer
    ca_path: Path
    key: Path
    public_key: str
    events: MqttRecorder  # everything under the prefix, on central

    def publish(self, model: Path, version: str, *, key: Path | None = None) -> str:
        """`fleet publish` `model` as edge:`version`; its sha256."""
        _fleet(
            "publish",
            "--store",
            str(self.store_dir),
            "--key",
            str(key or self.key),
            "--name",
            NAME,
            "--version",
            version,
            "--input",
            "x".join(map(str, EDGE_INPUT_SIZE)),
            str(model),
        )
        document = json.loads((self.store_dir / "models" / NAME / f"{version}.json").read_text())
        return str(document["manifest"]["sha256"])

    def rollout(
        self,
        command: str,
        version: str,
        *options: str,
        key: Path | None = None,
        trust: str | None = None,
        timeout_s: float = WAIT_S,
    ) -> subprocess.CompletedProcess[str]:
        """`fleet rollout <command>` of edge:`version` on the central broker (not checked)."""
        args = ["rollout", command, "--store", str(self.store_dir), "--key", str(key or self.key)]
        args += ["--broker", f"{HOST}:{self.central.port}", "--prefix", PREFIX, "--group", GROUP]
        args += ["--model", f"{NAME}:{version}", *options]
        if trust is not None:
            args += ["--trust", trust]
        return _fleet(*args, check=False, timeout_s=timeout_s)

    def start(self, version: str, *options: str, **how: Any) -> None:
        """`fleet rollout start`, which must succeed."""
        done = self.rollout("start", version, *options, **how)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"

    def agent(self, agent_id: str, metrics_port: int | None = None) -> Agent:
        home = self.tmp / agent_id
        home.mkdir(exist_ok=True)
        document = scene_agent_config(
            self.tmp / "scene",
            camera_url=self.camera_url,
            model_path=EDGE_ONNX,
            class_names=CLASS_NAMES,
            mqtt_port=self.site.port,
            outbox_path=home / "outbox.sqlite3",
            agent_id=agent_id,
            target_fps=4.0,
        )
        document["mqtt"].update(status_interval_s=2.0, keepalive_s=10)
        if metrics_port is not None:
            document["metrics"] = {
                "enabled": True,
                "listen_host": HOST,
                "listen_port": metrics_port,
            }
        document["fleet"] = {
            "enabled": True,
            "store_url": self.store.url,
            "ca_path": str(self.ca_path),
            "trusted_keys": [self.public_key],
            "state_dir": str(home / "fleet"),
            "status_interval_s": 2.0,
            "retry_interval_s": 2.0,
            "download_timeout_s": 10.0,
            "evidence": {
                "window_s": WINDOW_S,
                "min_frames": 20,
                "max_detection_drop": 0.6,
                "max_fps_drop": 0.9,  # a loaded box changes frame rates; detections decide here
            },
        }
        config = home / "agent.yaml"
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        return Agent(agent_id, home, config, self)


class Agent:
    """One `edge-agent run` process of the fleet, restartable on the same config and state."""

    def __init__(self, agent_id: str, home: Path, config: Path, fleet: Fleet) -> None:
        self.id = agent_id
        self.home = home
        self.config = config
        self.fleet = fleet
        self.runs = 0
        self.process: AgentProcess | None = None
        self.start()

    def start(self) -> None:
        self.runs += 1
        self.process = AgentProcess(self.config, self.home / f"agent-{self.runs}.log")

    @property
    def proc(self) -> AgentProcess:
        assert self.process is not None
        return self.process

    def kill(self) -> None:
        """SIGKILL: a power cut."""
        self.proc.process.send_signal(signal.SIGKILL)
        self.proc.process.wait(30)
        self.proc.stop()  # closes the log file

    def log(self) -> str:
        return "\n".join(
            (self.home / f"agent-{run}.log").read_text(errors="replace")
            for run in range(1, self.runs + 1)
        )

    def tail(self) -> str:
        return f"--- {self.id} ---\n{self.proc.tail(40)}"

    def status(self) -> dict[str, Any] | None:
        """Its latest retained fleet status as central has it."""
        found = self.fleet.events.on(f"{PREFIX}/fleet/status/{self.id}")
        return json.loads(found[-1].payload) if found else None

    def events(self) -> list[dict[str, Any]]:
        return [
            json.loads(m.payload) for m in self.fleet.events.on(f"{PREFIX}/fleet/events/{self.id}")
        ]

    def running(self) -> str | None:
        status = self.status()
        model = status.get("model") if status else None
        return model["sha256"] if model else None

    def wait(self, what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.proc.process.poll() is None, f"{self.id} exited\n{self.tail()}"
            assert time.monotonic() < deadline, f"timed out until {what}\n{self.tail()}"
            time.sleep(0.2)

    def wait_event(self, event: str, sha: str, after: int = 0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for e in self.events()[after:]:
                if e["event"] == event and (e.get("model") or {}).get("sha256") == sha:
                    return e
            return None

        self.wait(f"{self.id} publishes {event} of {sha[:12]}", lambda: found() is not None)
        result = found()
        assert result is not None
        return result

    def camera_model(self) -> dict[str, Any] | None:
        """The `model` of its camera's status document (what its detector runs)."""
        found = self.fleet.events.on(f"{PREFIX}/{self.id}/status/{SCENE_CAMERA}")
        return json.loads(found[-1].payload).get("model") if found else None

    def stop(self) -> None:
        if self.process is not None and self.process.process.poll() is None:
            self.proc.stop()


@pytest.fixture
def fleet(
    tmp_path: Path, events_scene: SceneFolder, rtsp_server_factory: RtspServerFactory
) -> Iterator[Fleet]:
    pytest.importorskip("onnx")
    if nginx_executable() is None:
        pytest.skip("nginx not installed (scripts/install-system-deps)")
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").is_file():
        pytest.skip("mosquitto not installed (scripts/install-system-deps)")
    shutil.copytree(events_scene.root, tmp_path / "scene")
    camera = rtsp_server_factory(clip=scene_video(events_scene))
    central = ShippedBroker("central", tmp_path)
    site = ShippedBroker(
        "site", tmp_path, {"address": f"{HOST}:{central.port}", "restart_timeout": BRIDGE_RESTART}
    )
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    pki = make_test_pki(tmp_path / "pki")
    (tmp_path / "nginx").mkdir()
    store = StoreServer(store_dir, tmp_path / "nginx", pki, limit_rate_bytes_s=RATE_BYTES_S)
    key = tmp_path / "operator.pem"
    public_key = _keygen(key)
    started: list[Any] = []
    recorder: MqttRecorder | None = None
    try:
        for part in (central, site, store):
            part.start()
            started.append(part)
        recorder = MqttRecorder(central, f"{PREFIX}/#")  # type: ignore[arg-type]
        yield Fleet(
            tmp_path,
            site,
            central,
            camera.url,
            store_dir,
            store,
            pki.ca_cert,
            key,
            public_key,
            recorder,
        )
    finally:
        if recorder is not None:
            recorder.close()
        for part in reversed(started):
            part.stop()


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    """Agents started by the test; stopped (SIGTERM, exit 0) at the end."""
    started: list[Agent] = []
    yield started
    codes = {}
    for agent in started:
        agent.stop()
        codes[agent.id] = agent.proc.process.returncode
    assert all(code == 0 for code in codes.values()), codes


def _keygen(path: Path) -> str:
    """`fleet keygen` a key at `path`; its public key."""
    found = re.search(r"public key:\s*(\S+)", _fleet("keygen", str(path)).stdout)
    assert found is not None
    return found.group(1)


def _reports(agent: Agent) -> Callable[[], bool]:
    return lambda: agent.running() is not None


def _runs(agent: Agent, sha: str) -> Callable[[], bool]:
    return lambda: agent.running() == sha


def _camera_runs(agent: Agent, sha: str) -> Callable[[], bool]:
    return lambda: (agent.camera_model() or {}).get("sha256") == sha


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _rollouts(recorder: MqttRecorder) -> list[dict[str, Any]]:
    found = recorder.payloads(f"{PREFIX}/fleet/rollouts/")
    return [json.loads(m.payload)["rollout"] for m in found if m.payload]


def _issued(recorder: MqttRecorder, sha: str, stage: str) -> float:
    for rollout in _rollouts(recorder):
        if rollout["model"]["sha256"] == sha and rollout["stage"] == stage:
            return _at(rollout["issued_at"])
    raise AssertionError(f"no {stage} rollout of {sha[:12]} seen on central")


def _error_lines(agent: Agent, needle: str) -> list[str]:
    return [line for line in agent.log().splitlines() if "ERROR" in line and needle in line]


def _swapped_to(agent: Agent, sha: str) -> list[dict[str, Any]]:
    return [e for e in agent.events() if e["event"] == "swapped" and e["model"]["sha256"] == sha]


# ---- the tests --------------------------------------------------------------------------------


def test_canary_then_all_then_a_worse_model_rolled_back_by_the_canary_and_halted(
    fleet: Fleet, agents: list[Agent], capsys: pytest.CaptureFixture[str]
) -> None:
    good = fleet.publish(_variant(fleet.tmp / "edge-2.onnx", "republished as 2"), "2")
    worse = fleet.publish(_variant(fleet.tmp / "edge-3.onnx", "scores x0.02", 0.02), "3")
    canary_port = free_tcp_port(HOST)
    agents += [fleet.agent("box-a", canary_port), fleet.agent("box-b"), fleet.agent("box-c")]
    for agent in agents:  # every box reports its own model through the bridge
        agent.wait(f"{agent.id} reports a model", _reports(agent))
    own = agents[0].running()
    assert own not in (good, worse)

    # 1. canary on box-a, soak, promote to all, every box on it
    timeouts = ("--canary-timeout-s", str(WAIT_S), "--wait-all-s", str(WAIT_S))
    run = fleet.rollout("run", "2", "--canary", "box-a", "--soak", "3", *timeouts, timeout_s=600)
    tails = "\n".join(a.tail() for a in agents)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{tails}"
    for agent in agents:
        agent.wait(f"{agent.id} runs edge:2", _runs(agent, good))
        swapped = agent.wait_event("swapped", good)
        agent.wait_event("promoted", good)
        status = agent.status()
        assert status is not None and status["cameras"] == {SCENE_CAMERA: f"{NAME}:2"}
        agent.wait(f"{agent.id}'s camera on edge:2", _camera_runs(agent, good))
        stage = "canary" if agent.id == "box-a" else "all"
        print(
            f"rollout edge:2 to {agent.id} ({stage}): "
            f"{_at(swapped['at']) - _issued(fleet.events, good, stage):.1f} s from the rollout "
            f"to the swap ({swapped['evidence'].get('seconds')} s download + verify + warm + swap)"
        )

    # 2. the worse model: the canary rolls it back on its own evidence; the rollout halts
    before = {agent.id: len(agent.events()) for agent in agents}
    soak = ("--soak", str(4 * WINDOW_S), "--canary-timeout-s", str(WAIT_S))
    run = fleet.rollout("run", "3", "--canary", "box-a", *soak, timeout_s=600)
    assert run.returncode != 0, f"the controller promoted a worse model:\n{run.stdout}"
    canary = agents[0]
    swapped = canary.wait_event("swapped", worse, before["box-a"])
    rolled = canary.wait_event("rolled_back", worse, before["box-a"])
    assert "detections per frame fell" in rolled["reason"], rolled
    canary.wait("box-a back on edge:2", _runs(canary, good))
    canary.wait("box-a's camera on edge:2", _camera_runs(canary, good))
    status = canary.status()
    assert status is not None and worse in status["rejected"]
    window = _at(rolled["at"]) - _at(swapped["at"])
    print(
        f"canary rollback of edge:3 on box-a: {window:.1f} s from swap to rollback "
        f"(evidence window {WINDOW_S:g} s; live {rolled['evidence']['live']}, "
        f"baseline {rolled['evidence']['baseline']})"
    )
    halted = [r for r in _rollouts(fleet.events) if r["stage"] == "halted"]
    assert halted and halted[-1]["model"]["sha256"] == worse
    time.sleep(3.0)  # the halted rollout reaches every box; none takes the worse model
    for agent in agents[1:]:
        assert not _swapped_to(agent, worse), agent.events()
        assert agent.running() == good
    metrics = _scrape(canary_port)
    assert 'edge_agent_fleet_rollbacks_total{reason="evidence"} 1.0' in metrics
    assert f'sha="{good}"' in metrics
    with capsys.disabled():
        print(capsys.readouterr().out)


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as answer:  # noqa: S310
        return str(answer.read().decode())


def test_power_cuts_tampering_and_wrong_signatures_leave_a_good_model_running(
    fleet: Fleet, agents: list[Agent]
) -> None:
    good = fleet.publish(_variant(fleet.tmp / "edge-2.onnx", "republished as 2"), "2")
    box = fleet.agent("box-k")
    agents.append(box)
    box.wait("box-k reports a model", lambda: box.running() is not None)
    fleet.start("2")
    box.wait_event("promoted", good)

    # 1. power cut mid-download: the part file is there, the box comes back on edge:2, resumes
    new = fleet.publish(_variant(fleet.tmp / "edge-4.onnx", "republished as 4"), "4")
    part = box.home / "fleet" / "models" / f"{new}.part"
    fleet.start("4", "--canary", "box-k")
    box.wait("a part of edge:4 is on disk", lambda: part.is_file() and part.stat().st_size > 0)
    box.kill()
    cut_at = part.stat().st_size
    assert 0 < cut_at < EDGE_ONNX.stat().st_size
    seen = len(fleet.events.messages)
    box.start()
    box.wait(
        "box-k reports edge:2 after the cut",
        lambda: any(
            m.topic == f"{PREFIX}/fleet/status/box-k" and json.loads(m.payload)["model"]
            for m in fleet.events.messages[seen:]
        ),
    )
    first = next(
        json.loads(m.payload)
        for m in fleet.events.messages[seen:]
        if m.topic == f"{PREFIX}/fleet/status/box-k"
    )
    assert first["model"]["sha256"] == good, first
    assert "booting on edge:2" in box.log()

    # 2. power cut mid-swap (on trial): the box boots on the model before it
    box.wait("box-k tries edge:4", lambda: (box.status() or {}).get("state") == "evaluating")
    assert re.search(rf'"bytes={cut_at}-"', "\n".join(fleet.store.access_log())), (
        "the download did not resume where it was cut"
    )
    box.kill()
    seen = len(fleet.events.messages)
    box.start()
    box.wait(
        "box-k reports again",
        lambda: any(
            m.topic == f"{PREFIX}/fleet/status/box-k" for m in fleet.events.messages[seen:]
        ),
    )
    first = next(
        json.loads(m.payload)
        for m in fleet.events.messages[seen:]
        if m.topic == f"{PREFIX}/fleet/status/box-k"
    )
    assert first["model"]["sha256"] == good, first
    assert "was cut short" in box.log()
    box.wait_event("promoted", new)  # tried once more (max_boot_attempts 2) and kept

    # 3. a config reload (SIGHUP) keeps the fleet's model, not the config file's
    box.proc.process.send_signal(signal.SIGHUP)
    done = re.compile(r"edge_agent\.run_command: (reloaded|reload refused)")
    box.wait("the reload is done", lambda: done.search(box.log()) is not None)
    assert "run_command: reloaded: no change" in box.log(), box.tail()
    assert box.running() == new

    # 4. the operator halts edge:4's rollout: the canary goes back to the model before it
    _fleet("halt", "--key", str(fleet.key), "--group", GROUP, "--prefix", PREFIX,
           "--broker", f"{HOST}:{fleet.central.port}")  # fmt: skip
    box.wait_event("reverted", new)
    box.wait("box-k back on edge:2", _runs(box, good))

    # 4b. a rollout halted while the canary downloads its model: downloaded, never swapped in
    slow = _variant(fleet.tmp / "edge-7.onnx", "halted mid-download", pad_bytes=20_000_000)
    late = fleet.publish(slow, "7")  # ~15 s to download: the halt comes first
    fleet.start("7", "--canary", "box-k")
    part = box.home / "fleet" / "models" / f"{late}.part"
    box.wait("a part of edge:7 is on disk", lambda: part.is_file())
    _fleet("halt", "--key", str(fleet.key), "--group", GROUP, "--prefix", PREFIX,
           "--broker", f"{HOST}:{fleet.central.port}")  # fmt: skip
    box.wait("edge:7 is dropped", lambda: "is no longer wanted here" in box.log())
    assert not _swapped_to(box, late) and box.running() == good

    # 5. a tampered artifact: refused with one clear line, nothing loaded
    tampered = fleet.publish(_variant(fleet.tmp / "edge-5.onnx", "to be tampered"), "5")
    blob = fleet.store_dir / "blobs" / "sha256" / tampered
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    swaps = len([e for e in box.events() if e["event"] == "swapped"])
    fleet.start("5", "--canary", "box-k")
    box.wait_event("refused", tampered)
    lines = _error_lines(box, "hash mismatch")
    assert len(lines) == 1, lines
    assert "nothing loaded" in lines[0]

    # 6. a rollout signed by a key the box does not trust: refused, one line
    stranger = fleet.tmp / "stranger.pem"
    stranger_public = _keygen(stranger)
    fleet.start("2", "--canary", "box-k", key=stranger, trust=fleet.public_key)
    box.wait("the stranger's rollout is refused", lambda: bool(_error_lines(box, "rollout on")))
    assert len(_error_lines(box, "rollout on")) == 1

    # 7. a manifest signed by that key, in a rollout signed by the trusted one: refused
    unsigned = fleet.publish(
        _variant(fleet.tmp / "edge-6.onnx", "signed by a stranger"), "6", key=stranger
    )
    fleet.start("6", "--canary", "box-k", trust=stranger_public)
    box.wait_event("refused", unsigned)
    assert len(_error_lines(box, f"manifest of {NAME}:6")) == 1

    # 0 loaded in every fault: no swap since, edge:2 runs, on the camera too
    assert len([e for e in box.events() if e["event"] == "swapped"]) == swaps
    assert box.running() == good
    box.wait("box-k's camera on edge:2", _camera_runs(box, good))
