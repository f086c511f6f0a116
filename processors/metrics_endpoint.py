"""One Prometheus registry served on its own /metrics port: the base of the processor's and
the executors' metrics (each process has its own registry, port and collectors).

The endpoint is an `HttpEndpoint` (http_endpoint.py: request deadline, bounded connections and
threads), listening on 127.0.0.1 unless the process's settings name another address."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)

from processors.http_endpoint import CannotServe, HttpEndpoint, Reply, Request, error_body

LOOPBACK = "127.0.0.1"

__all__ = ["LOOPBACK", "CannotServe", "MetricsEndpoint"]


class MetricsEndpoint:
    """A registry with the process's CPU, memory and GC collectors, and its /metrics endpoint."""

    registry: CollectorRegistry

    def _new_registry(self, registry: CollectorRegistry | None) -> CollectorRegistry:
        r = registry or CollectorRegistry()
        # The process's CPU, memory and GC next to the loop's own figures (same scrape).
        r.register(PROCESS_COLLECTOR)
        r.register(GC_COLLECTOR)
        self._server: HttpEndpoint | None = None
        return r

    def serve(self, port: int, addr: str = LOOPBACK) -> int:
        """Start the /metrics endpoint; returns the bound port (port 0 = ephemeral)."""
        self._server = HttpEndpoint(
            "/metrics",
            "metrics port",
            addr,
            port,
            self._answer,
            threads=2,
            max_connections=32,
            timeout_s=10.0,
        )
        return self._server.port

    def _answer(self, request: Request) -> Reply:
        if request.path not in ("/metrics", "/"):
            return Reply(404, error_body("no_route", "metrics are served at /metrics"))
        return Reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
