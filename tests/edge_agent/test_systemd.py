"""sd_notify over real AF_UNIX datagram sockets; the production unit under systemd-analyze."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.service import SystemdNotifier, watchdog_timeout_s

REPO_ROOT = Path(__file__).resolve().parents[2]
UNIT_PATH = REPO_ROOT / "deploy" / "edge-agent.service"
SYSUSERS_PATH = REPO_ROOT / "deploy" / "edge-agent.sysusers.conf"
INSTALLED_BINARY = "/opt/edge-agent/venv/bin/edge-agent"
CONFIG_PATH = "/etc/edge-agent/edge-agent.yaml"
RECV_TIMEOUT_S = 5.0


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(RECV_TIMEOUT_S)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket bound to a file: (`$NOTIFY_SOCKET` value, receiver)."""
    path = str(tmp_path / "notify.sock")
    with _receiver(path) as sock:
        yield path, sock


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket in the abstract namespace: (`@name`, receiver)."""
    name = f"edge-agent-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as sock:
        yield "@" + name, sock


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notifications_arrive_as_exact_datagrams(
    kind: str,
    path_socket: tuple[str, socket.socket],
    abstract_socket: tuple[str, socket.socket],
) -> None:
    address, receiver = path_socket if kind == "path" else abstract_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled

    assert notifier.ready()
    assert receiver.recv(4096) == b"READY=1"
    assert notifier.status("streaming 2/2 cameras")
    assert receiver.recv(4096) == b"STATUS=streaming 2/2 cameras"
    assert notifier.watchdog()
    assert receiver.recv(4096) == b"WATCHDOG=1"
    assert notifier.ready("up")
    assert receiver.recv(4096) == b"READY=1\nSTATUS=up"
    assert notifier.extend_timeout(30)
    assert receiver.recv(4096) == b"EXTEND_TIMEOUT_USEC=30000000"
    assert notifier.stopping()
    assert receiver.recv(4096) == b"STOPPING=1"


def test_status_stays_on_one_line(path_socket: tuple[str, socket.socket]) -> None:
    address, receiver = path_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.status("camera cam-1 failed:\nconnection refused")
    assert receiver.recv(4096) == b"STATUS=camera cam-1 failed: connection refused"


def test_reloading_carries_the_monotonic_time(path_socket: tuple[str, socket.socket]) -> None:
    address, receiver = path_socket
    assert SystemdNotifier({"NOTIFY_SOCKET": address}).reloading()
    first, second = receiver.recv(4096).decode().split("\n")
    assert first == "RELOADING=1"
    key, value = second.split("=")
    assert key == "MONOTONIC_USEC"
    assert int(value) > 0


@pytest.mark.parametrize("environ", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "relative"}])
def test_without_a_socket_every_call_is_a_no_op(environ: dict[str, str]) -> None:
    notifier = SystemdNotifier(environ)
    assert not notifier.enabled
    assert not notifier.ready()
    assert not notifier.status("x")
    assert not notifier.watchdog()
    assert not notifier.stopping()
    assert not notifier.reloading()
    assert notifier.watchdog_interval_s() is None


def test_a_vanished_socket_is_reported_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier.enabled
    assert not notifier.ready()


def test_extend_timeout_needs_a_positive_time(path_socket: tuple[str, socket.socket]) -> None:
    with pytest.raises(ValueError, match="positive"):
        SystemdNotifier({"NOTIFY_SOCKET": path_socket[0]}).extend_timeout(0)


OWN_PID = 4242


@pytest.mark.parametrize(
    ("environ", "expected_timeout_s"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "500000"}, 0.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OWN_PID)}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OWN_PID + 1)}, None),
        ({"WATCHDOG_PID": str(OWN_PID)}, None),
    ],
)
def test_watchdog_timeout_from_the_environment(
    environ: dict[str, str], expected_timeout_s: float | None
) -> None:
    assert watchdog_timeout_s(environ, pid=OWN_PID) == expected_timeout_s
    notifier = SystemdNotifier(environ, pid=OWN_PID)
    assert notifier.watchdog_timeout_s() == expected_timeout_s
    expected_interval = None if expected_timeout_s is None else expected_timeout_s / 2
    assert notifier.watchdog_interval_s() == expected_interval


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"WATCHDOG_USEC": "thirty"}, r"\$WATCHDOG_USEC must be a positive integer, got 'thirty'"),
        ({"WATCHDOG_USEC": "0"}, r"\$WATCHDOG_USEC must be a positive integer, got '0'"),
        ({"WATCHDOG_USEC": "-5"}, r"\$WATCHDOG_USEC must be a positive integer, got '-5'"),
        ({"WATCHDOG_USEC": "1.5"}, r"\$WATCHDOG_USEC must be a positive integer, got '1.5'"),
        (
            {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"},
            r"\$WATCHDOG_PID must be a positive integer, got 'me'",
        ),
    ],
)
def test_malformed_watchdog_variables_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        watchdog_timeout_s(environ, pid=OWN_PID)
    with pytest.raises(ValueError, match=message):
        SystemdNotifier(environ, pid=OWN_PID)


def test_watchdog_pid_defaults_to_this_process() -> None:
    environ = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_timeout_s(environ) == 2.0


# -- the unit file ------------------------------------------------------------------------------


def _unit_settings(text: str) -> dict[str, list[str]]:
    """`section.Key` -> values in order (systemd keys repeat), ignoring comments."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def test_unit_runs_as_a_notify_service_with_watchdog_and_config_check() -> None:
    settings = _unit_settings(UNIT_PATH.read_text())

    def one(key: str) -> str:
        values = settings.get(key, [])
        assert len(values) == 1, f"{key}: {values}"
        return values[0]

    assert one("Service.Type") == "notify"
    assert one("Service.NotifyAccess") == "main"
    assert one("Service.WatchdogSec") == "30"
    assert one("Service.ExecStartPre").split() == [
        INSTALLED_BINARY,
        "validate-config",
        "--check-secrets",
        CONFIG_PATH,
    ]
    assert one("Service.ExecStart").split() == [INSTALLED_BINARY, "run", "--config", CONFIG_PATH]
    assert one("Service.Restart") == "on-failure"
    assert one("Service.RestartSec") == "5"
    assert one("Service.StateDirectory") == "edge-agent"
    assert one("Service.User") == "edge-agent"
    assert one("Service.SupplementaryGroups") == "video"
    assert one("Service.KillSignal") == "SIGTERM"
    assert int(one("Service.TimeoutStopSec")) >= 30
    assert "PYTHONUNBUFFERED=1" in settings["Service.Environment"]
    assert "Service.MemoryDenyWriteExecute" not in settings  # JIT in the inference runtimes
    assert "Unit.StartLimitBurst" in settings
    assert "Unit.StartLimitIntervalSec" in settings
    assert one("Install.WantedBy") == "multi-user.target"


