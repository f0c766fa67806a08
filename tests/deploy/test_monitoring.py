"""The shipped monitoring (`deploy/monitoring/`): Prometheus config and rules, Grafana dashboards.

`promtool` checks the example config and the rules and runs the rules' unit tests; every alert
must be complete and unit-tested firing and not firing; the dashboards must be well formed. The
real test starts a real Prometheus scraping a real edge agent that escalates to a real cloud
service, loads the shipped rules, and asks it every dashboard query: each must return data, and
every recording rule must produce series.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.processes import ManagedProcess
from testbed.scenes.writer import SceneFolder
from tests.fixtures.agent_process import (
    REPO_ROOT,
    AgentProcess,
    committed_cloud_document,
    scene_agent_document,
    write_agent_config,
)
from tests.fixtures.cloud_process import CloudProcess
from tests.fixtures.mqtt import MosquittoBroker
from tests.fixtures.processes import free_tcp_port
from tests.fixtures.scenes import scene_video

MONITORING = REPO_ROOT / "deploy" / "monitoring"
PROMETHEUS_DIR = MONITORING / "prometheus"
EXAMPLE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.test.yml"))
DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))
PROVISIONING = MONITORING / "grafana" / "provisioning"

JOBS = {"edge-agent", "cloud-service"}  # the job names the rules and dashboards select on
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SEVERITIES = {"critical", "warning"}
AGENT = "monitored-agent"
CAMERA = "scene"  # the camera of `scene_agent_document`
RATE_INTERVAL = "15s"  # `$__rate_interval` at a 1 s scrape interval, with margin
DATA_TIMEOUT_S = 45.0
PROMETHEUS_READY_TIMEOUT_S = 30.0


# ---- promtool ------------------------------------------------------------------------------


def _promtool(*args: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian/Ubuntu: apt-get install prometheus)")
    result = subprocess.run(
        [promtool, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


@pytest.mark.process
def test_example_scrape_config_passes_promtool() -> None:
    _promtool("check", "config", str(EXAMPLE_CONFIG))
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == JOBS
    for job in config["scrape_configs"]:
        if job["job_name"] == "edge-agent":
            assert all("agent" in group["labels"] for group in job["static_configs"])


@pytest.mark.process
def test_rules_pass_promtool_check() -> None:
    assert RULE_FILES, "no rule files"
    _promtool("check", "rules", *map(str, RULE_FILES))


@pytest.mark.process
def test_rule_unit_tests_pass() -> None:
    assert RULE_TESTS, "no rule unit tests"
    _promtool("test", "rules", *map(str, RULE_TESTS))


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def _alert_tests() -> list[dict[str, Any]]:
    return [
        case
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_every_alert_is_complete_and_unit_tested_firing_and_not_firing() -> None:
    alerts = [rule for rule in _rules() if "alert" in rule]
    assert len(alerts) >= 10
    cases = _alert_tests()
    for alert in alerts:
        name = alert["alert"]
        assert alert.get("for"), f"{name}: no `for:`"
        assert alert.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = alert.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        own = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in own), f"{name}: no unit test where it fires"
        assert any(not case["exp_alerts"] for case in own), f"{name}: none where it does not"


# ---- dashboards ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    """One query of a dashboard panel, as Grafana sends it (variables not yet substituted)."""

    dashboard: str
    panel: str
    expr: str


def _dashboard(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # inside collapsed rows


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in dashboard["templating"]["list"]}


def _queries(path: Path) -> list[PanelQuery]:
    dashboard = _dashboard(path)
    return [
        PanelQuery(path.stem, panel["title"], target["expr"])
        for panel in _panels(dashboard)
        for target in panel.get("targets", [])
    ]


_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.stem)
def test_dashboard_is_well_formed(path: Path) -> None:
    dashboard = _dashboard(path)
    assert 36 <= dashboard["schemaVersion"] <= 41 and dashboard["uid"], path.name
    variables = _variables(dashboard)
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    panels = [panel for panel in _panels(dashboard) if panel["type"] != "row"]
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    for panel in panels:
        title = panel["title"]
        assert panel["datasource"] == DATASOURCE, title
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, title
        targets = panel["targets"]
        assert targets, f"{title}: no target"
        assert len({target["refId"] for target in targets}) == len(targets), title
        for target in targets:
            assert target["datasource"] == DATASOURCE, title
            assert target["expr"].strip(), f"{title}: empty expr"
            used = {a or b for a, b in _VARIABLE.findall(target["expr"])} - {"__rate_interval"}
            assert used <= set(variables), f"{title}: undefined variables {used - set(variables)}"


def test_dashboards_are_provisioned_with_the_default_prometheus() -> None:
    uids = [_dashboard(path)["uid"] for path in DASHBOARDS]
    assert sorted(path.stem for path in DASHBOARDS) == ["cloud", "fleet", "site"]
    assert len(set(uids)) == len(uids)
    datasources = [
        source
        for path in (PROVISIONING / "datasources").glob("*.yml")
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    assert [(s["type"], s["isDefault"]) for s in datasources] == [("prometheus", True)]
    providers = [
        provider
        for path in (PROVISIONING / "dashboards").glob("*.yml")
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    assert [(p["type"], bool(p["options"]["path"])) for p in providers] == [("file", True)]


# ---- a real Prometheus over a real agent and cloud service ----------------------------------


def _substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` as Grafana would send it with these variable values."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)

    def value(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return _VARIABLE.sub(value, expr)


class PrometheusApi:
    """The HTTP API of the Prometheus under test."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the parser's message
            raise AssertionError(f"{path} {params}: {exc.read().decode()}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=1) as response:  # noqa: S310
                return bool(response.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` returns now (a scalar counts as one sample)."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] == "vector":
            result: list[dict[str, Any]] = data["result"]
            return result
        return [{"metric": {}, "value": data["result"]}]

    def label_values(self, label_query: str) -> list[str]:
        """The values of Grafana's `label_values(selector, label)`."""
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", label_query.strip())
        assert match is not None, label_query
        selector, label = match.groups()
        values: list[str] = self.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
        return values

    def rule_problems(self) -> list[str]:
        """Rules not (yet) evaluated without error."""
        groups = self.get("/api/v1/rules")["groups"]
        return [
            f"{rule['name']}: {rule['health']} {rule.get('lastError', '')}"
            for group in groups
            for rule in group["rules"]
            if rule["health"] != "ok"
        ]


def _values(api: PrometheusApi, expr: str) -> list[float]:
    return [float(sample["value"][1]) for sample in api.query(expr)]


def _returns_data(api: PrometheusApi, expr: str) -> Callable[[], bool]:
    return lambda: bool(api.query(expr))


def _returns(api: PrometheusApi, expr: str, value: float) -> Callable[[], bool]:
    return lambda: _values(api, expr) == [value]


def _positive(api: PrometheusApi, expr: str) -> Callable[[], bool]:
    return lambda: any(not math.isnan(v) and v > 0 for v in _values(api, expr))


def _offers(api: PrometheusApi, label_query: str, value: str | None) -> Callable[[], bool]:
    """A template variable query that lists `value` (any value when None)."""

    def check() -> bool:
        values = api.label_values(label_query)
        return bool(values) and (value is None or value in values)

    return check


def _checks(api: PrometheusApi) -> dict[str, Callable[[], bool]]:
    """Everything that must hold once the fleet has been scraped for a while, by name."""
    checks: dict[str, Callable[[], bool]] = {}
    values = {"agent": AGENT}  # the one-agent variable; the others select all (".*")
    expected = {"agent": AGENT, "camera": CAMERA}
    for path in DASHBOARDS:
        for name, var in _variables(_dashboard(path)).items():
            if var["type"] == "query":
                values.setdefault(name, ".*")
                query = _substitute(var["definition"], values)
                checks[f"{path.stem} variable {name}: {query}"] = _offers(
                    api, query, expected.get(name)
                )
        for item in _queries(path):
            expr = _substitute(item.expr, values)
            checks[f"{item.dashboard} / {item.panel}: {expr}"] = _returns_data(api, expr)
    for rule in _rules():
        if "record" in rule:
            checks[f"recording rule {rule['record']}"] = _returns_data(api, rule["record"])
    for expr, value in {
        "sum(up)": 2,  # both targets scraped
        "agent:edge_agent_cameras_streaming:sum": 1,
        "edge_agent_camera_target_fps": 10,
        "edge_agent_cloud_connected + edge_agent_escalation_enabled": 2,  # escalating, connected
    }.items():
        checks[f"{expr} == {value}"] = _returns(api, expr, value)
    for expr in (
        "camera:edge_agent_frames_analysed:rate1m",
        'agent_outcome:edge_agent_escalations:rate1m{outcome="answered"}',
        "instance:cloud_service_frames:rate1m",
        "job:cloud_service_queue_time_seconds:p95_5m",
    ):
        checks[f"{expr} > 0"] = _positive(api, expr)
    checks["every rule evaluates without error"] = lambda: not api.rule_problems()
    return checks


def _wait_for(checks: dict[str, Callable[[], bool]], timeout_s: float) -> list[str]:
    """Run the checks until all have held once or `timeout_s` passes; the names still failing."""
    pending = dict(checks)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = {name: check for name, check in pending.items() if not check()}
        if pending:
            time.sleep(1.0)
    return sorted(pending)


def _prometheus_config(edge_port: int, cloud_port: int) -> dict[str, Any]:
    """The example's jobs and labels, scraping the local processes every second."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [
            {
                "job_name": "edge-agent",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{edge_port}"], "labels": {"agent": AGENT}}
                ],
            },
            {
                "job_name": "cloud-service",
                "static_configs": [{"targets": [f"127.0.0.1:{cloud_port}"]}],
            },
        ],
    }


@pytest.mark.timeout(180)
def test_every_dashboard_query_and_recording_rule_has_data_from_a_running_fleet(
    events_scene: SceneFolder, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        pytest.skip("prometheus not found (Debian/Ubuntu: apt-get install prometheus)")
    edge_metrics_port, cloud_metrics_port = free_tcp_port(), free_tcp_port()
    cloud = CloudProcess(committed_cloud_document(free_tcp_port(), cloud_metrics_port), tmp_path)
    document = scene_agent_document(
        tmp_path,
        events_scene,
        camera_url=str(scene_video(events_scene)),  # the agent replays the file in real time
        broker=mosquitto_broker,
        agent_id=AGENT,
        status_interval_s=5.0,
    )
    document["cameras"][0].update(loop_file=True, target_fps=10)
    document["metrics"] = {
        "enabled": True,
        "listen_host": "127.0.0.1",
        "listen_port": edge_metrics_port,
    }
    document["escalation"] = {
        "enabled": True,
        "cloud_address": cloud.address,
        "per_camera_frames_per_s": 2.0,
        "per_agent_frames_per_s": 2.0,
        "deadline_ms": 3000,  # the CPU cloud model on a shared 2-core machine
        "connection": {"reconnect_min_backoff_ms": 200, "reconnect_max_backoff_ms": 500},
    }
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(_prometheus_config(edge_metrics_port, cloud_metrics_port)))
    api = PrometheusApi(free_tcp_port())
    prometheus = ManagedProcess(
        "prometheus",
        [
            prometheus_binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={api.base.removeprefix('http://')}",
        ],
        ready_check=api.ready,
    )
    # all three start at once: each scrapes, connects or is scraped when the others are up
    agent = AgentProcess(write_agent_config(tmp_path, document), tmp_path / "agent.log")
    try:
        prometheus.start(ready_timeout_s=PROMETHEUS_READY_TIMEOUT_S)
        cloud.start()
        failing = _wait_for(_checks(api), DATA_TIMEOUT_S)
    finally:
        prometheus.stop()
        agent.stop()
        cloud.stop()
    assert not failing, (
        "no data (or not as expected) for:\n"
        + "\n".join(failing)
        + f"\n--- agent log:\n{agent.tail(20)}\n--- prometheus:\n{prometheus.output_tail(20)}"
    )
