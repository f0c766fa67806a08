"""Prometheus pieces shared by the edge agent and the cloud service: buckets and the exporter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["BATCH_BUCKETS", "TIME_BUCKETS_S", "MetricsExporter", "serve_registry"]

logger = logging.getLogger(__name__)

TIME_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Latency buckets, 1 ms to 10 s."""

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Batch-size buckets (frames or images per batch)."""


@dataclass
class MetricsExporter:
    """A running `/metrics` HTTP endpoint; `close` stops it."""

    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving and release the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve_registry(registry: CollectorRegistry, host: str, port: int) -> MetricsExporter:
    """Serve `registry` at `http://host:port/metrics` from a daemon thread; port 0 picks one.

    Raises `OSError` when the address cannot be bound.
    """
    server, thread = start_http_server(port, addr=host, registry=registry)
    exporter = MetricsExporter(server, thread)
    logger.info("Prometheus metrics on http://%s:%s/metrics", host, exporter.port)
    return exporter
