"""`edge-agent alerts`: follow an agent's (or every agent's) alert topics and print them.

For an operator at a terminal: one line per event (`text`), or one JSON object per line (`json`)
for piping into `jq`. Topics and payloads are those of `edge_agent.alerts.payload`.

Text lines:

    2025-11-30T06:55:50.125Z edge-01/cam-1 door zone_enter start class=person track=7 zone=door
    2025-11-30T06:57:02.004Z edge-01 availability offline (retained)
    2025-11-30T06:57:02.010Z edge-01/cam-1 status {"fps":12.5,"state":"streaming"} (retained)

Event lines start with the event's own timestamp; availability and status lines, which carry no
time, with the time they were received. In `json` mode events are printed as their `edge-alert/v1`
object; availability and status as `{"type": "availability"|"status", "agent", ["camera"],
"state"|"status", "retained", "received"}`.

By default the subscriber uses its own random client id (never `mqtt.client_id`, which would
disconnect the agent), a clean session and QoS 1; paho reconnects by itself after a lost connection.

Beyond one broker (`deploy/mosquitto/`: site brokers bridged to a central one), consumers on the
central broker can (`AlertConsumerConfig`, `edge_agent.alerts.consumer`):

* split the events in a share group (`--share-group NAME`: `$share/NAME/<prefix>/+/events/+/+`);
  availability and status stay plain subscriptions, so every member sees them whole;
* keep a lasting session (`--session NAME`: client id `edge-alerts-NAME`, clean session off), so
  the broker queues events while the consumer is away;
* drop repeated deliveries of an event (`--dedup`): QoS 1 is at least once.

A message is acknowledged (PUBACK) only once its line is written, so with a lasting session one
that was received but not yet printed when the consumer died comes again.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from configkit.cli import add_log_level_argument
from configkit.secrets import SecretError
from edge_agent.alerts.connection import configure_client
from edge_agent.alerts.consumer import (
    AlertConsumerConfig,
    AlertsConsumerFile,
    RecentEvents,
    check_share_group,
    event_key,
    shared_filter,
)
from edge_agent.alerts.payload import SCHEMA, iso_utc
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.mqtt import MqttConfig

__all__ = [
    "DEDUP_MEMORY",
    "AlertFormat",
    "add_alerts_arguments",
    "alert_topic_filters",
    "alerts_command",
    "format_message",
    "run_alerts",
]

logger = logging.getLogger(__name__)

AlertFormat = Literal["text", "json"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_SUBSCRIBE_QOS = 1
_STOP_POLL_S = 0.1  # how soon a set `stop` event ends `run_alerts`
DEDUP_MEMORY = 10_000
"""Events `--dedup` remembers. A repeat comes within a few hundred messages of the first delivery
(the in-flight windows of publisher, bridge and broker): a wide margin, at a few MB."""
_NAME = re.compile(NAME_PATTERN)
_EVENT_DETAILS = ("direction", "zone", "line", "count", "counts")


def alert_topic_filters(
    prefix: str,
    *,
    agent: str | None = None,
    camera: str | None = None,
    include_status: bool = False,
    share_group: str | None = None,
) -> list[str]:
    """The topic filters to follow: events, and availability and status with `include_status`.

    `agent` / `camera` None means all. With `share_group` the events filter is that group's
    shared subscription (the others stay whole). Raises `ValueError` for a name that cannot be in
    a topic or a share group.
    """
    for what, name in (("agent", agent), ("camera", camera)):
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError(f"{what} {name!r} is not a valid name (pattern {NAME_PATTERN})")
    who = agent if agent is not None else "+"
    where = camera if camera is not None else "+"
    events = f"{prefix}/{who}/events/{where}/+"
    filters = [events if share_group is None else shared_filter(share_group, events)]
    if include_status:
        filters += [f"{prefix}/{who}/availability", f"{prefix}/{who}/status/{where}"]
    return filters


def format_message(
    prefix: str,
    topic: str,
    payload: bytes,
    *,
    retained: bool,
    fmt: AlertFormat = "text",
    class_names: Sequence[str] = (),
    received_s: float | None = None,
) -> str:
    """One output line (no newline) for a message on one of the alert topics.

    Raises `ValueError` saying what is wrong when the topic or payload is not one of ours.
    """
    parts = _topic_parts(prefix, topic)
    received = iso_utc(time.time() if received_s is None else received_s)
    match parts:
        case [agent, "events", _camera, _rule]:
            event = _event_object(payload)
            if fmt == "json":
                return json.dumps(event, separators=(",", ":"))
            return _event_line(agent, event, class_names)
        case [agent, "availability"]:
            state = _text(payload)
            if fmt == "json":
                return _json_line("availability", agent, None, "state", state, retained, received)
            return f"{received} {agent} availability {state}{_retained(retained)}"
        case [agent, "status", camera]:
            status = _json_payload(payload)
            if fmt == "json":
                return _json_line("status", agent, camera, "status", status, retained, received)
            shown = json.dumps(status, separators=(",", ":"), sort_keys=True)
            return f"{received} {agent}/{camera} status {shown}{_retained(retained)}"
    raise ValueError(f"not an alert topic: {topic!r}")


def _topic_parts(prefix: str, topic: str) -> list[str]:
    head = prefix + "/"
    if not topic.startswith(head):
        raise ValueError(f"topic {topic!r} is not under {prefix!r}")
    return topic[len(head) :].split("/")


def _text(payload: bytes) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("payload is not UTF-8") from None


def _json_payload(payload: bytes) -> Any:
    try:
        return json.loads(_text(payload))
    except json.JSONDecodeError as error:
        raise ValueError(f"payload is not JSON: {error}") from None


def _event_object(payload: bytes) -> dict[str, Any]:
    event = _json_payload(payload)
    if not isinstance(event, dict):
        raise ValueError("event payload is not a JSON object")
    schema = event.get("schema")
    if schema != SCHEMA:
        raise ValueError(f"unsupported event schema {schema!r} (this tool reads {SCHEMA})")
    return event


def _event_line(agent: str, event: Mapping[str, Any], class_names: Sequence[str]) -> str:
    head = (
        f"{event.get('timestamp')} {event.get('agent', agent)}/{event.get('camera')} "
        f"{event.get('rule')} {event.get('kind')} {event.get('phase')}"
    )
    details = []
    class_id = event.get("class")
    if class_id is not None:
        # the payload's own `label` first (the agent's detector names it), else `class_names`
        label = event.get("label")
        known = isinstance(class_id, int) and 0 <= class_id < len(class_names)
        if not isinstance(label, str):
            label = class_names[class_id] if known else class_id
        details.append(f"class={label}")
    if event.get("track_id") is not None:
        details.append(f"track={event['track_id']}")
    details += [f"{key}={event[key]}" for key in _EVENT_DETAILS if event.get(key) is not None]
    return " ".join([head, *details])


def _json_line(
    kind: str,
    agent: str,
    camera: str | None,
    key: str,
    value: object,
    retained: bool,
    received: str,
) -> str:
    line: dict[str, object] = {"type": kind, "agent": agent}
    if camera is not None:
        line["camera"] = camera
    line |= {key: value, "retained": retained, "received": received}
    return json.dumps(line, separators=(",", ":"))


def _retained(retained: bool) -> str:
    return " (retained)" if retained else ""


@dataclass(frozen=True)
class _Message:
    topic: str
    payload: bytes
    retained: bool
    received_s: float
    mid: int
    qos: int
    connection: int  # which connection of the client it came on (see `_Listener.ack`)


@dataclass(frozen=True)
class _Failure:
    """The connection or a subscription was refused: the command ends with this message."""

    message: str


@dataclass(frozen=True)
class _Notice:
    """Something for the operator on stderr (connection lost / back); the command goes on."""

    message: str


_Item = _Message | _Failure | _Notice


class _Listener:
    """paho callbacks that hand everything to the command's thread through a queue."""

    def __init__(self, filters: Sequence[str], ready: threading.Event | None) -> None:
        self.items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.filters = list(filters)
        self.ready = ready
        self.connected_once = threading.Event()
        self.connection = 0
        self._subscribe_mid: int | None = None

    def on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            self.items.put(_Failure(f"broker refused the connection: {reason_code}"))
            return
        if self.connected_once.is_set():
            self.items.put(_Notice("reconnected to the broker"))
        self.connection += 1
        self.connected_once.set()
        _, self._subscribe_mid = client.subscribe([(f, _SUBSCRIBE_QOS) for f in self.filters])

    def on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        if mid != self._subscribe_mid:
            return
        refused = [
            f for f, code in zip(self.filters, reason_codes, strict=False) if code.is_failure
        ]
        if refused:
            self.items.put(_Failure(f"broker refused the subscription to {', '.join(refused)}"))
            return
        logger.info("subscribed to %s", ", ".join(self.filters))
        if self.ready is not None:
            self.ready.set()

    def on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self.connected_once.is_set():
            self.items.put(_Notice(f"connection to the broker lost ({reason_code}); reconnecting"))

    def on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.items.put(
            _Message(
                message.topic,
                bytes(message.payload),
                message.retain,
                time.time(),
                message.mid,
                message.qos,
                self.connection,
            )
        )

    def ack(self, client: mqtt.Client, message: _Message) -> None:
        """Acknowledge `message` (manual acks: after it is printed or skipped).

        Not when it came on an earlier connection: its packet id may by now name another message,
        and the broker sends it again anyway (lasting session) or has forgotten it (clean one).
        """
        if message.qos > 0 and message.connection == self.connection:
            client.ack(message.mid, message.qos)


