"""`CpuGroup`: a CPU share of its own for a child process (the demo's cloud), on the real cgroup
v1 `cpu` controller where this machine lets us write it, and the fallback where it does not."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from testbed.processes import CGROUP_CPU_ROOT, CpuGroup, ManagedProcess, nice_prefix

pytestmark = pytest.mark.timeout(60)


def _writable_cpu_controller() -> bool:
    return CGROUP_CPU_ROOT.is_dir() and os.access(CGROUP_CPU_ROOT, os.W_OK)


@pytest.mark.parametrize(
    ("cores", "shares", "message"),
    [(0.0, 1024, "cores must be > 0"), (1.0, 1, r"shares must be in \[2, 262144\]")],
)
def test_bad_shares_are_refused_by_name(cores: float, shares: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CpuGroup.create("never-made", cores=cores, shares=shares)


def test_no_group_where_the_controller_cannot_be_written(tmp_path: Path) -> None:
    """No cgroup file system there (not root, cgroup v2 only): None, and nothing left behind."""
    root = tmp_path / "no-controller"
    assert CpuGroup.create("g", cores=1.0, root=root) is None
    assert not root.exists()


@pytest.mark.process
@pytest.mark.skipif(not _writable_cpu_controller(), reason="cgroup v1 cpu controller not writable")
def test_a_child_runs_in_its_own_group_under_its_quota() -> None:
    group = CpuGroup.create(f"test-cpu-group-{os.getpid()}", cores=0.5, shares=512)
    assert group is not None
    sleeper = "import time; print('up', flush=True); time.sleep(30)"
    child = ManagedProcess(
        "sleeper",
        [*nice_prefix(5), sys.executable, "-c", sleeper],
        ready_pattern="up",
        on_spawn=group.add,
    )
    try:
        child.start(ready_timeout_s=20.0)
        assert child.pid is not None
        assert f"/{group.path.name}" in Path(f"/proc/{child.pid}/cgroup").read_text()
        assert (group.path / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (group.path / "cpu.shares").read_text().strip() == "512"
        assert os.getpriority(os.PRIO_PROCESS, child.pid) - os.getpriority(os.PRIO_PROCESS, 0) == 5
        assert group.describe() == f"cgroup {group.path.name} (0.5 cores, cpu.shares 512)"
    finally:
        child.stop()
        group.remove()
    assert not group.path.exists()
