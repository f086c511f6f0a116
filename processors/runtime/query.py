"""Run queries over HTTP, served from the committed store of the partition that owns the run.

    GET /runs/{run_id}                  200 {run_id, partition, restoring, status, sequence,
                                        definition_id, revision, accepted_ms, updated_ms, output,
                                        failure, cancel_reason, usage, steps: {key: {status, attempt}}}
    GET /runs/{run_id}?view=state       the same plus `state`: the engine's whole run state
                                        (input, pinned definitions, every step's input and output)
    GET /runs/{run_id}/events?since=N&limit=M
                                        200 {run_id, partition, restoring, events: [...], next_since}:
                                        events with sequence > N, at most M (1-1000, default 1000)
                                        and at most `query_page_bytes` of JSON (one event at least);
                                        `next_since` is the `since` of the next page, null at the end
    GET /health                         200 {ready, stalled_s, owned, restoring}; 503 while the loop
                                        is stalled (a liveness probe's cue to restart it)

Run ids with `/` (child runs) should be percent-encoded (`%2F`); unencoded ones work too
unless they end in `/events`. Only committed data is read (the store, never the open
transaction's overlay), a chunk of at most 64 events / 256 KiB at a time under the store's
lock (the lock the loop's commit takes), so a long log never holds the commit up for longer
than one chunk; decoding and encoding happen outside it. A run in a partition this instance
does not own gets `421 Misdirected Request` with the partition and, when the consumer group
says so, the owning member (its client id `<prefix>-processor-<instance_id>`, and host). A
run the owner has never seen is `404`; a bad id or parameter is `400` saying which and why.

The server (processors/http_endpoint.py) listens on `http_host` (127.0.0.1 by default) and
requires `Authorization: Bearer <query_token>` on /runs when a token is configured; it will not
listen beyond loopback without one.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import orjson

from processors.engine import run_status
from processors.engine.ids import control_character
from processors.http_endpoint import CannotServe, HttpEndpoint, Reply, Request, error_body, is_loopback
from processors.kafka.partitioning import partition_for
from processors.kafka.watchdog import Watchdog
from processors.runtime.assignment import Partitions
from processors.runtime.history import run_events_before
from processors.runtime.store import StoreClosed
from schemas import Codec
from topology.consumers import group_members

log = logging.getLogger("runfold.query")
_OWNER_TTL_S = 5.0
MAX_RUN_ID_BYTES = 65_535  # the longest the store's keys can hold (a 2-byte length)
MAX_SINCE = 2**63 - 2  # sequences are 8-byte keys; since + 1 must fit
MAX_LIMIT = 1000
CHUNK_EVENTS = 64
CHUNK_BYTES = 256 * 1024
_DEFAULTS: dict[str, Any] = {
    "query_page_bytes": 1 << 20,
    "http_timeout_s": 10.0,
    "http_max_connections": 64,
    "http_threads": 4,
    "query_token": None,
    "query_token_file": None,
    "finished_retention_ms": 0,
    "instance_id": "",
}
_PARAMS = {"run": frozenset({"view"}), "events": frozenset({"since", "limit"})}


class BadRequest(ValueError):
    """A request this endpoint cannot answer as asked: 400 with this message."""


def load_token(settings: Any) -> bytes | None:
    """The query token from the settings (`query_token`, else the first line of
    `query_token_file`); None when neither is set. Never logged."""
    token = _setting(settings, "query_token")
    if token is not None:
        value = token.get_secret_value() if hasattr(token, "get_secret_value") else str(token)
    else:
        path = _setting(settings, "query_token_file")
        if path is None:
            return None
        try:
            mode = os.stat(path).st_mode
            with open(path, encoding="utf-8") as f:
                value = f.readline()
        except (OSError, UnicodeDecodeError) as e:
            raise CannotServe(
                f"cannot read the query token file {path}: {getattr(e, 'strerror', None) or e}"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "the query token file %s can be read by other users of this machine (chmod 600 it)", path
            )
    value = value.strip()
    if not value:
        raise CannotServe("the query token is empty (RUNFOLD_QUERY_TOKEN / RUNFOLD_QUERY_TOKEN_FILE)")
    return value.encode()


def _setting(settings: Any, name: str) -> Any:
    return getattr(settings, name, _DEFAULTS[name])


class QuerySource(Protocol):
    """What the query server reads of the processor that runs it (runtime/loop.py)."""

    codec: Codec
    settings: Any
    partition_count: int
    ready: threading.Event
    watchdog: Watchdog | None

    @property
    def partitions(self) -> Partitions | None: ...


class QueryServer:
    def __init__(self, processor: QuerySource, host: str, port: int) -> None:
        self.processor = processor
        settings = getattr(processor, "settings", None)
        self._decode_event = processor.codec.decoder("run_events")
        self._page_bytes = int(_setting(settings, "query_page_bytes"))
        self._owners: dict[int, dict[str, str]] = {}
        self._owners_at = 0.0
        self._owners_lock = threading.Lock()
        token = load_token(settings)
        if token is None and not is_loopback(host):
            raise CannotServe(
                f"will not serve run queries on {host}:{port} without a token: anyone who reaches "
                "that address could read every run (set RUNFOLD_QUERY_TOKEN or "
                "RUNFOLD_QUERY_TOKEN_FILE, or listen on 127.0.0.1 with RUNFOLD_HTTP_HOST)"
            )
        self._server = HttpEndpoint(
            "run queries",
            "query port",
            host,
            port,
            self._reply,
            token=token,
            open_paths=("/health",),
            threads=int(_setting(settings, "http_threads")),
            max_connections=int(_setting(settings, "http_max_connections")),
            timeout_s=float(_setting(settings, "http_timeout_s")),
        )
        self.port = self._server.port
        if token is None:
            log.info(
                "run queries on %s:%d need no token: every user of this machine can read runs there "
                "(set RUNFOLD_QUERY_TOKEN_FILE on a shared host)",
                host,
                self.port,
            )

    def close(self) -> None:
        self._server.close()

    def _reply(self, request: Request) -> Reply:
        status, body = self.answer(request.path, request.query)
        return Reply(status, body)

    # ---- answers ---------------------------------------------------------------------------
    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes]:
        """(status, JSON body) for a GET of `path` (still percent-encoded) with `query`."""
        try:
            return self._answer(path, query)
        except BadRequest as e:
            return 400, error_body("bad_request", str(e))

    def _answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes]:
        parts = [p for p in path.split("/") if p]
        if parts == ["health"]:
            return self._health()
        if len(parts) < 2 or parts[0] != "runs":
            return 404, error_body(
                "no_route", "no such route; try /runs/<run_id>, /runs/<run_id>/events or /health"
            )
        events = parts[-1] == "events" and len(parts) >= 3
        params = _params(query, _PARAMS["events" if events else "run"])
        run_id = _run_id("/".join(parts[1:-1] if events else parts[1:]))
        since = _integer(params, "since", 0, 0, MAX_SINCE, "the last sequence already read") if events else 0
        limit = _integer(params, "limit", MAX_LIMIT, 1, MAX_LIMIT, "events per page") if events else 0
        view = params.get("view", "summary")
        if view not in ("summary", "state"):
            raise BadRequest("view must be summary or state")
        partitions = self.processor.partition_count
        if not partitions:
            return 503, error_body("starting", "the processor has not loaded its topology yet")
        p = partition_for(run_id, partitions)
        owner_parts = self.processor.partitions
        store = owner_parts.store(p) if owner_parts is not None else None
        if store is None:
            body = {
                "error": "not_owner",
                "run_id": run_id,
                "partition": p,
                "message": f"partition {p} is not owned by this processor",
                "owner": self._owner(p),
                "instance_id": _setting(self.processor.settings, "instance_id"),
            }
            return 421, orjson.dumps(body)
        restoring = owner_parts is not None and p in owner_parts.restoring
        try:
            if events:
                return self._events(store, run_id, p, restoring, since, limit)
            raw = store.state_bytes(run_id)
        except StoreClosed:
            return 503, error_body("rebalancing", f"partition {p} is being handed over; retry", partition=p)
        if raw is None:
            return 404, self._not_found(run_id, p)
        return 200, self._run(run_id, p, restoring, raw, view == "state")

    def _run(self, run_id: str, p: int, restoring: bool, raw: bytes, with_state: bool) -> bytes:
        state = orjson.loads(raw)
        body: dict[str, Any] = {
            "run_id": run_id,
            "partition": p,
            "restoring": restoring,
            "status": run_status(state),
            "sequence": state.get("sequence"),
        }
        for key in (
            "definition_id",
            "revision",
            "accepted_ms",
            "updated_ms",
            "output",
            "failure",
            "cancel_reason",
            "usage",
        ):
            body[key] = state.get(key)
        body["steps"] = {
            key: {"status": step.get("status"), "attempt": step.get("attempt")}
            for key, step in (state.get("steps") or {}).items()
        }
        if with_state:
            if len(raw) > self._page_bytes:
                raise BadRequest(
                    f"the run state is {len(raw)} bytes, more than this endpoint answers "
                    f"(query_page_bytes {self._page_bytes}); read it from the run-state topic"
                )
            body["state"] = orjson.Fragment(raw)
        return orjson.dumps(body)

    def _events(
        self, store: Any, run_id: str, p: int, restoring: bool, since: int, limit: int
    ) -> tuple[int, bytes]:
        parts: list[bytes] = []
        size, last, more = 0, since, False
        older = self._events_not_stored(store, run_id, p, since, limit)
        if older:
            for sequence, raw in older:
                encoded = orjson.dumps(self._decode_event(raw))
                if parts and size + len(encoded) > self._page_bytes:
                    break
                parts.append(encoded)
                size += len(encoded) + 1
                last = sequence
            more = True  # the rest: those the store holds, or more of the topic's
        while len(parts) < limit and not more:
            chunk = store.events_chunk(run_id, last, min(CHUNK_EVENTS, limit - len(parts)), CHUNK_BYTES)
            if not chunk:
                break
            for sequence, raw in chunk:  # decoded outside the store's lock
                encoded = orjson.dumps(self._decode_event(raw))
                if parts and size + len(encoded) > self._page_bytes:
                    more = True
                    break
                parts.append(encoded)
                size += len(encoded) + 1
                last = sequence
        if not parts and since == 0 and store.state_bytes(run_id) is None:
            return 404, self._not_found(run_id, p)
        if not more and len(parts) >= limit:
            more = bool(store.events_chunk(run_id, last, 1, 1))
        return 200, orjson.dumps(
            {
                "run_id": run_id,
                "partition": p,
                "restoring": restoring,
                "events": [orjson.Fragment(b) for b in parts],
                "next_since": last if more else None,
            }
        )

    def _events_not_stored(
        self, store: Any, run_id: str, p: int, since: int, limit: int
    ) -> list[tuple[int, bytes]]:
        """Events after `since` that a store seeded from run-state does not hold (those
        before its run-events offset E0), read from the topic (runtime/history.py)."""
        events_from = getattr(store, "events_from", None)
        if events_from is None:
            return []
        raw = store.state_bytes(run_id)
        if raw is None:
            return []
        state = orjson.loads(raw)
        first = store.events_chunk(run_id, since, 1, 1)
        if state["sequence"] <= since or (first and first[0][0] == since + 1):
            return []
        settings = self.processor.settings
        return run_events_before(
            settings.side_consumer_config("history"),
            settings.topics.run_events,
            p,
            run_id,
            since,
            events_from,
            int(state["accepted_ms"]),
            min(limit, CHUNK_EVENTS * 16),
            self._decode_event,
        )

    def _not_found(self, run_id: str, p: int) -> bytes:
        retention = _setting(self.processor.settings, "finished_retention_ms")
        span = f"{retention / 3_600_000:g} h" if retention >= 3_600_000 else f"{retention / 1000:g} s"
        kept = f"; finished runs are kept {span} after they end" if retention else ""
        return error_body(
            "not_found",
            f"run {run_id!r} not found in partition {p}{kept} (the run-events topic "
            "keeps every run's record)",
            partition=p,
        )

    def _health(self) -> tuple[int, bytes]:
        """503 while the loop is stalled (see `Watchdog.stalled_s`), else 200."""
        parts = self.processor.partitions
        dog = self.processor.watchdog
        stalled_s = dog.stalled_s() if dog is not None else 0.0
        return 503 if stalled_s else 200, orjson.dumps(
            {
                "ready": self.processor.ready.is_set(),
                "stalled_s": round(stalled_s, 1),
                "instance_id": _setting(self.processor.settings, "instance_id"),
                "owned": parts.owned() if parts is not None else [],
                "restoring": sorted(parts.restoring) if parts is not None else [],
            }
        )

    def _owner(self, partition: int) -> dict[str, str] | None:
        """The group member that owns `partition` (from the group description, cached)."""
        with self._owners_lock:
            if time.monotonic() - self._owners_at > _OWNER_TTL_S:
                self._owners = self._describe_owners()
                self._owners_at = time.monotonic()
            return self._owners.get(partition)

    def _describe_owners(self) -> dict[int, dict[str, str]]:
        settings = self.processor.settings
        try:  # in a child process: DescribeGroups aborts the process that sends it (topology/isolated.py)
            members = group_members(settings, settings.group, timeout_s=5)
        except Exception:
            return {}
        prefix = f"{settings.topic_prefix}-processor-"
        out: dict[int, dict[str, str]] = {}
        for member in members:
            client_id = member["client_id"]
            info = {
                "client_id": client_id,
                "host": member["host"].lstrip("/"),
                "instance_id": client_id[len(prefix) :] if client_id.startswith(prefix) else "",
            }
            for topic, partition in member["partitions"]:
                if topic == settings.topics.commands:
                    out[partition] = info
        return out


def _params(query: dict[str, list[str]], allowed: frozenset[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, values in query.items():
        if name not in allowed:
            shown = name if len(name) <= 40 and name.isprintable() else "(unprintable or long)"
            takes = ", ".join(sorted(allowed))
            raise BadRequest(f"unknown parameter {shown!r}: this route takes {takes}")
        if len(values) != 1:
            raise BadRequest(f"parameter {name!r} is given {len(values)} times")
        out[name] = values[0]
    return out


def _integer(params: dict[str, str], name: str, default: int, low: int, high: int, meaning: str) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or not low <= int(text) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high} ({meaning})")
    return int(text)


def _run_id(encoded: str) -> str:
    if len(encoded) > 3 * MAX_RUN_ID_BYTES:
        raise BadRequest(
            f"the run id is longer than {MAX_RUN_ID_BYTES} bytes, the longest this endpoint looks up"
        )
    raw = unquote_to_bytes(encoded)
    if len(raw) > MAX_RUN_ID_BYTES:
        raise BadRequest(
            f"the run id is {len(raw)} bytes, longer than the {MAX_RUN_ID_BYTES} this endpoint looks up"
        )
    try:
        run_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the run id is not UTF-8 once percent-decoded") from None
    if not run_id:
        raise BadRequest("the run id is empty")
    if control_character(run_id) is not None:
        raise BadRequest("the run id holds a control character (run ids are printable text)")
    return run_id
