"""A site Mosquitto bridged to a central one, both from the shipped `deploy/mosquitto/` configs.

Only ports, paths and the bridge's reconnect delay are substituted (`render_config`). The agent
side is the real `AlertPublisher` with its SQLite outbox on the site broker; the consumers are
the real `edge-agent alerts` loop (`run_alerts`) on the central broker, printing JSON lines.

Crashes (SIGKILL) happen at a quiet moment, once everything published so far has reached the
consumers: a broker that dies holding messages it acknowledged but has not yet passed on or
saved loses them (Mosquitto saves every `autosave_interval`, not per message), which the
deploy README states and no configuration here can test away.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from edge_agent.alerts import AlertPublisher, EventIds
from edge_agent.alerts.consumer import AlertConsumerConfig
from edge_agent.alerts.subscriber import alert_topic_filters, run_alerts
from edge_agent.config.mqtt import MqttConfig
from fleet.rollout import rollouts_filter, status_filter
from tests.fixtures.events import T0, door_event
from tests.fixtures.mqtt import MqttRecorder
from tests.fixtures.processes import ManagedProcess, free_tcp_port, tcp_port_accepts

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy" / "mosquitto"
HOST = "127.0.0.1"
AGENT = "edge-01"
PREFIX = MqttConfig().topic_prefix  # the shipped bridge forwards the default prefix
WAIT_S = 15.0
# Mosquitto 2.0.11 keeps its default back-off (5 s base) for a single `restart_timeout` value;
# base and cap both short make the bridge come back within about 2 s.
BRIDGE_RESTART = "1 2"


def render_config(text: str, settings: Mapping[str, str], head: Sequence[str] = ()) -> str:
    """`text` with the one active line of each `settings` key replaced by `key value`, `head`
    lines first. A key that is missing (or active twice) fails: the shipped file has changed."""
    for key, value in settings.items():
        text, count = re.subn(
            rf"^{re.escape(key)}(?:[ \t].*)?$", f"{key} {value}", text, flags=re.M
        )
        assert count == 1, f"expected one active `{key}` line in the shipped config, found {count}"
    return "\n".join([*head, text])


def _bridge_setting(key: str) -> str:
    match = re.search(rf"^{key}[ \t]+(\S+)", (DEPLOY / "site.conf").read_text(), flags=re.M)
    assert match is not None, key
    return match.group(1)


BRIDGE_CLIENT_ID = _bridge_setting("remote_clientid")
BRIDGE_STATE_TOPIC = f"$SYS/broker/connection/{BRIDGE_CLIENT_ID}/state"


class ShippedBroker:
    """Mosquitto running a shipped config on a free loopback port, its data in `data_dir`."""

    def __init__(
        self, name: str, work_dir: Path, settings: Mapping[str, str] | None = None
    ) -> None:
        self.host = HOST
        self.port = free_tcp_port(HOST)
        self.data_dir = work_dir / name
        self.data_dir.mkdir()
        head = []
        if os.geteuid() == 0:  # as root Mosquitto would switch to a user without access here
            head.append(f"user {pwd.getpwuid(os.geteuid()).pw_name}")
        text = render_config(
            (DEPLOY / f"{name}.conf").read_text(),
            {
                "listener": f"{self.port} {HOST}",
                "persistence_location": f"{self.data_dir}/",
                **(settings or {}),
            },
            head,
        )
        config = work_dir / f"{name}.conf"
        config.write_text(text)
        mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        # stdbuf: line-buffered log, so a killed broker's last lines reach the failure message
        argv = ["stdbuf", "-oL", mosquitto] if shutil.which("stdbuf") else [mosquitto]
        self.process = ManagedProcess(
            f"mosquitto-{name}:{self.port}",
            [*argv, "-c", str(config)],
            ready_check=lambda: tcp_port_accepts(HOST, self.port),
        )

    def start(self) -> None:
        self.process.start(ready_timeout_s=WAIT_S)

    def stop(self) -> None:
        """SIGTERM: Mosquitto saves its database on the way out."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL: a crash; what was not saved is gone."""
        self.process.kill()

    def save(self) -> None:
        """Have Mosquitto write its database now (SIGUSR1), as its autosave does."""
        database = self.data_dir / "mosquitto.db"

        def stamp() -> tuple[int, int] | None:
            try:
                stat = database.stat()
            except FileNotFoundError:
                return None
            return stat.st_ino, stat.st_mtime_ns

        before = stamp()
        assert self.process.pid is not None
        os.kill(self.process.pid, signal.SIGUSR1)
        _wait(lambda: stamp() not in (None, before), f"{self.process.name} saved its database")

    def log_tail(self) -> str:
        return self.process.output_tail(30)


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


class Lines(io.TextIOBase):
    """A text sink that `run_alerts` writes to from its thread while the test reads it."""

    def __init__(self) -> None:
        super().__init__()
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._lines += text.splitlines()
        return len(text)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


