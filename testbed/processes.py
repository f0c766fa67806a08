"""Child processes for real components (tests, demo): start, wait until ready, stop, restart.

`ManagedProcess` runs one command with stdout and stderr merged into a reader thread that keeps
the last lines, so a fixture can put them into a failure message. Stopping sends SIGTERM and then
SIGKILL; `kill()` sends SIGKILL at once to imitate a crash.

`CpuGroup` gives a child a CPU share of its own where the machine allows it: a cgroup v1 `cpu`
group (a quota in cores and a weight; writable as root, as on the project's machines, which have
no systemd to ask for a slice). The demo runs its cloud service in one, at a lower priority
(`nice`), so the service it stands in for cannot starve the edge agent of the same box.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.02
CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1 `cpu` controller
CFS_PERIOD_US = 100_000


class ProcessStartError(RuntimeError):
    """A managed process exited or did not become ready in time; the message has its output."""


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def tcp_port_accepts(host: str, port: int, *, connect_timeout_s: float = 0.2) -> bool:
    """Whether a TCP connection to `host:port` succeeds right now."""
    try:
        with socket.create_connection((host, port), timeout=connect_timeout_s):
            return True
    except OSError:
        return False


class ManagedProcess:
    """One child process that can be started, checked for readiness, stopped and restarted.

    Readiness is a line of output matching `ready_pattern`, a `ready_check()` returning true,
    or both (the line first). Output of all runs is kept, the newest `tail_lines` lines.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_pattern: str | None = None,
        ready_check: Callable[[], bool] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        tail_lines: int = 200,
        on_spawn: Callable[[int], None] | None = None,
    ) -> None:
        """`on_spawn(pid)` runs right after each start, before the wait for readiness (e.g. to
        put the child into a `CpuGroup` before it loads anything)."""
        self.name = name
        self._on_spawn = on_spawn
        self.argv = list(argv)
        self._ready_pattern = re.compile(ready_pattern) if ready_pattern else None
        self._ready_check = ready_check
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._lines: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._lines_changed = threading.Condition()
        self._run_lines: list[str] = []  # lines of the current run, for the ready pattern
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self.ready_match: re.Match[str] | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the current run, None when never started."""
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        """Whether the current run is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run (negative: killed by that signal); None while running."""
        return self._process.poll() if self._process else None

    def output_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of output, all runs together."""
        with self._lines_changed:
            return "\n".join(list(self._lines)[-lines:])

    def start(self, *, ready_timeout_s: float = 10.0) -> None:
        """Start the process and block until it is ready.

        Raises `ProcessStartError` (with the output tail) if it exits first or is not ready
        within `ready_timeout_s`; in the latter case it is stopped.
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        with self._lines_changed:
            self._run_lines = []
            self._lines.append(f"--- {self.name}: starting {' '.join(self.argv)}")
        # A new session: Ctrl-C on pytest does not reach the child before the fixture stops it.
        self._process = subprocess.Popen(  # noqa: S603 - explicit argument list, no shell
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=self._env,
            cwd=self._cwd,
            start_new_session=True,
        )
        self._reader = threading.Thread(
            target=self._read_output,
            args=(self._process,),
            name=f"{self.name}-output",
            daemon=True,
        )
        self._reader.start()
        try:
            if self._on_spawn is not None:
                self._on_spawn(self._process.pid)
            self._wait_ready(ready_timeout_s)
        except ProcessStartError:
            self.stop()
            raise
        logger.info("%s started (pid %s)", self.name, self.pid)

    def stop(self, *, term_timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after `term_timeout_s`; the exit status, None if never run."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=term_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s ignored SIGTERM for %s s: killing", self.name, term_timeout_s)
                process.kill()
                process.wait()
        self._join_reader()
        logger.info("%s stopped with status %s", self.name, process.returncode)
        return process.returncode

    def kill(self) -> None:
        """SIGKILL at once, like a crash: no chance to close connections cleanly."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
            self._join_reader()
            logger.info("%s killed", self.name)

    def suspend(self) -> None:
        """SIGSTOP: the process keeps its sockets open but stops answering (a stall)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `suspend()`."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self, *, ready_timeout_s: float = 10.0, term_timeout_s: float = 5.0) -> None:
        """Stop (if running) and start again with the same command."""
        self.stop(term_timeout_s=term_timeout_s)
        self.start(ready_timeout_s=ready_timeout_s)

    def _join_reader(self, *, join_timeout_s: float = 2.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout=join_timeout_s)
            self._reader = None

    def _read_output(self, process: subprocess.Popen[str]) -> None:
        if process.stdout is None:  # never: Popen(stdout=PIPE)
            return
        for raw in process.stdout:
            line = raw.rstrip("\n")
            with self._lines_changed:
                self._lines.append(line)
                self._run_lines.append(line)
                self._lines_changed.notify_all()
        process.stdout.close()
        with self._lines_changed:
            self._lines_changed.notify_all()

    def _match_ready_line(self) -> re.Match[str] | None:
        if self._ready_pattern is None:
            return None
        with self._lines_changed:
            for line in self._run_lines:
                match = self._ready_pattern.search(line)
                if match:
                    return match
        return None

    def _wait_ready(self, ready_timeout_s: float) -> None:
        deadline = time.monotonic() + ready_timeout_s
        line_seen = self._ready_pattern is None
        while True:
            if not line_seen:
                self.ready_match = self._match_ready_line()
                line_seen = self.ready_match is not None
            if line_seen and (self._ready_check is None or self._ready_check()):
                return
            if not self.running:
                self._join_reader()
                raise ProcessStartError(
                    f"{self.name} exited with status {self.returncode} before it was ready; "
                    f"output:\n{self.output_tail()}"
                )
            if time.monotonic() >= deadline:
                raise ProcessStartError(
                    f"{self.name} not ready after {ready_timeout_s} s; output:\n"
                    f"{self.output_tail()}"
                )
            with self._lines_changed:
                self._lines_changed.wait(timeout=_POLL_INTERVAL_S)

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, running={self.running})"


class CpuGroup:
    """A cgroup v1 `cpu` group of its own: at most `cores` cores (CFS quota) and `shares` of
    weight against the rest of the machine (1024 is a plain process's).

    `create` returns None where the controller is missing or not writable (not root, cgroup v2
    only); callers then fall back to `nice` alone. `remove()` deletes the group once its
    processes have exited (any left are moved back to the root group first).
    """

    def __init__(self, path: Path, cores: float | None, shares: int) -> None:
        self.path = path
        self.cores = cores
        self.shares = shares

    @classmethod
    def create(
        cls, name: str, *, cores: float | None, shares: int = 1024, root: Path = CGROUP_CPU_ROOT
    ) -> CpuGroup | None:
        """The group `root/name`, made now; None where this machine does not allow it."""
        if cores is not None and not cores > 0:
            raise ValueError(f"cores must be > 0, got {cores}")
        if not 2 <= shares <= 262_144:
            raise ValueError(f"shares must be in [2, 262144], got {shares}")
        path = root / name
        try:
            path.mkdir(exist_ok=True)
            quota = -1 if cores is None else max(1000, round(cores * CFS_PERIOD_US))
            (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
            (path / "cpu.shares").write_text(str(shares))
        except OSError as exc:
            logger.info("no cgroup cpu group %s here: %s", path, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path, cores, shares)

    def add(self, pid: int) -> None:
        """Move process `pid` (and the threads it starts from now on) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Delete the group (its processes, if any are left, go back to the root group)."""
        with contextlib.suppress(OSError):
            left = (self.path / "cgroup.procs").read_text().split()
            for pid in left:
                with contextlib.suppress(OSError):
                    (self.path.parent / "cgroup.procs").write_text(pid)
        try:
            self.path.rmdir()
        except OSError as exc:
            logger.warning("cannot remove cgroup %s: %s", self.path, exc)

    def describe(self) -> str:
        """`cgroup demo-cloud-12 (1 core, cpu.shares 256)`."""
        cores = "no quota" if self.cores is None else f"{self.cores:g} core"
        plural = "s" if self.cores is not None and self.cores != 1 else ""
        return f"cgroup {self.path.name} ({cores}{plural}, cpu.shares {self.shares})"


def nice_prefix(increment: int) -> list[str]:
    """`["nice", "-n", N]` to start a command at a lower priority; [] where `nice` is missing
    (the command then runs at the caller's priority) or `increment` is 0."""
    nice = shutil.which("nice")
    return [nice, "-n", str(increment)] if nice and increment else []
