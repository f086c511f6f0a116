"""Run queries over HTTP, served from the committed store of the partition that owns the run.

    GET /runs/{run_id}                  200 {run_id, partition, status, sequence, state}
    GET /runs/{run_id}/events?since=N   200 {run_id, partition, events: [...]}   (sequence > N)
    GET /health                         200 {ready, stalled_s, owned, restoring}; 503 while the loop
                                        is stalled (a liveness probe's cue to restart it)

Run ids with `/` (child runs) should be percent-encoded (`%2F`); unencoded ones work too
unless they end in `/events`. Only committed data is read (the store, never the open
transaction's overlay). A run in a partition this instance does not own gets
`421 Misdirected Request` with the partition and, when the consumer group says so, the
owning member (its client id `<prefix>-processor-<instance_id>`, and host): the caller
asks that instance, or reads `<p>.run-state` instead. A run the owner has never seen
is `404`. While the owning partition is still restoring the answer carries
`"restoring": true` (it may lag behind Kafka).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from confluent_kafka.admin import AdminClient

from processors.engine import run_status
from processors.metrics_endpoint import CannotServe
from processors.runtime.partitioning import partition_for
from processors.runtime.store import StoreClosed
from topology.settings import admin_config

if TYPE_CHECKING:
    from processors.runtime.loop import Processor

_OWNER_TTL_S = 5.0


class QueryServer:
    def __init__(self, processor: Processor, host: str, port: int) -> None:
        self.processor = processor
        self._decode_event = processor.codec.decoder("run_events")
        self._owners: dict[int, dict[str, str]] = {}
        self._owners_at = 0.0
        self._owners_lock = threading.Lock()
        self._admin: AdminClient | None = None
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as e:
            raise CannotServe("run queries", host, port, "query port", e) from e
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="runfold-query", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- answers ---------------------------------------------------------------------------
    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes]:
        parts = [p for p in path.split("/") if p]
        if parts == ["health"]:
            return self._health()
        if len(parts) < 2 or parts[0] != "runs":
            return 404, _err("no_route", f"no route for {path}; try /runs/<run_id> or /runs/<run_id>/events")
        events = parts[-1] == "events" and len(parts) >= 3
        run_id = unquote("/".join(parts[1:-1] if events else parts[1:]))
        partitions = self.processor.partition_count
        if not partitions:
            return 503, _err("starting", "the processor has not loaded its topology yet")
        p = partition_for(run_id, partitions)
        owner_parts = self.processor.partitions
        store = owner_parts.store(p) if owner_parts is not None else None
        if store is None:
            body = {"error": "not_owner", "run_id": run_id, "partition": p,
                    "message": f"partition {p} is not owned by this processor",
                    "owner": self._owner(p), "instance_id": self.processor.settings.instance_id}
            return 421, orjson.dumps(body)
        restoring = owner_parts is not None and p in owner_parts.restoring
        try:
            if events:
                since = int(query.get("since", ["0"])[0])
                limit = min(int(query.get("limit", ["1000"])[0]), 10_000)
                raws = store.events(run_id, since, limit)
                if not raws and store.state_bytes(run_id) is None:
                    return 404, self._not_found(run_id, p)
                return 200, orjson.dumps({"run_id": run_id, "partition": p, "restoring": restoring,
                                          "events": [self._decode_event(r) for r in raws]})
            raw = store.state_bytes(run_id)
        except StoreClosed:
            return 503, _err("rebalancing", f"partition {p} is being handed over; retry", partition=p)
        except ValueError as e:
            return 400, _err("bad_request", str(e))
        if raw is None:
            return 404, self._not_found(run_id, p)
        state = orjson.loads(raw)  # status and sequence only: no pinned bundle (the loop thread's cache)
        return 200, orjson.dumps({"run_id": run_id, "partition": p, "restoring": restoring,
                                  "status": run_status(state), "sequence": state.get("sequence"),
                                  "state": orjson.Fragment(raw)})

    def _not_found(self, run_id: str, p: int) -> bytes:
        retention = self.processor.settings.finished_retention_ms
        span = f"{retention / 3_600_000:g} h" if retention >= 3_600_000 else f"{retention / 1000:g} s"
        kept = f"; finished runs are kept {span} after they end" if retention else ""
        return _err("not_found", f"run {run_id!r} not found in partition {p}{kept} (the run-events topic keeps "
                    "every run's record)", partition=p)

    def _health(self) -> tuple[int, bytes]:
        """503 while the loop is stalled (see `Watchdog.stalled_s`), else 200."""
        parts = self.processor.partitions
        dog = self.processor.watchdog
        stalled_s = dog.stalled_s() if dog is not None else 0.0
        return 503 if stalled_s else 200, orjson.dumps({
            "ready": self.processor.ready.is_set(),
            "stalled_s": round(stalled_s, 1),
            "instance_id": self.processor.settings.instance_id,
            "owned": parts.owned() if parts is not None else [],
            "restoring": sorted(parts.restoring) if parts is not None else [],
        })

    def _owner(self, partition: int) -> dict[str, str] | None:
        """The group member that owns `partition` (from the group description, cached)."""
        with self._owners_lock:
            if time.monotonic() - self._owners_at > _OWNER_TTL_S:
                self._owners = self._describe_owners()
                self._owners_at = time.monotonic()
            return self._owners.get(partition)

    def _describe_owners(self) -> dict[int, dict[str, str]]:
        settings = self.processor.settings
        try:
            if self._admin is None:
                self._admin = AdminClient(admin_config(settings))
            group = self._admin.describe_consumer_groups([settings.group])[settings.group].result(timeout=5)
        except Exception:
            return {}
        prefix = f"{settings.topic_prefix}-processor-"
        out: dict[int, dict[str, str]] = {}
        for member in group.members:
            client_id = member.client_id or ""
            info = {"client_id": client_id, "host": (member.host or "").lstrip("/"),
                    "instance_id": client_id[len(prefix):] if client_id.startswith(prefix) else ""}
            for tp in member.assignment.topic_partitions if member.assignment else []:
                if tp.topic == settings.topics.commands:
                    out[tp.partition] = info
        return out


def _err(code: str, message: str, **extra: Any) -> bytes:
    return orjson.dumps({"error": code, "message": message, **extra})


class _Handler(BaseHTTPRequestHandler):
    server_ref: QueryServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            status, body = self.server_ref.answer(url.path, parse_qs(url.query))
        except Exception as e:  # a query must never take the server down
            status, body = 500, _err("internal", f"{type(e).__name__}: {e}")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one log line per lifecycle event, not per request
