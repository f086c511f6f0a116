"""`RunClient`: start, cancel, signal and resume runs; read their state and events.

    from processors.client import RunClient
    with RunClient() as client:                      # settings from env / RUNFOLD_CONFIG
        client.register("examples/definitions/one-step.yaml")
        run_id = client.start("one-step", {"text": "hi"})
        outcome = client.wait(run_id, timeout=30)    # RunView(status="succeeded", output=...)

Writes go to `<p>.commands` (keyed by run id) and `<p>.definitions` (keyed
`id@revision`) through an idempotent producer; each call waits for the broker's
acknowledgement, so a returned call is durable. Reads are `read_committed`
point reads of the one partition that holds the run (commands, run-events and
run-state are co-partitioned; the partition is computed with the producers'
murmur2 partitioner), or the owning processor's HTTP query endpoint when one is
configured (`query_url=` or `RUNFOLD_QUERY_URL`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, Producer

from processors.client.answers import CommandAnswer, ProcessedOffsets, Sent, await_answer, rejected_start
from processors.client.definitions import DefinitionRegistry
from processors.client.errors import (
    BrokerUnavailable,
    InvalidArgument,
    RunfoldError,
    RunfoldTimeout,
    RunNotFound,
    RunRejected,
)
from processors.client.reader import KAFKA_LOGGER, PartitionReader, broker_error
from processors.client.snapshots import SnapshotIndex
from processors.client.views import RunView, view_from_query, view_from_snapshot
from processors.engine.ids import command_key, control_character
from processors.engine.vocabulary import KEY_CHARS, TERMINAL_EVENTS, CommandBody, start_run_body
from processors.kafka.fetch import connect_first
from processors.kafka.partitioning import partition_for
from processors.kafka.records import coordinates
from schemas import Codec
from schemas.run_state import purged_status
from topology.catalog import topic_names
from topology.settings import KafkaSettings, load_settings, producer_config

# Look a little further back than a snapshot's timestamp when following events after it:
# snapshot and events are written by the same processor, but clocks of different hosts
# (after a rebalance) may disagree a little.
_CLOCK_SLACK_MS = 5 * 60_000
_STUCK_GRACE_S = 5.0
# How long start/cancel/signal/resume wait for the processor's answer by default (seconds);
# RUNFOLD_ANSWER_TIMEOUT_S or `answer_timeout_s=` changes it, 0 sends without waiting.
DEFAULT_ANSWER_TIMEOUT_S = 5.0


def _answer_timeout_from_env() -> float:
    raw = os.environ.get("RUNFOLD_ANSWER_TIMEOUT_S")
    if not raw:
        return DEFAULT_ANSWER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"RUNFOLD_ANSWER_TIMEOUT_S must be a number of seconds, got {raw!r}") from None
    if not value >= 0:
        raise InvalidArgument(f"RUNFOLD_ANSWER_TIMEOUT_S must be >= 0, got {raw!r}")
    return value


def _dispose(producer: Producer) -> None:
    """Drop a producer on a daemon thread: destroying one with a request stuck on a lost broker
    can block (librdkafka#5456), and the caller must not wait for that."""
    holder = [producer]
    threading.Thread(target=holder.clear, name="runfold-client-dispose", daemon=True).start()


def _query_token_from_env() -> str | None:
    token = os.environ.get("RUNFOLD_QUERY_TOKEN")
    path = os.environ.get("RUNFOLD_QUERY_TOKEN_FILE")
    if not token and path:
        with open(path, encoding="utf-8") as f:
            token = f.readline()
    return token.strip() if token and token.strip() else None


def _check_run_id(run_id: str) -> None:
    if not run_id or not isinstance(run_id, str):
        raise InvalidArgument("run_id must be a non-empty string")
    bad = control_character(run_id)
    if bad is not None:
        raise InvalidArgument(f"run_id must be printable text; it contains the control character {bad!r}")


def _answer_content(body: CommandBody) -> dict[str, Any]:
    """What of a command its answering event repeats (answers.same_content)."""
    b: Any = body
    if b["type"] == "StartRun":
        return {"definition_id": b["definition_id"], "revision": b.get("revision"), "input": b.get("input")}
    if b["type"] == "SignalRun":
        return {"payload": b.get("payload")}
    if b["type"] == "ResumeRun":
        return {"reason": b.get("reason")}
    return {}


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:20]}"


