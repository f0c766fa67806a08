"""Prometheus pieces shared by the edge agent and the cloud service: buckets, a declarer, the
exporter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = [
    "BATCH_BUCKETS",
    "TIME_BUCKETS_S",
    "MetricDeclarer",
    "MetricsExporter",
    "serve_registry",
]

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


class MetricDeclarer:
    """Declares metrics under one name prefix in one registry, one line each.

    `labels` are the label names; a histogram takes the latency buckets unless given others.
    """

    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        self.prefix = prefix
        self.registry = registry

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        """A counter `<prefix><name>_total`."""
        return Counter(self.prefix + name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        """A gauge `<prefix><name>`."""
        return Gauge(self.prefix + name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        *labels: str,
        buckets: Sequence[float] = TIME_BUCKETS_S,
    ) -> Histogram:
        """A histogram `<prefix><name>` with `buckets` (seconds unless told otherwise)."""
        return Histogram(
            self.prefix + name, documentation, labels, buckets=buckets, registry=self.registry
        )


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