class Consumer:
    """`edge-agent alerts --all-agents --format json` on the central broker, in a thread."""

    def __init__(self, broker: ShippedBroker, tmp_path: Path, **options: Any) -> None:
        self.out, self.err = Lines(), Lines()
        self.ready, self.stop = threading.Event(), threading.Event()
        self.exit_code: int | None = None
        config = MqttConfig(
            host=broker.host, port=broker.port, keepalive_s=5, outbox_path=tmp_path / "unused"
        )

        def run() -> None:
            self.exit_code = run_alerts(
                config,
                self.out,
                err=self.err,
                ready=self.ready,
                stop=self.stop,
                fmt="json",
                **options,
            )

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.ready.wait(WAIT_S), f"consumer not subscribed: {self.err.lines()}"

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.lines()]

    def event_ids(self) -> list[str]:
        return [o["event_id"] for o in self.objects() if o.get("schema") == "edge-alert/v1"]

    def wait_for_events(self, expected: Sequence[str]) -> None:
        _wait(
            lambda: set(expected) <= set(self.event_ids()),
            f"events {sorted(set(expected) - set(self.event_ids()))} arrive "
            f"(stderr {self.err.lines()})",
        )

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "consumer did not stop"
        assert self.exit_code == 0, self.err.lines()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[ShippedBroker, ShippedBroker]]:
    """(site, central), started from the shipped configs; the site bridges to central."""
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").is_file():
        pytest.skip("mosquitto binary not found (apt-get install mosquitto)")
    central = ShippedBroker("central", tmp_path)
    site = ShippedBroker(
        "site",
        tmp_path,
        {"address": f"{HOST}:{central.port}", "restart_timeout": BRIDGE_RESTART},
    )
    started: list[ShippedBroker] = []
    try:
        for broker in (central, site):
            broker.start()
            started.append(broker)
        yield site, central
    finally:
        for broker in started:
            broker.stop()


@pytest.fixture
def consumers(tmp_path: Path) -> Iterator[Callable[..., Consumer]]:
    """`start(broker, **run_alerts options) -> Consumer`; all are stopped after the test."""
    started: list[Consumer] = []

    def start(broker: ShippedBroker, **options: Any) -> Consumer:
        consumer = Consumer(broker, tmp_path, **options)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.close()


@pytest.fixture
def publisher(
    brokers: tuple[ShippedBroker, ShippedBroker], tmp_path: Path
) -> Iterator[AlertPublisher]:
    """The agent's publisher on the site broker, its outbox in `tmp_path`."""
    site, _ = brokers
    config = MqttConfig(
        host=site.host, port=site.port, keepalive_s=5, outbox_path=tmp_path / "outbox.sqlite3"
    )
    with AlertPublisher(config, AGENT, reconnect_min_s=1, reconnect_max_s=1) as started:
        assert started.wait_connected(WAIT_S)
        yield started


@pytest.fixture
def bridge_state(brokers: tuple[ShippedBroker, ShippedBroker]) -> Iterator[MqttRecorder]:
    """The bridge's own `1`/`0` notification as the site broker sees it."""
    site, _ = brokers
    recorder = MqttRecorder(site, BRIDGE_STATE_TOPIC)  # type: ignore[arg-type]
    yield recorder
    recorder.close()


def _wait_bridge(state: MqttRecorder, up: bool) -> None:
    wanted = b"1" if up else b"0"
    state.wait_for(lambda seen: bool(seen) and seen[-1].payload == wanted, WAIT_S)


def _publish(publisher: AlertPublisher, first: int, count: int) -> list[str]:
    """`count` zone-enter events of tracks `first`...; their event ids, in order."""
    ids = EventIds(AGENT)  # the agent's ids: instantaneous events depend on nothing earlier
    sent = []
    for track in range(first, first + count):
        event = door_event(track_id=track, timestamp_s=T0 + track)
        publisher.publish_event(event)
        sent.append(ids.id_for(event))
    return sent


def test_the_bridge_forwards_every_alert_topic_at_qos_1() -> None:
    text = (DEPLOY / "site.conf").read_text()
    topics = re.findall(r"^topic[ \t]+(.+)$", text, flags=re.M)
    expected = alert_topic_filters(PREFIX, include_status=True)
    fleet = [  # model updates (docs/fleet.md): rollouts come in, the agents' reports go out
        f"{rollouts_filter(PREFIX)} in 1",
        f"{status_filter(PREFIX)} out 1",
        f"{PREFIX}/fleet/events/+ out 1",
    ]
    assert topics == [f"{pattern} out 1" for pattern in expected] + fleet
    for key, value in {"cleansession": "false", "try_private": "true"}.items():
        assert _bridge_setting(key) == value
    assert _bridge_setting("local_clientid") != BRIDGE_CLIENT_ID
    for name in ("site", "central"):
        assert re.search(r"^persistence[ \t]+true$", (DEPLOY / f"{name}.conf").read_text(), re.M)


