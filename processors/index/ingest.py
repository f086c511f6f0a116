"""The run index's ingest: a read_committed consumer of `<p>.run-events` into the index database.

It assigns every partition itself (no consumer group: there is one writer per index file)
at the offsets the database holds, folds each batch of events into the runs' projections
(`projection.py`) and writes rows, events and the next offsets in one database transaction
(`store.SQLiteIndex.write`). Kafka's offsets are never committed: the database's are the
truth, so a crash between two batches re-reads exactly the batch that was not written.
Within that, an event whose sequence a run already holds is skipped ((run_id, sequence) is
the key of an event), so even a duplicate on the topic would not be counted twice.

If a write fails the ingest stops (raises): its in-memory projections hold events the
database does not, and the next start reloads them from the database. A broker lost meanwhile
is waited out (the consumer reconnects and fetches on from where it was). At start it waits up
to `connect_timeout_s` for a cluster that does not answer yet, then raises `IngestCannotStart`
(as for a run-events topic that is missing): ExitCode.CONFIG for the commands that run it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from processors.index.projection import RunRow, Skip, accept, apply
from processors.index.store import Batch, SQLiteIndex
from processors.kafka.exits import StopRequested
from processors.kafka.fetch import first_then_buffered
from processors.kafka.watermarks import Offsets
from processors.service_logs import ClusterUnreachable, await_cluster, kafka_log
from schemas import Codec, DecodeError
from topology.catalog import topic_names
from topology.settings import KafkaSettings, consumer_config

log = logging.getLogger("runfold.index")
CONNECT_TIMEOUT_S = 30.0  # the processor's wait for a cluster that does not answer at start
TOPIC_APPEARS_S = 30.0  # how long a run-events topic may take to appear (created a moment ago)


class IngestCannotStart(Exception):
    """No cluster answered within the connect timeout, or the run-events topic does not exist:
    the ingest cannot start as configured. The message says where it looked and what to do."""


@dataclass
class IngestReport:
    events: int = 0  # run events applied (a RunRejected included)
    records: int = 0  # records read
    batches: int = 0
    new_runs: int = 0
    rejected: int = 0
    undecodable: int = 0
    duplicates: int = 0  # events whose (run_id, sequence) the index already held
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        rate = self.events / self.seconds if self.seconds > 0 else 0.0
        return {
            "events": self.events,
            "records": self.records,
            "batches": self.batches,
            "new_runs": self.new_runs,
            "rejected": self.rejected,
            "undecodable": self.undecodable,
            "duplicates": self.duplicates,
            "skipped": dict(self.skipped),
            "seconds": round(self.seconds, 3),
            "events_per_s": round(rate, 1),
        }


class Indexer:
    """Keeps one index database up to date with one topic prefix's run events."""

    def __init__(
        self,
        settings: KafkaSettings,
        index: SQLiteIndex,
        *,
        store_events: bool = True,
        batch_max: int = 5_000,
        commit_interval_ms: int = 200,
        cache_runs: int = 20_000,
        codec: Codec | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.index = index
        self.topic = topic_names(settings).run_events
        self.store_events = store_events
        self.batch_max = batch_max
        self.commit_interval_s = commit_interval_ms / 1000
        self.cache_runs = cache_runs
        self.connect_timeout_s = connect_timeout_s
        # never the consumer's own offset queries: they abort while brokers fail over
        self._offsets = Offsets(settings, logger=kafka_log())
        self._said_at: dict[int, float] = {}  # when a consumer error may be logged again
        self._decode = (codec or Codec.default()).decoder("run_events")
        self._cache: OrderedDict[str, RunRow] = OrderedDict()
        self.report = IngestReport()
        self.caught_up = threading.Event()  # set once every partition reached its end
        index.bind_prefix(settings.topic_prefix)

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        *,
        follow: bool = True,
        stop: threading.Event | None = None,
        on_batch: Callable[[Batch], None] | None = None,
    ) -> IngestReport:
        """Ingest until `stop` is set (follow) or until every partition's end (not follow).
        IngestCannotStart when no cluster answers at start or the topic is missing; a stop
        request while it still waits for them returns the (empty) report."""
        started = time.monotonic()
        consumer = Consumer(
            {
                **consumer_config(
                    self.settings,
                    f"runfold-index-{uuid.uuid4().hex[:12]}",  # assign-only: the group is never joined
                    enable_partition_eof=True,
                    fetch_wait_max_ms=50,
                ),
                "logger": kafka_log(),  # librdkafka's lines through logging, a lost broker's repeats collapsed
            }
        )
        try:
            try:
                partitions = self._partitions(consumer, stop or threading.Event())
            except StopRequested:
                return self.report
            stored = self.index.offsets(self.topic)
            starts = {p: stored.get(p, OFFSET_BEGINNING) for p in partitions}
            at_end: set[int] = set()
            for p in partitions:
                high = self._end(p, stop or threading.Event())
                if high is None:
                    return self.report  # stopped while the cluster did not answer
                if (starts[p] != OFFSET_BEGINNING and starts[p] >= high) or high == 0:
                    at_end.add(p)
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
            batch, pending, last = Batch(), 0, time.monotonic()
            while stop is None or not stop.is_set():
                msgs = first_then_buffered(consumer, self.batch_max, 0.1)
                records = []
                for msg in msgs:
                    err = msg.error()
                    if err is None:
                        records.append(msg)
                        at_end.discard(msg.partition())
                    elif err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        # under read_committed the end can lie past the last record (markers)
                        if msg.offset() >= 0:
                            batch.offsets[(self.topic, msg.partition())] = msg.offset()
                    elif err.fatal() or err.code() == KafkaError._FATAL:
                        raise KafkaException(err)
                    elif time.monotonic() >= self._said_at.get(err.code(), 0.0):
                        # the consumer recovers from the rest (a broker lost, all of them, a
                        # leader moving): said every 10 s while it lasts, never a reason to
                        # exit (issue 48; `_ALL_BROKERS_DOWN` is not retriable, and stopped it)
                        self._said_at[err.code()] = time.monotonic() + 10.0
                        log.warning("waiting for the cluster: %s", err.str())
                if records:
                    self._ingest(records, batch)
                    pending += len(records)
                now = time.monotonic()
                if batch.offsets and (
                    pending >= self.batch_max or now - last >= self.commit_interval_s or not msgs
                ):
                    self._flush(batch, on_batch)
                    batch, pending, last = Batch(), 0, now
                if len(at_end) == len(partitions) and not batch.offsets:
                    self.caught_up.set()
                    if not follow:
                        break
        finally:
            consumer.close()
            self.report.seconds = time.monotonic() - started
        return self.report

    def _end(self, p: int, stop: threading.Event) -> int | None:
        """Partition p's end; a cluster that does not answer is waited for (said every 10 s),
        None when `stop` is set meanwhile."""
        while not stop.is_set():
            try:
                return self._offsets.end(TopicPartition(self.topic, p), 10.0)
            except KafkaException as e:
                log.warning(
                    "waiting for the cluster: the end of %s[%d] is unavailable (%s)", self.topic, p, e
                )
        return None

    def _partitions(self, consumer: Consumer, stop: threading.Event) -> list[int]:
        """The topic's partitions, once a broker answers (at most `connect_timeout_s`) and the
        topic exists (at most TOPIC_APPEARS_S): IngestCannotStart otherwise; StopRequested
        when `stop` is set meanwhile."""
        deadline: float | None = None
        while True:
            try:
                # once it answered, a cluster gone again is waited for, said every 10 s (issue 48)
                await_cluster(
                    consumer,
                    self.settings.bootstrap_servers,
                    self.connect_timeout_s if deadline is None else 10.0,
                    stop,
                    self.topic,
                )
            except ClusterUnreachable as e:
                if deadline is None:
                    raise IngestCannotStart(str(e)) from None
                log.warning("waiting for the cluster: %s", e)
                continue
            if deadline is None:
                deadline = time.monotonic() + TOPIC_APPEARS_S
            try:
                md = consumer.list_topics(self.topic, timeout=10)  # it answered a moment ago
            except KafkaException:  # and went away again: wait for it
                continue
            tmd = md.topics.get(self.topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                return sorted(tmd.partitions)
            if time.monotonic() > deadline:
                raise IngestCannotStart(
                    f"topic {self.topic} does not exist; create it with `runfold topology create` "
                    f"(prefix {self.settings.topic_prefix!r})"
                )
            if stop.wait(0.2):
                raise StopRequested

    # ------------------------------------------------------------------ one batch
    def _ingest(self, records: list[Any], batch: Batch) -> None:
        decoded: list[tuple[Any, dict[str, Any] | None]] = []
        missing: set[str] = set()
        for msg in records:
            value = msg.value()
            ev: dict[str, Any] | None = None
            if value is not None:
                try:
                    ev = self._decode(value)
                except DecodeError as e:
                    self.report.undecodable += 1
                    log.warning(
                        "undecodable record at %s[%d]@%d skipped: %s",
                        self.topic,
                        msg.partition(),
                        msg.offset(),
                        e,
                    )
            decoded.append((msg, ev))
            if ev is not None and ev["type"] != "RunRejected":
                # a RunAccepted too: a duplicate of one the database holds must be seen as one
                rid = ev["run_id"]
                if rid not in self._cache and rid not in missing:
                    missing.add(rid)
        if missing:
            self._cache.update(self.index.load_runs(missing))
        dirty: dict[str, RunRow] = {r.run_id: r for r in batch.runs}
        new: dict[str, RunRow] = {r.run_id: r for r in batch.new_runs}
        for msg, ev in decoded:
            self.report.records += 1
            batch.offsets[(self.topic, msg.partition())] = msg.offset() + 1
            if ev is None:
                continue
            self._apply(msg, ev, batch, dirty, new)
        batch.runs = list(dirty.values())
        batch.new_runs = list(new.values())

    def _apply(
        self, msg: Any, ev: dict[str, Any], batch: Batch, dirty: dict[str, RunRow], new: dict[str, RunRow]
    ) -> None:
        etype, rid = ev["type"], ev["run_id"]
        if etype == "RunRejected":
            self.report.rejected += 1
            self.report.events += 1
            batch.rejections.append(
                (
                    msg.partition(),
                    msg.offset(),
                    rid,
                    ev["ts_ms"],
                    ev["command_type"],
                    ev["code"],
                    ev["reason"],
                    ev.get("definition_id"),
                    ev.get("revision"),
                )
            )
            return
        run = self._cache.get(rid)
        if run is not None and ev["sequence"] <= run.sequence:
            self.report.duplicates += 1
            return
        if etype == "RunAccepted":
            run = accept(ev, msg.partition())
            self._cache[rid] = run
            new[rid] = run
            self.report.new_runs += 1
        elif run is None:
            # its RunAccepted is no longer on the topic (run-events retention): nothing to fold into
            self.report.skipped["event before the run's RunAccepted"] += 1
            return
        else:
            if ev["sequence"] != run.sequence + 1:
                self.report.skipped["sequence gap (applied)"] += 1
            try:
                apply(run, ev)
            except (Skip, KeyError) as e:
                self.report.skipped[f"{etype}: {e}"] += 1
                log.warning("run %s event %d (%s) not indexed: %s", rid, ev["sequence"], etype, e)
                return
        self._cache.move_to_end(rid)
        dirty[rid] = run
        self.report.events += 1
        if self.store_events:
            batch.events.append(
                (
                    rid,
                    ev["sequence"],
                    etype,
                    ev["ts_ms"],
                    ev.get("node"),
                    ev.get("lineage"),
                    ev.get("attempt"),
                    orjson.dumps(ev),
                )
            )

    def _flush(self, batch: Batch, on_batch: Callable[[Batch], None] | None) -> None:
        self.index.write(batch)
        self.report.batches += 1
        for run in batch.runs:
            run.dirty_steps.clear()
        while len(self._cache) > self.cache_runs:
            self._cache.popitem(last=False)
        if on_batch is not None:
            on_batch(batch)
