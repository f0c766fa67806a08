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

The subscriber uses its own random client id (never `mqtt.client_id`, which would disconnect the
agent), a clean session and QoS 1; paho reconnects by itself after a lost connection.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from configkit.cli import add_log_level_argument
from configkit.secrets import SecretError
from edge_agent.alerts.connection import configure_client
from edge_agent.alerts.payload import SCHEMA, iso_utc
from edge_agent.config.agent import NAME_PATTERN
from edge_agent.config.mqtt import MqttConfig

__all__ = [
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
_NAME = re.compile(NAME_PATTERN)
_EVENT_DETAILS = ("direction", "zone", "line", "count")


def alert_topic_filters(
    prefix: str,
    *,
    agent: str | None = None,
    camera: str | None = None,
    include_status: bool = False,
) -> list[str]:
    """The topic filters to follow: events, and availability and status with `include_status`.

    `agent` / `camera` None means all. Raises `ValueError` for a name that cannot be in a topic.
    """
    for what, name in (("agent", agent), ("camera", camera)):
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError(f"{what} {name!r} is not a valid name (pattern {NAME_PATTERN})")
    who = agent if agent is not None else "+"
    where = camera if camera is not None else "+"
    filters = [f"{prefix}/{who}/events/{where}/+"]
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
        self.items.put(_Message(message.topic, bytes(message.payload), message.retain, time.time()))


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
) -> int:
    """Print alert messages from the broker of `config` to `out` until told to stop.

    Stops after `max_messages` printed lines, after `timeout_s`, or on Ctrl-C (exit code 0).
    Connection problems are one line on `err` (default stderr) and exit code 1; a bad
    `agent`/`camera` name is exit code 2. `class_names` turns class ids into names; `environ`
    is where the broker password is resolved; `ready` is set once the subscriptions are
    acknowledged.
    """
    errors = sys.stderr if err is None else err
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, got {max_messages}")
    try:
        filters = alert_topic_filters(
            config.topic_prefix, agent=agent, camera=camera, include_status=include_status
        )
    except ValueError as error:
        print(f"alerts: {error}", file=errors)
        return EXIT_USAGE
    listener = _Listener(filters, ready)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"edge-alerts-{uuid.uuid4().hex[:12]}"
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
) -> int:
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    connect_deadline = start + connect_timeout_s
    printed = 0
    while max_messages is None or printed < max_messages:
        connecting = not listener.connected_once.is_set()
        ends = [end for end in (deadline, connect_deadline if connecting else None) if end]
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
        try:
            line = format_message(
                config.topic_prefix,
                item.topic,
                item.payload,
                retained=item.retained,
                fmt=fmt,
                class_names=class_names,
                received_s=item.received_s,
            )
        except ValueError as error:
            print(f"alerts: skipped a message on {item.topic}: {error}", file=errors)
            continue
        try:
            out.write(line + "\n")
            out.flush()
        except BrokenPipeError:  # `edge-agent alerts | head`
            return EXIT_OK
        printed += 1
    return EXIT_OK


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


def add_alerts_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `edge-agent alerts`; `alerts_command` runs it."""
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="edge agent YAML: its mqtt section, agent id and class names",
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--agent", metavar="ID", help="agent to follow (default: the config's)")
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
    add_log_level_argument(parser, "WARNING")


def alerts_command(args: argparse.Namespace) -> int:
    """Run `edge-agent alerts` with the options of `add_alerts_arguments`."""
    from configkit.yaml_loader import ConfigError, load_config
    from edge_agent.config import EdgeAgentConfig

    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, EdgeAgentConfig)
    except OSError as error:
        print(f"{args.config}: cannot read: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_FAILED
    agent = None if args.all_agents else (args.agent or config.agent.id)
    return run_alerts(
        config.mqtt,
        sys.stdout,
        agent=agent,
        camera=args.camera,
        include_status=args.include_status,
        fmt=args.format,
        max_messages=args.count,
        timeout_s=args.timeout,
        class_names=config.detector.class_names,
    )