class RunClient:
    """The Python SDK of runfold. Thread-compatible (one per thread), cheap to keep open."""

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        timeout_s: float = 15.0,
        query_url: str | None = None,
        codec: Codec | None = None,
        query_token: str | None = None,
        answer_timeout_s: float | None = None,
        processor_group: str | None = None,
    ) -> None:
        self.settings = settings or load_settings()
        # start/cancel/signal/resume wait this long for the processor's answer (0: do not wait)
        self.answer_timeout_s = _answer_timeout_from_env() if answer_timeout_s is None else answer_timeout_s
        # whose committed offsets say a command was taken (the processor's group id, RUNFOLD_GROUP_ID)
        self.processor_group = (
            processor_group or os.environ.get("RUNFOLD_GROUP_ID") or f"{self.settings.topic_prefix}-processor"
        )
        self._offsets: ProcessedOffsets | None = None
        self.last_answer: CommandAnswer | None = None  # the answer to the last command waited for
        self.last_record_id: str | None = None  # the record id of the last command sent
        self.topics = topic_names(self.settings)
        self.timeout_s = timeout_s
        self.query_url = (query_url or os.environ.get("RUNFOLD_QUERY_URL") or "").rstrip("/") or None
        # the query endpoint's bearer token: RUNFOLD_QUERY_TOKEN, or the first line of RUNFOLD_QUERY_TOKEN_FILE
        self._query_token = query_token or _query_token_from_env()
        self._codec = codec or Codec.default()
        self._enc_command = self._codec.encoder("commands")
        self._dec_event = self._codec.decoder("run_events")
        self._dec_snapshot = self._codec.decoder("run_state")
        self._producer: Producer | None = None
        self._broker_errors: list[KafkaError] = []
        self._reader: PartitionReader | None = None
        self._snapshots: SnapshotIndex | None = None
        self._started_at: dict[str, int] = {}  # run id -> run-events offset before its StartRun
        self.definitions = DefinitionRegistry(self)

    # ---- plumbing ----------------------------------------------------------------------------
    def __enter__(self) -> RunClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            self._snapshots = None
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None

    @property
    def codec(self) -> Codec:
        return self._codec

    @property
    def reader(self) -> PartitionReader:
        if self._reader is None:
            self._reader = PartitionReader(self.settings, timeout_s=self.timeout_s)
        return self._reader

    def _get_producer(self) -> Producer:
        if self._producer is None:
            cfg = producer_config(self.settings, linger_ms=0, message_timeout_ms=int(self.timeout_s * 1000))
            cfg["error_cb"] = self._broker_errors.append
            cfg["logger"] = KAFKA_LOGGER
            self._producer = Producer(cfg)
            connect_first(self._producer, self.topics.commands)
        return self._producer

    def produce(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        """Produce one record and wait for its acknowledgement; returns (partition, offset)."""
        producer = self._get_producer()
        result: list[Any] = []
        self._broker_errors.clear()
        try:
            producer.produce(
                topic, value, key.encode(), on_delivery=lambda err, msg: result.append((err, msg))
            )
        except KafkaException as e:
            raise broker_error(e, f"producing to {topic}", self.settings.bootstrap_servers) from None
        except BufferError:
            producer.flush(self.timeout_s)
            producer.produce(
                topic, value, key.encode(), on_delivery=lambda err, msg: result.append((err, msg))
            )
        # librdkafka times the record out itself (message.timeout.ms is our timeout), checking
        # about once a second: only well past that is a missing report a stuck producer.
        deadline = time.monotonic() + self.timeout_s + _STUCK_GRACE_S
        while not result and time.monotonic() < deadline:
            producer.poll(0.05)
        if not result:
            # No report at all, not even the timeout: this producer is stuck (a stale broker
            # handle), and every later send on it would wait in vain as well.
            self._producer = None
            _dispose(producer)
            raise RunfoldTimeout(
                f"no acknowledgement from the broker for {topic} within {self.timeout_s:.0f}s "
                "(the record may still be written; the next call uses a new connection)"
            )
        err, msg = result[0]
        if err is not None:
            if err.code() == KafkaError._MSG_TIMED_OUT:
                # Start the next call afresh: a producer whose record timed out may hold a stale
                # broker or coordinator handle that a new one would not.
                self._producer = None
                _dispose(producer)
                if any(
                    e.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
                    for e in self._broker_errors
                ):
                    raise BrokerUnavailable(
                        f"no Kafka broker answered at {self.settings.bootstrap_servers} "
                        f"while producing to {topic}"
                    )
                raise RunfoldTimeout(
                    f"producing to {topic} timed out after {self.timeout_s:.0f}s ({err.str()})"
                )
            raise broker_error(err, f"producing to {topic}", self.settings.bootstrap_servers)
        return msg.partition(), msg.offset()

    def partition_of(self, run_id: str) -> int:
        return partition_for(run_id, self.reader.partition_count(self.topics.run_events))

    def _command(
        self,
        run_id: str,
        body: CommandBody,
        answer_timeout: float | None,
        events_start: int | None = None,
    ) -> CommandAnswer | None:
        """Send one command; unless the wait is 0, wait for the processor's answer to it."""
        _check_run_id(run_id)
        key = body.get("idempotency_key")
        if key is not None and (not isinstance(key, str) or not 0 < len(key) <= KEY_CHARS):
            raise InvalidArgument(f"idempotency_key must be a string of 1 to {KEY_CHARS} characters")
        wait = self.answer_timeout_s if answer_timeout is None else answer_timeout
        self.last_answer = None
        events_partition = self.partition_of(run_id)
        if wait > 0 and events_start is None:
            events_start = self.reader.end_offset(self.topics.run_events, events_partition)
        record_id = uuid.uuid4().hex
        self.last_record_id = record_id
        msg = {"run_id": run_id, "record_id": record_id, "ts_ms": int(time.time() * 1000), **body}
        # the key the processor applies it under: the given one, else this send's record id
        applied_key = command_key(key, record_id)[0] if body["type"] != "StartRun" else None
        partition, offset = self.produce(self.topics.commands, run_id, self._enc_command(msg))
        if wait <= 0:
            return None
        assert events_start is not None
        sent = Sent(
            run_id=run_id,
            command=body["type"],
            record_id=record_id,
            commands_topic=self.topics.commands,
            commands_partition=partition,
            commands_offset=offset,
            events_topic=self.topics.run_events,
            events_partition=events_partition,
            events_start=events_start,
            signal=body["signal"] if body["type"] == "SignalRun" else None,
            key=applied_key,
            content=_answer_content(body),
        )
        if self._offsets is None:
            self._offsets = ProcessedOffsets(self.settings, self.processor_group, self.timeout_s)
        answer = await_answer(
            sent, self.reader, self._dec_event, self._offsets, wait, self.settings.topic_prefix
        )
        self.last_answer = answer
        return answer

    # ---- commands ----------------------------------------------------------------------------
    def register(self, source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
        """Validate a definition (file path, YAML/JSON text or dict) and publish it.

        Returns the DefinitionRecord. Raises `InvalidDefinition` (naming the source, the
        path inside the definition and the rule) or `DefinitionConflict`."""
        return self.definitions.register(source)

    def start(
        self,
        definition_id: str,
        input: Any = None,
        run_id: str | None = None,
        revision: int | None = None,
        labels: Mapping[str, str] | None = None,
        budgets: Mapping[str, int] | None = None,
        answer_timeout: float | None = None,
    ) -> str:
        """Send StartRun, wait for the processor's answer, and return the run id (yours, or a
        generated one).

        Starting the same run id again is idempotent (answered "unchanged"; a conflicting one is
        rejected). Raises `CommandRejected` (`.code`, `.reason`) when the processor rejects it,
        `AnswerTimeout` when no answer came within `answer_timeout` seconds (default: the
        client's `answer_timeout_s`; 0 does not wait), `UnknownDefinition` if the definition
        (revision) is not registered, `BrokerUnavailable`, `RunfoldTimeout`."""
        if run_id is not None:  # refused before anything is read or sent, as every command's
            _check_run_id(run_id)
        self.definitions.require(definition_id, revision)
        run_id = new_run_id() if run_id is None else run_id
        partition = self.partition_of(run_id)
        # Where this run's events will start (at the latest): lets wait() skip older history.
        self._started_at[run_id] = self.reader.end_offset(self.topics.run_events, partition)
        body = start_run_body(definition_id, input, revision, labels, budgets)
        self._command(run_id, body, answer_timeout, events_start=self._started_at[run_id])
        return run_id

    def cancel(
        self,
        run_id: str,
        reason: str = "",
        answer_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer | None:
        """Ask the processor to cancel the run (idempotent; cascades to steps and child runs).

        Returns the processor's answer (None when `answer_timeout=0`); raises `CommandRejected`
        (a finished run: Conflict; an unknown one: NotFound) or `AnswerTimeout`.
        `idempotency_key`: the run applies each key once and answers a repeat with the first
        answer, so a retry with the same key after a timeout is safe (None: this call's record
        id, `client.last_record_id`, is the key)."""
        body: CommandBody = {"type": "CancelRun", "reason": reason, "idempotency_key": idempotency_key}
        return self._command(run_id, body, answer_timeout)

    def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        answer_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer | None:
        """Deliver a named signal (e.g. an approval) to the run's wait nodes; answered like
        `cancel`, and as safe to retry with the same `idempotency_key`."""
        if not name:
            raise InvalidArgument("signal name must be a non-empty string")
        body: CommandBody = {
            "type": "SignalRun",
            "signal": name,
            "payload": payload,
            "idempotency_key": idempotency_key,
        }
        return self._command(run_id, body, answer_timeout)

    def resume(
        self,
        run_id: str,
        budgets: Mapping[str, int] | None = None,
        reason: str = "",
        answer_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer | None:
        """Continue a failed, paused or budget-blocked run, optionally with new limits; answered
        like `cancel` (a running run: Conflict), and as safe to retry with the same
        `idempotency_key`."""
        body: CommandBody = {
            "type": "ResumeRun",
            "budgets": dict(budgets) if budgets else None,
            "reason": reason,
            "idempotency_key": idempotency_key,
        }
        return self._command(run_id, body, answer_timeout)

    # ---- reads -------------------------------------------------------------------------------
    def snapshot(self, run_id: str) -> tuple[dict[str, Any], Message] | None:
        """The latest committed run-state snapshot of the run and its Kafka record, if any."""
        if self._snapshots is None:
            self._snapshots = SnapshotIndex(self.reader, self.topics.run_state, self.timeout_s)
        partition = partition_for(run_id, self.reader.partition_count(self.topics.run_state))
        found = self._snapshots.latest(run_id, partition)
        if found is None:
            return None
        snapshot = self._dec_snapshot(found.value())
        if purged_status(snapshot) is not None:  # a purged run's marker: no run, as a tombstone
            return None
        return snapshot, found

    def get(self, run_id: str) -> RunView:
        """The run's current state: from the owning processor when a query URL is known, else
        from its latest run-state snapshot. Raises `RunNotFound`."""
        if self.query_url:
            view = self._query(run_id)
            if view is not None:
                return view
        snap = self.snapshot(run_id)
        if snap is None:
            topic = self.topics.run_events
            rejected = rejected_start(self.reader, self._dec_event, topic, self.partition_of(run_id), run_id)
            if rejected is not None:
                return RunView(
                    run_id=run_id,
                    status="rejected",
                    sequence=0,
                    definition_id=rejected.get("definition_id"),
                    revision=rejected.get("revision"),
                    failure={"code": rejected["code"], "message": rejected["reason"]},
                    ts_ms=rejected["ts_ms"],
                    source="events",
                )
            raise RunNotFound(
                f"run {run_id!r} not found (no run-state snapshot under prefix "
                f"{self.settings.topic_prefix!r})"
            )
        return view_from_snapshot(snap[0])

    def _query(self, run_id: str) -> RunView | None:
        """Ask the configured processor; when it answers 421 (another instance owns the run's
        partition) ask the owner's host on the same port once. None: use the snapshot."""
        import httpx

        assert self.query_url is not None
        url = self.query_url
        for _ in range(2):
            try:
                headers = {"Authorization": f"Bearer {self._query_token}"} if self._query_token else {}
                # ?view=state: the engine's whole record, as a snapshot holds it (RunView.state either way)
                resp = httpx.get(
                    f"{url}/runs/{quote(run_id, safe='')}",
                    params={"view": "state"},
                    headers=headers,
                    timeout=self.timeout_s,
                )
            except httpx.HTTPError:
                return None  # the owner may be restarting: the snapshot topic still answers
            if resp.status_code == 200:
                return view_from_query(run_id, resp.json())
            owner = (resp.json() or {}).get("owner") if resp.status_code == 421 else None
            host = (owner or {}).get("host")
            if not host:
                return None
            parsed = urlsplit(url)
            url = f"{parsed.scheme}://{host}:{parsed.port or 80}"
        return None

    def events(
        self, run_id: str, *, follow: bool = False, after_sequence: int = 0, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """The run's committed events in order (from its first, or after `after_sequence`).

        `follow=True` keeps reading until a terminal event (or `timeout` seconds: then
        `RunfoldTimeout`); otherwise it stops at the end of what is committed now."""
        yield from self._events(
            run_id, OFFSET_BEGINNING, follow=follow, after_sequence=after_sequence, timeout=timeout
        )

    def _events(
        self, run_id: str, start: int, *, follow: bool, after_sequence: int, timeout: float | None
    ) -> Iterator[dict[str, Any]]:
        topic = self.topics.run_events
        partition = self.partition_of(run_id)
        key = run_id.encode()
        deadline = None if timeout is None else time.monotonic() + timeout
        accepted = after_sequence > 0 or start != OFFSET_BEGINNING
        for msg in self.reader.read({(topic, partition): start}, follow=follow, deadline=deadline):
            if msg is None or msg.key() != key or msg.value() is None:
                continue
            ev = self._dec_event(msg.value())
            accepted = accepted or ev["type"] == "RunAccepted"
            if ev["sequence"] and ev["sequence"] <= after_sequence:
                continue
            yield ev
            if follow and ev["type"] in TERMINAL_EVENTS:
                return
            # a start rejected before any was accepted: no run exists, so nothing more will come
            if (
                follow
                and not accepted
                and ev["type"] == "RunRejected"
                and ev.get("command_type") == "StartRun"
            ):
                return

    def wait(self, run_id: str, timeout: float = 60.0) -> RunView:
        """Block until the run is terminal (succeeded, failed, cancelled); return its outcome.

        Raises `RunfoldTimeout`, or `RunRejected` when the run was never accepted."""
        deadline = time.monotonic() + timeout
        start = self._started_at.get(run_id)
        after = 0
        accepted = False
        definition: tuple[str | None, int | None] = (None, None)
        snap = self.snapshot(run_id)
        if snap is not None:
            snapshot, record = snap
            view = view_from_snapshot(snapshot)
            if view.terminal:
                return view
            accepted, after = True, snapshot["sequence"]
            definition = (snapshot["definition_id"], snapshot["revision"])
            if start is None:  # events after the snapshot were written after it: skip older history
                _, ts = record.timestamp()
                start = self.reader.offset_for_time(
                    self.topics.run_events, coordinates(record)[1], max(ts - _CLOCK_SLACK_MS, 0)
                )
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            for ev in self._events(
                run_id,
                OFFSET_BEGINNING if start is None else start,
                follow=True,
                after_sequence=after,
                timeout=remaining,
            ):
                kind = ev["type"]
                if kind == "RunAccepted":
                    accepted, definition = True, (ev["definition_id"], ev["revision"])
                elif kind == "RunRejected" and not accepted and ev.get("command_type") == "StartRun":
                    raise RunRejected(run_id, ev["code"], ev["reason"])
                if kind in TERMINAL_EVENTS:
                    return RunView.from_terminal_event(ev, *definition)
        except RunfoldTimeout:
            raise RunfoldTimeout(f"run {run_id!r} did not finish within {timeout:g}s") from None
        raise RunfoldError(f"event stream of run {run_id!r} ended without a terminal event")

    def wait_all(self, run_ids: list[str], timeout: float = 120.0) -> dict[str, RunView]:
        """Wait for many runs in one pass over their partitions' events (cheaper than one
        `wait` per run). A run rejected at start gets a view with status "rejected"."""
        deadline = time.monotonic() + timeout
        out: dict[str, RunView] = {}
        pending: dict[bytes, str] = {}
        definition: dict[str, tuple[str | None, int | None]] = {}
        starts: dict[tuple[str, int], int] = {}
        topic = self.topics.run_events
        for run_id in dict.fromkeys(run_ids):
            snap = self.snapshot(run_id)
            if snap is not None:
                view = view_from_snapshot(snap[0], with_state=False)
                if view.terminal:
                    out[run_id] = view
                    continue
                definition[run_id] = (view.definition_id, view.revision)
            pending[run_id.encode()] = run_id
            tp = (topic, self.partition_of(run_id))
            start = self._started_at.get(run_id, OFFSET_BEGINNING)
            starts[tp] = start if tp not in starts else min(starts[tp], start)
        if not pending:
            return out
        try:
            for msg in self.reader.read(starts, follow=True, deadline=deadline):
                if msg is None:
                    continue
                key, value = msg.key(), msg.value()
                if key is None or value is None:
                    continue
                pending_id = pending.get(key)
                if pending_id is None:
                    continue
                run_id = pending_id
                ev = self._dec_event(value)
                if ev["type"] == "RunAccepted":
                    definition[run_id] = (ev["definition_id"], ev["revision"])
                    continue
                if (
                    ev["type"] == "RunRejected"
                    and run_id not in definition
                    and ev.get("command_type") == "StartRun"
                ):
                    out[run_id] = RunView(
                        run_id=run_id,
                        status="rejected",
                        sequence=0,
                        ts_ms=ev["ts_ms"],
                        failure={"code": ev["code"], "message": ev["reason"]},
                        source="events",
                    )
                elif ev["type"] in TERMINAL_EVENTS:
                    out[run_id] = RunView.from_terminal_event(ev, *definition.get(run_id, (None, None)))
                else:
                    continue
                del pending[key]
                if not pending:
                    break
        except RunfoldTimeout:
            raise RunfoldTimeout(
                f"{len(pending)} of {len(run_ids)} runs did not finish within {timeout:g}s "
                f"(e.g. {next(iter(pending.values()))!r})"
            ) from None
        return out

    def runs(self) -> list[RunView]:
        """Every run with a snapshot (latest per run id), read from the compacted run-state topic."""
        latest: dict[bytes, Message] = {}
        deadline = time.monotonic() + self.timeout_s * 20
        for msg in self.reader.read_all(self.topics.run_state, deadline=deadline):
            key = msg.key()
            if key is None:
                continue
            if msg.value() is None:
                latest.pop(key, None)
            else:
                latest[key] = msg
        snapshots = (self._dec_snapshot(m.value()) for m in latest.values())
        # a purged run's marker (its id stays taken) is no run, as a tombstone was
        return [view_from_snapshot(s, with_state=False) for s in snapshots if purged_status(s) is None]
