"""A real Triton Inference Server for tests, benches and local runs, from PyTriton's wheel.

PyTriton (`nvidia-pytriton`) ships a complete `tritonserver` binary with the Python backend; it
runs on CPU-only machines. It needs numpy < 2, so it lives in its own venv (`.venv-triton`,
made by `scripts/setup-triton`), apart from the project's. `running_triton` starts that binary
on a model repository (see `cloud_service.triton_repository`) in explicit model-control mode
with every model loaded, and waits until Triton says it is ready:

    with running_triton(repository) as triton:
        config = TritonConfig(url=triton.grpc_target, model_name="cloud-detector")

From a shell, until Ctrl-C: `python -m testbed.triton --repository DIR --grpc-port 8001`.

What the binary needs, prepared here: a backends folder whose `python/` holds the stub built
for the venv's Python version; the libraries of the wheel and the interpreter's `libpython` on
`LD_LIBRARY_PATH`; and the venv's site-packages on `PYTHONPATH` for the models' imports
(`triton_python_model.py` adds them: the stub does not read the variable itself).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos.inference.v2 import inference_pb2 as pb
from protos.inference.v2 import inference_pb2_grpc as pb_grpc
from testbed.processes import ManagedProcess, free_tcp_port

REPO_ROOT = Path(__file__).resolve().parents[1]
TRITON_VENV = Path(os.environ.get("TRITON_VENV", REPO_ROOT / ".venv-triton"))


class TritonUnavailableError(RuntimeError):
    """No Triton venv here; the message says how to make one."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of PyTriton's server are in a venv."""

    python: Path
    site_packages: Path
    server_dir: Path  # pytriton/tritonserver
    libs_dir: Path  # nvidia_pytriton.libs
    python_version: str  # "3.11"
    libpython_dir: Path

    @property
    def binary(self) -> Path:
        """The `tritonserver` executable."""
        return self.server_dir / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        """The Python-backend stub built for the venv's Python version."""
        return (
            self.server_dir
            / "python_backend_stubs"
            / self.python_version
            / ("triton_python_backend_stub")
        )


def find_triton(venv: Path = TRITON_VENV) -> TritonInstall:
    """The PyTriton server in `venv`; raises `TritonUnavailableError` when it is not there."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise TritonUnavailableError(
            f"no Triton venv at {venv}: run scripts/setup-triton (or set TRITON_VENV)"
        )
    probe = (
        "import sys, sysconfig, pathlib, pytriton;"
        "print(pathlib.Path(pytriton.__file__).parent);"
        "print(sysconfig.get_paths()['purelib']);"
        "print(f'{sys.version_info[0]}.{sys.version_info[1]}');"
        "print(sysconfig.get_config_var('LIBDIR'))"
    )
    completed = subprocess.run(  # noqa: S603 - fixed argv
        [str(python), "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    if completed.returncode != 0:
        raise TritonUnavailableError(
            f"{venv} has no PyTriton ({completed.stderr.strip()[-300:]}): run scripts/setup-triton"
        )
    package, purelib, version, libdir = completed.stdout.split("\n")[:4]
    install = TritonInstall(
        python=python,
        site_packages=Path(purelib),
        server_dir=Path(package) / "tritonserver",
        libs_dir=Path(package).parent / "nvidia_pytriton.libs",
        python_version=version,
        libpython_dir=Path(libdir),
    )
    for needed in (install.binary, install.stub, install.libs_dir):
        if not needed.exists():
            raise TritonUnavailableError(f"PyTriton in {venv} lacks {needed}")
    return install


def prepare_backends(install: TritonInstall, folder: Path) -> Path:
    """A backends folder for the binary: the wheel's Python backend plus the matching stub."""
    python_dir = folder / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for item in (install.server_dir / "backends" / "python").iterdir():
        if item.is_file():
            shutil.copy2(item, python_dir / item.name)
    shutil.copy2(install.stub, python_dir / "triton_python_backend_stub")
    return folder


def server_env(install: TritonInstall) -> dict[str, str]:
    """The environment the binary and its Python stubs need."""
    env = dict(os.environ)
    libraries = [str(install.libpython_dir), str(install.libs_dir)]
    if env.get("LD_LIBRARY_PATH"):
        libraries.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libraries)
    env["PYTHONPATH"] = str(install.site_packages)
    return env


@dataclass(frozen=True)
class RunningTriton:
    """A started server: its process and ports."""

    process: ManagedProcess
    grpc_port: int
    http_port: int
    metrics_port: int

    @property
    def grpc_target(self) -> str:
        """`host:port` of the gRPC endpoint (the service's `engine.runtime.url`)."""
        return f"127.0.0.1:{self.grpc_port}"

    def stub(self) -> pb_grpc.GRPCInferenceServiceStub:
        """A v2 gRPC stub on a new channel (model control, readiness)."""
        return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(self.grpc_target))


def _ready(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            return bool(stub.ServerReady(pb.ServerReadyRequest(), timeout=1.0).ready)
        except grpc.RpcError:
            return False


def triton_process(
    repository: Path,
    workdir: Path,
    *,
    install: TritonInstall | None = None,
    ports: tuple[int, int, int] | None = None,
    extra_args: Sequence[str] = (),
) -> tuple[ManagedProcess, tuple[int, int, int]]:
    """A `ManagedProcess` for the server on `repository` (not started) and its ports
    (gRPC, HTTP, metrics)."""
    install = install or find_triton()
    grpc_port, http_port, metrics_port = ports or tuple(free_tcp_port() for _ in range(3))
    backends = prepare_backends(install, workdir / "backends")
    argv = [
        str(install.binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
        "--exit-timeout-secs=10",
        # The repository is per run: a shared-memory name unique to it avoids clashes.
        f"--backend-config=python,shm-region-prefix-name=triton_{grpc_port}_",
        *extra_args,
    ]
    target = f"127.0.0.1:{grpc_port}"
    process = ManagedProcess(
        "tritonserver", argv, ready_check=lambda: _ready(target), env=server_env(install)
    )
    return process, (grpc_port, http_port, metrics_port)


@contextmanager
def running_triton(
    repository: Path,
    workdir: Path,
    *,
    ready_timeout_s: float = 90.0,
    extra_args: Sequence[str] = (),
) -> Iterator[RunningTriton]:
    """Start Triton on `repository` (every model loaded) and stop it afterwards."""
    process, (grpc_port, http_port, metrics_port) = triton_process(
        repository, workdir, extra_args=extra_args
    )
    process.start(ready_timeout_s=ready_timeout_s)
    try:
        yield RunningTriton(process, grpc_port, http_port, metrics_port)
    finally:
        process.stop(term_timeout_s=15.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run Triton on a model repository until SIGINT / SIGTERM."""
    from configkit.signals import stop_on_signals

    parser = argparse.ArgumentParser(
        prog="python -m testbed.triton",
        description="Triton (PyTriton's build, .venv-triton) on a model repository, all loaded.",
    )
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)
    try:
        install = find_triton()
    except TritonUnavailableError as exc:
        print(exc)
        return 1
    with tempfile.TemporaryDirectory(prefix="triton-") as workdir:
        process, _ = triton_process(
            args.repository.resolve(),
            Path(workdir),
            install=install,
            ports=(args.grpc_port, args.http_port, args.metrics_port),
        )
        process.start(ready_timeout_s=120)
        print(f"Triton ready: gRPC 127.0.0.1:{args.grpc_port}, HTTP {args.http_port}", flush=True)
        with stop_on_signals(threading.Event(), what="stopping Triton") as stop:
            while not stop.wait(1.0) and process.running:
                pass
        process.stop(term_timeout_s=15.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
