"""Shared pytest set-up: real-component fixtures live in `tests/fixtures/` as plugins.

Two lanes. A test that starts a child process (a broker, an RTSP server, an agent or cloud
process, Triton, Chromium, Envoy, Prometheus, Node, systemd-analyze, a CLI run as a subprocess)
carries the `process` marker; one that exports, trains or scores a model over whole clips
carries `slow`. The fast lane leaves both
out: `scripts/test --fast`, i.e. `pytest -m "not process and not slow"`.

`process` is set here from the fixtures a test uses: a fixture whose return annotation names a
process type (`PROCESS_TYPES`) marks every test that needs it, directly or through another
fixture. A module that starts processes itself says so with `pytestmark = pytest.mark.process`.

An audit hook sees every child process a test starts. In a run that selects by `process` (the
fast lane), a test without the marker that starts one fails with the command it ran, so a
missing marker cannot slip into the fast lane unseen (the full run only lists them);
`ALLOWED_CHILDREN` lists the quick tools that make a test input and exit (ffmpeg writing a clip,
openssl a test certificate) and the helpers libraries run on their own (`ldconfig` behind
`ctypes.util.find_library`).
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.grpc_server",
    "tests.fixtures.mqtt",
    "tests.fixtures.rtsp",
    "tests.fixtures.scenes",
    "tests.fixtures.triton",
]

# Return types of fixtures that start a real process (matched as words in the annotation).
PROCESS_TYPES = frozenset(
    {
        "AgentProcess",
        "CloudProcess",
        "EnvoyFront",
        "LivePage",
        "LocalBroker",
        "ManagedProcess",
        "MosquittoBroker",
        "RtspServer",
        "RtspServerFactory",
        "RunningEnvoy",
        "RunningTriton",
        "ShippedBroker",
    }
)
# Quick tools that make an input and exit, and helpers libraries start on their own: they do not
# make a test a process test.
ALLOWED_CHILDREN = frozenset(
    {"ffmpeg", "ffprobe", "openssl", "git", "ldconfig", "ldconfig.real", "uname", "gcc", "cc", "ld"}
)
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.spawn", "os.system"})

_children: list[str] = []
_unmarked: list[str] = []  # tests that started a child process without the marker (full run)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in _SPAWN_EVENTS:
        _children.append(" ".join(str(a) for a in (args[1] if len(args) > 1 else args[0]) or ()))


sys.addaudithook(_audit)


def _starts_process(fixturedef: Any) -> bool:
    annotation = getattr(fixturedef.func, "__annotations__", {}).get("return", "")
    text = annotation if isinstance(annotation, str) else repr(annotation)
    words = set(
        text.replace("[", " ").replace("]", " ").replace(",", " ").replace(".", " ").split()
    )
    return not words.isdisjoint(PROCESS_TYPES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `process` every test that uses a fixture starting a real process."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("process"):
            continue
        if any(
            _starts_process(fixturedef)
            for name in info.names_closure
            for fixturedef in info.name2fixturedefs.get(name, ())[-1:]
        ):
            item.add_marker(pytest.mark.process)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Forget children started before this test (collection, an earlier test's teardown)."""
    _children.clear()


def _unexpected(children: list[str]) -> list[str]:
    return [c for c in children if c and Path(c.split()[0]).name not in ALLOWED_CHILDREN]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fail a test that starts a child process without the `process` marker, in the fast lane."""
    report = yield
    started = _unexpected(_children)
    _children.clear()
    if not started or item.get_closest_marker("process"):
        return report
    if "process" not in (item.config.option.markexpr or ""):
        _unmarked.append(f"{item.nodeid}: {started[0][:200]}")
    elif report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a child process in {report.when} without the `process` "
            f"marker (tests/conftest.py): {started[0][:300]}"
        )
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """List the tests that started a child process without the `process` marker."""
    if _unmarked:
        terminalreporter.section("tests that start a process without the `process` marker")
        for line in _unmarked:
            terminalreporter.write_line(line)