def test_events_and_retained_status_reach_the_central_broker(
    brokers: tuple[ShippedBroker, ShippedBroker],
    publisher: AlertPublisher,
    consumers: Callable[..., Consumer],
) -> None:
    _, central = brokers
    following = consumers(central, include_status=True)
    publisher.publish_status("cam-1", {"state": "streaming", "fps": 12.5})
    sent = _publish(publisher, 1, 5)
    following.wait_for_events(sent)
    assert following.event_ids() == sent  # one link, one TCP stream: in order, once each
    _wait(
        lambda: any(o.get("type") == "status" for o in following.objects()),
        "the status arrives",
    )
    # A consumer that comes later gets the agent's state from central's retained messages.
    late = consumers(central, include_status=True)
    _wait(lambda: len(late.objects()) >= 2, "the late consumer gets availability and status")
    state = sorted(late.objects(), key=lambda o: str(o["type"]))
    for line in state:
        del line["received"]
    assert isinstance(state[-1]["status"], dict) and state[-1]["status"].pop("expires_at")
    assert state == [
        {"type": "availability", "agent": AGENT, "state": "online", "retained": True},
        {
            "type": "status",
            "agent": AGENT,
            "camera": "cam-1",
            "status": {"fps": 12.5, "state": "streaming"},
            "retained": True,
        },
    ]


def test_a_share_group_splits_the_events_and_each_member_sees_every_status(
    brokers: tuple[ShippedBroker, ShippedBroker],
    publisher: AlertPublisher,
    consumers: Callable[..., Consumer],
) -> None:
    _, central = brokers
    publisher.publish_status("cam-1", {"state": "streaming"})
    assert publisher.flush(WAIT_S)
    group = AlertConsumerConfig(share_group="ops")
    members = [consumers(central, include_status=True, consumer=group) for _ in range(2)]
    sent = _publish(publisher, 1, 20)
    _wait(
        lambda: set(sent) <= {i for member in members for i in member.event_ids()},
        "the group has every event",
    )
    first, second = (member.event_ids() for member in members)
    assert sorted(first + second) == sorted(sent)  # each event to exactly one member
    assert first and second, "the broker did not split the events"
    for member in members:  # availability and status are not shared: each member has them
        _wait(
            lambda member=member: (
                {o.get("type") for o in member.objects()} >= {"availability", "status"}
            ),
            "each member gets the retained availability and status",
        )


def test_no_event_lost_when_the_central_broker_crashes(
    brokers: tuple[ShippedBroker, ShippedBroker],
    publisher: AlertPublisher,
    consumers: Callable[..., Consumer],
    bridge_state: MqttRecorder,
) -> None:
    site, central = brokers
    durable = consumers(central, consumer=AlertConsumerConfig(session="ops-1"))
    central.save()  # the consumer's subscription is on disk, as after any autosave
    before = _publish(publisher, 1, 10)
    durable.wait_for_events(before)

    central.kill()
    _wait_bridge(bridge_state, up=False)
    during = _publish(publisher, 11, 10)  # the site broker takes them and queues them
    assert publisher.flush(WAIT_S), "the site broker did not take the events"
    central.start()
    _wait_bridge(bridge_state, up=True)
    after = _publish(publisher, 21, 5)

    sent = before + during + after
    durable.wait_for_events(sent)
    # At least once: every event, and a repeat (if any) is one of them, never one nobody sent.
    received = durable.event_ids()
    assert set(received) == set(sent), f"{central.log_tail()}\n{site.log_tail()}"


def test_no_event_lost_when_the_site_broker_crashes(
    brokers: tuple[ShippedBroker, ShippedBroker],
    publisher: AlertPublisher,
    consumers: Callable[..., Consumer],
) -> None:
    site, central = brokers
    following = consumers(central)
    before = _publish(publisher, 1, 5)
    following.wait_for_events(before)

    site.kill()
    _wait(lambda: not publisher.connected, "the publisher sees the site broker gone")
    during = _publish(publisher, 6, 10)  # into the agent's outbox
    assert publisher.outbox.depth() >= 10
    site.start()
    after = _publish(publisher, 16, 5)

    sent = before + during + after
    following.wait_for_events(sent)
    assert publisher.flush(WAIT_S)
    assert set(following.event_ids()) == set(sent)


def test_queued_events_survive_a_site_restart_while_the_uplink_is_down(
    brokers: tuple[ShippedBroker, ShippedBroker],
    publisher: AlertPublisher,
    consumers: Callable[..., Consumer],
    bridge_state: MqttRecorder,
) -> None:
    site, central = brokers
    durable = consumers(central, consumer=AlertConsumerConfig(session="ops-1"))
    central.save()
    central.kill()
    _wait_bridge(bridge_state, up=False)
    queued = _publish(publisher, 1, 10)
    assert publisher.flush(WAIT_S)  # acknowledged by the site broker: gone from the outbox
    site.stop()  # a clean restart (upgrade, reboot): the bridge's queue goes to disk
    site.start()
    central.start()
    durable.wait_for_events(queued)
    assert set(durable.event_ids()) == set(queued)
