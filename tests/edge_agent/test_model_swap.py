"""Swapping the edge model on a reload (`pipeline.model_swap`), on a running agent.

The agent analyses every frame of the `events` scene with the committed INT8 TFLite model; a
reload brings the same network as FP32 ONNX (another runtime and version). Frames go on while it
loads, none is skipped, the status documents and metrics name the new model. A model that does
not load or names other classes is refused and the running one stays; a new model that fails at
first is rolled back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from detection.errors import DetectionError
from edge_agent.config import EdgeAgentConfig
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline import EdgeAgent, FrameOutcome
from edge_agent.pipeline.reload import plan_reload
from edge_agent.run_command import reload_from_file
from testbed.scenes.writer import SceneFolder
from tests.edge_agent.test_run_command import REPO_ROOT, _document
from tests.fixtures.mqtt import MosquittoBroker

EDGE_ONNX = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320.onnx"
COCO_ONNX = REPO_ROOT / "models" / "coco" / "nanodet-coco-fp32.onnx"


def test_plan_allows_a_detector_change_with_camera_changes() -> None:
    base = {
        "agent": {"id": "box"},
        "cameras": [{"name": "a", "url": "rtsp://10.0.0.1/a"}],
        "detector": {"runtime": {"type": "onnxruntime", "model_path": "m.onnx"}},
    }
    old = EdgeAgentConfig.model_validate(base)
    changed = yaml.safe_load(yaml.safe_dump(base))
    changed["detector"]["runtime"]["model_path"] = "m2.onnx"
    plan = plan_reload(old, EdgeAgentConfig.model_validate(changed))
    assert plan.detector and not plan.empty
    assert plan.summary() == "detector swapped; 1 camera(s) untouched"
    assert not plan_reload(old, old).detector


class _Running:
    """An agent running its frame loop in a thread, with every outcome recorded."""

    def __init__(self, agent: EdgeAgent) -> None:
        self.agent = agent
        self.outcomes: list[FrameOutcome] = []
        agent.hooks.append(self.outcomes.append)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop,))

    def wait(self, condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            time.sleep(0.02)


@pytest.fixture
def running(
    events_scene: SceneFolder, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> Iterator[tuple[_Running, dict[str, Any], Path]]:
    document = _document(events_scene, mosquitto_broker.port, tmp_path)
    document["cameras"][0]["file_replay"] = "every_frame"
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    metrics = EdgeMetrics()
    agent = EdgeAgent.from_config(EdgeAgentConfig.model_validate(document), metrics=metrics)
    run = _Running(agent)
    agent.start()
    run.thread.start()
    try:
        yield run, document, path
    finally:
        run.stop.set()
        run.thread.join(10)
        agent.close()


def _reload(run: _Running, document: dict[str, Any], path: Path, **runtime: Any) -> Any:
    new = json.loads(json.dumps(document))
    new["detector"]["runtime"] = runtime
    path.write_text(yaml.safe_dump(new, sort_keys=False))
    return reload_from_file(run.agent, path)


def _sample(run: _Running, name: str, **labels: str) -> float | None:
    telemetry = run.agent.telemetry
    assert telemetry is not None
    value = telemetry.metrics.registry.get_sample_value(f"edge_agent_{name}", labels)
    return value


def test_a_new_model_swaps_in_between_frames_and_is_reported(
    running: tuple[_Running, dict[str, Any], Path],
) -> None:
    run, document, path = running
    agent = run.agent
    camera = agent.workers[0].name
    before = agent.status_documents()[camera]["model"]
    run.wait(lambda: len(run.outcomes) >= 20, "the camera runs")

    outcome = _reload(run, document, path, type="onnxruntime", model_path=str(EDGE_ONNX))
    assert outcome.ok and outcome.plan is not None and outcome.plan.detector, outcome
    swapped_at = len(run.outcomes)
    run.wait(lambda: len(run.outcomes) >= swapped_at + 60, "the new model analyses frames")

    after = agent.status_documents()[camera]["model"]
    assert before == {"name": "edge-yolov5n-320-int8", "version": "1", "runtime": "litert"}
    assert after == {"name": "edge-yolov5n-320", "version": "1", "runtime": "onnxruntime"}
    indices = [o.frame.index for o in run.outcomes]
    assert indices == list(range(len(indices)))  # every frame analysed, none skipped
    assert _sample(run, "model_swaps_total", outcome="applied") == 1.0
    assert _sample(run, "model_info", model="edge-yolov5n-320", version="1", runtime="onnxruntime")
    assert _sample(run, "model_info", model=before["name"], version="1", runtime="litert") is None


def test_a_reload_that_regroups_the_classes_regates_the_trackers(
    running: tuple[_Running, dict[str, Any], Path],
) -> None:
    """`detector.class_groups` changed on a reload: the new detector groups its classes so, and
    the cameras' trackers (and fusion, which reads their keys) gate by the new groups."""
    run, document, path = running
    agent = run.agent
    before = agent.workers[0].tracker.tracker.class_keys
    assert before is not None
    assert before.as_mapping() == {1: -1, 2: -1}  # car, truck (the COCO default)
    new = json.loads(json.dumps(document))
    new["detector"]["class_groups"] = [["car", "truck", "forklift"]]
    path.write_text(yaml.safe_dump(new, sort_keys=False))
    outcome = reload_from_file(agent, path)
    assert outcome.ok and outcome.plan is not None and outcome.plan.detector, outcome
    run.wait(
        lambda: agent.workers[0].tracker.tracker.class_keys is not before,
        "the trackers take the new groups",
    )
    keys = agent.workers[0].tracker.tracker.class_keys
    assert keys is not None and keys.as_mapping() == {1: -1, 2: -1, 3: -1}


def test_a_model_that_does_not_load_or_names_other_classes_is_refused(
    running: tuple[_Running, dict[str, Any], Path],
) -> None:
    run, document, path = running
    agent = run.agent
    model = agent.model
    missing = _reload(run, document, path, type="onnxruntime", model_path="/no/such/model.onnx")
    assert not missing.ok and "did not load" in str(missing.error)

    coco = json.loads(json.dumps(document))
    coco["detector"]["runtime"] = {"type": "onnxruntime", "model_path": str(COCO_ONNX)}
    coco["detector"]["class_names"] = []  # the model's own 80 names
    path.write_text(yaml.safe_dump(coco, sort_keys=False))
    other = reload_from_file(agent, path)
    assert not other.ok and "names classes" in str(other.error)

    assert agent.model == model
    assert _sample(run, "model_swaps_total", outcome="refused") == 2.0
    seen = len(run.outcomes)
    run.wait(lambda: len(run.outcomes) >= seen + 10, "the running model goes on")


def test_a_new_model_failing_during_its_probation_is_rolled_back(
    running: tuple[_Running, dict[str, Any], Path],
) -> None:
    run, document, path = running
    agent = run.agent
    original = agent.model
    run.wait(lambda: len(run.outcomes) >= 10, "the camera runs")
    outcome = _reload(run, document, path, type="onnxruntime", model_path=str(EDGE_ONNX))
    assert outcome.ok, outcome

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise DetectionError("simulated failure of the new model")

    agent.detector.detect = broken  # type: ignore[method-assign]
    run.wait(lambda: agent.model == original, "the agent rolls back")
    seen = len(run.outcomes)
    run.wait(lambda: len(run.outcomes) >= seen + 10, "the previous model analyses again")

    assert agent.config.detector.runtime.type == "litert"
    assert _sample(run, "model_swaps_total", outcome="rolled_back") == 1.0
    assert _sample(run, "model_info", model=original.name, version="1", runtime="litert") == 1.0
