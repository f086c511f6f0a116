"""One Prometheus registry served on its own /metrics port: the base of the processor's and
the executors' metrics (each process has its own registry, port and collectors)."""

from __future__ import annotations

from typing import Any

from prometheus_client import GC_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, start_http_server


class CannotServe(Exception):
    """An HTTP endpoint of ours could not bind its port (in use, not permitted): the message
    says which endpoint, where, and what to do."""

    def __init__(self, what: str, host: str, port: int, option: str, error: OSError) -> None:
        super().__init__(f"cannot serve {what} on {host}:{port}: {error.strerror or error} (choose another "
                         f"{option}; 0 picks a free one)")


class MetricsEndpoint:
    """A registry with the process's CPU, memory and GC collectors, and its /metrics endpoint."""

    registry: CollectorRegistry

    def _new_registry(self, registry: CollectorRegistry | None) -> CollectorRegistry:
        r = registry or CollectorRegistry()
        # The process's CPU, memory and GC next to the loop's own figures (same scrape).
        r.register(PROCESS_COLLECTOR)
        r.register(GC_COLLECTOR)
        self._server: Any = None
        return r

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the /metrics endpoint; returns the bound port (port 0 = ephemeral)."""
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise CannotServe("/metrics", addr, port, "metrics port", e) from e
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