def run_alerts(
    config: MqttConfig,
    out: TextIO,
    *,
    agent: str | None = None,
    camera: str | None = None,
    include_status: bool = False,
    fmt: AlertFormat = "text",
    max_messages: int | None = None,
    timeout_s: float | None = None,
    connect_timeout_s: float = 10.0,
    class_names: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    err: TextIO | None = None,
    ready: threading.Event | None = None,
    consumer: AlertConsumerConfig | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Print alert messages from the broker of `config` to `out` until told to stop.

    Stops after `max_messages` printed lines, after `timeout_s`, on Ctrl-C or once `stop` is set
    (exit code 0). Connection problems are one line on `err` (default stderr) and exit code 1; a
    bad `agent`/`camera` name is exit code 2. `class_names` turns class ids into names; `environ`
    is where the broker password is resolved; `ready` is set once the subscriptions are
    acknowledged; `consumer` sets the share group, lasting session and dedup (default: none).
    """
    errors = sys.stderr if err is None else err
    consumer = AlertConsumerConfig() if consumer is None else consumer
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, got {max_messages}")
    try:
        filters = alert_topic_filters(
            config.topic_prefix,
            agent=agent,
            camera=camera,
            include_status=include_status,
            share_group=consumer.share_group,
        )
    except ValueError as error:
        print(f"alerts: {error}", file=errors)
        return EXIT_USAGE
    listener = _Listener(filters, ready)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=consumer.client_id or f"edge-alerts-{uuid.uuid4().hex[:12]}",
        clean_session=consumer.session is None,
        manual_ack=True,
    )
    client.on_connect = listener.on_connect
    client.on_subscribe = listener.on_subscribe
    client.on_disconnect = listener.on_disconnect
    client.on_message = listener.on_message
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    try:
        configure_client(client, config, environ)
        client.connect(config.host, config.port, config.keepalive_s)
    except SecretError as error:
        print(f"alerts: broker password: {error}", file=errors)
        return EXIT_FAILED
    except (OSError, ValueError) as error:
        print(f"alerts: cannot connect to MQTT broker {_where(config)}: {error}", file=errors)
        return EXIT_FAILED
    client.loop_start()
    try:
        return _print_messages(
            listener,
            out,
            errors,
            config=config,
            fmt=fmt,
            class_names=class_names,
            max_messages=max_messages,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            ack=lambda message: listener.ack(client, message),
            recent=RecentEvents(consumer.dedup_memory) if consumer.dedup_memory else None,
            stop=stop,
        )
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        client.disconnect()
        client.loop_stop()


def _print_messages(
    listener: _Listener,
    out: TextIO,
    errors: TextIO,
    *,
    config: MqttConfig,
    fmt: AlertFormat,
    class_names: Sequence[str],
    max_messages: int | None,
    timeout_s: float | None,
    connect_timeout_s: float,
    ack: Callable[[_Message], None],
    recent: RecentEvents | None,
    stop: threading.Event | None,
) -> int:
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    connect_deadline = start + connect_timeout_s
    printed = 0
    while max_messages is None or printed < max_messages:
        if stop is not None and stop.is_set():
            return EXIT_OK
        connecting = not listener.connected_once.is_set()
        ends = [end for end in (deadline, connect_deadline if connecting else None) if end]
        if stop is not None:
            ends.append(time.monotonic() + _STOP_POLL_S)
        try:
            if ends:
                item = listener.items.get(timeout=max(0.0, min(ends) - time.monotonic()))
            else:
                item = listener.items.get()
        except queue.Empty:
            if not listener.connected_once.is_set() and time.monotonic() >= connect_deadline:
                print(f"alerts: no answer from MQTT broker {_where(config)}", file=errors)
                return EXIT_FAILED
            if deadline is not None and time.monotonic() >= deadline:
                return EXIT_OK
            continue
        if isinstance(item, _Failure):
            print(f"alerts: {item.message}", file=errors)
            return EXIT_FAILED
        if isinstance(item, _Notice):
            print(f"alerts: {item.message}", file=errors)
            continue
        line = _line_for(item, errors, config.topic_prefix, fmt, class_names, recent)
        if line is not None:
            try:
                out.write(line + "\n")
                out.flush()
            except BrokenPipeError:  # `edge-agent alerts | head`
                return EXIT_OK
            printed += 1
        ack(item)  # written (or skipped for good): the broker may forget it
    return EXIT_OK


def _line_for(
    message: _Message,
    errors: TextIO,
    prefix: str,
    fmt: AlertFormat,
    class_names: Sequence[str],
    recent: RecentEvents | None,
) -> str | None:
    """The line to print for `message`; None for one that is unreadable (said on `errors`) or
    a repeat of a recent event."""
    try:
        line = format_message(
            prefix,
            message.topic,
            message.payload,
            retained=message.retained,
            fmt=fmt,
            class_names=class_names,
            received_s=message.received_s,
        )
    except ValueError as error:
        print(f"alerts: skipped a message on {message.topic}: {error}", file=errors)
        return None
    if recent is not None:
        key = event_key(message.payload)
        if key is not None and recent.is_repeat(key):
            logger.debug("dropped a repeated delivery of event %s (%s)", key[0], key[1])
            return None
    return line


def _where(config: MqttConfig) -> str:
    return f"{config.host}:{config.port}"


# -- command line ---------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _share_group(text: str) -> str:
    try:
        return check_share_group(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _session_name(text: str) -> str:
    if not _NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid session name (pattern {NAME_PATTERN})"
        )
    return text


def add_alerts_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `edge-agent alerts`; `alerts_command` runs it."""
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help=(
            "edge agent YAML (its mqtt section, agent id and class names), or a consumer's own "
            "YAML with only an mqtt section (no agent: every agent's events by default)"
        ),
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument(
        "--agent",
        metavar="ID",
        help="agent to follow (default: the agent config's; every agent with a consumer's YAML)",
    )
    who.add_argument(
        "--all-agents", action="store_true", help="follow every agent under the topic prefix"
    )
    parser.add_argument("--camera", metavar="NAME", help="only this camera's messages")
    parser.add_argument(
        "--status",
        action="store_true",
        dest="include_status",
        help="also print availability (online/offline) and camera status messages",
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="text lines or JSON lines"
    )
    parser.add_argument(
        "--count", type=_positive_int, default=None, metavar="N", help="exit after N messages"
    )
    parser.add_argument(
        "--timeout", type=_positive_float, default=None, metavar="SECONDS", help="exit after this"
    )
    consumers = parser.add_argument_group(
        "several consumers",
        "for consumers of a central broker that site brokers bridge into (deploy/mosquitto/)",
    )
    consumers.add_argument(
        "--share-group",
        type=_share_group,
        default=None,
        metavar="NAME",
        help=(
            "split the events with every consumer in share group NAME: each event goes to one "
            "of them (MQTT shared subscription $share/NAME/...; Mosquitto 2 also takes it from "
            "MQTT 3.1.1 clients). --status messages still go to every consumer. NAME: no "
            "'/', '+', '#' or control characters"
        ),
    )
    consumers.add_argument(
        "--session",
        type=_session_name,
        default=None,
        metavar="NAME",
        help=(
            "keep a lasting session (client id edge-alerts-NAME): the broker queues events "
            "while this consumer is away and sends them when it is back; one process per NAME"
        ),
    )
    consumers.add_argument(
        "--dedup",
        action="store_true",
        help=(
            "print each event message once: delivery is at least once, so drop a repeat "
            f"(same event_id, phase and timestamp) among the last {DEDUP_MEMORY} events"
        ),
    )
    add_log_level_argument(parser, "WARNING")


@dataclass(frozen=True)
class _Source:
    """What `--config` gives the command: the broker, whose events by default, class names."""

    mqtt: MqttConfig
    agent: str | None
    class_names: Sequence[str]


def _load_source(path: str) -> _Source:
    """An agent's config (it has `agent:`), else a consumer's own (`mqtt:` only).

    Raises `OSError` when the file cannot be read, `ConfigError` when it is not valid.
    """
    import yaml

    from configkit.yaml_loader import parse_config
    from edge_agent.config import EdgeAgentConfig

    text = Path(path).read_text(encoding="utf-8")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        document = None  # the agent config's parser reports it with its line
    if isinstance(document, dict) and "agent" not in document:
        consumer = parse_config(text, AlertsConsumerFile, path)
        return _Source(consumer.mqtt, None, ())
    agent = parse_config(text, EdgeAgentConfig, path)
    return _Source(agent.mqtt, agent.agent.id, agent.detector.class_names)


def alerts_command(args: argparse.Namespace) -> int:
    """Run `edge-agent alerts` with the options of `add_alerts_arguments`."""
    from configkit.yaml_loader import ConfigError

    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        source = _load_source(args.config)
    except OSError as error:
        print(f"{args.config}: cannot read: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_FAILED
    agent = None if args.all_agents else (args.agent or source.agent)
    return run_alerts(
        source.mqtt,
        sys.stdout,
        agent=agent,
        camera=args.camera,
        include_status=args.include_status,
        fmt=args.format,
        max_messages=args.count,
        timeout_s=args.timeout,
        class_names=source.class_names,
        consumer=AlertConsumerConfig(
            share_group=args.share_group,
            session=args.session,
            dedup_memory=DEDUP_MEMORY if args.dedup else 0,
        ),
    )