def test_sysusers_file_creates_the_units_user() -> None:
    entries = [
        line.split()
        for line in SYSUSERS_PATH.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [(entry[0], entry[1]) for entry in entries] == [("u", "edge-agent")]


def _systemd_analyze() -> str:
    executable = shutil.which("systemd-analyze")
    if executable is None:
        pytest.skip("systemd-analyze not found (scripts/install-system-deps installs systemd)")
    return executable


def _installable_copy(tmp_path: Path, *, uncomment: tuple[str, ...] = ()) -> Path:
    """The unit with its binary pointed at a real executable (verify checks that it exists)."""
    binary = shutil.which("edge-agent") or str(Path(sys.executable).parent / "edge-agent")
    assert Path(binary).is_file(), "the venv's edge-agent entry point is missing (pip install -e .)"
    lines = []
    for line in UNIT_PATH.read_text().replace(INSTALLED_BINARY, binary).splitlines():
        if line.startswith(tuple(f"#{key}=" for key in uncomment)):
            line = line[1:]
        lines.append(line)
    copy = tmp_path / "edge-agent.service"
    copy.write_text("\n".join(lines) + "\n")
    return copy


def _verify(unit: Path) -> None:
    result = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", "--recursive-errors=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    about_unit = [line for line in output.splitlines() if unit.name in line]
    assert about_unit == [], output


@pytest.mark.process
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    _verify(_installable_copy(tmp_path))


@pytest.mark.process
def test_unit_with_its_commented_examples_enabled_passes_verify(tmp_path: Path) -> None:
    _verify(
        _installable_copy(tmp_path, uncomment=("LoadCredential", "DevicePolicy", "DeviceAllow"))
    )


@pytest.mark.process
def test_unit_hardening_keeps_exposure_low(tmp_path: Path) -> None:
    unit = _installable_copy(tmp_path)
    # --threshold is on systemd's 0-100 scale: 25 means "exposure level 2.5 or less".
    result = subprocess.run(
        [
            _systemd_analyze(),
            "security",
            "--offline=yes",
            "--threshold=25",
            "--no-pager",
            str(unit),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
