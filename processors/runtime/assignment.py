"""Owned partitions: open their stores on assignment, restore them, close them on revocation.

Restore makes a partition's store exactly the fold of the committed events of
`<p>.run-events` partition N before any input of partition N is processed: the
input partitions stay paused while `restore_step` folds run events from the stored
offset + 1 in chunks (other partitions keep running meanwhile). A partition is
ready when the restore reader has reached the end of the committed log *and* that
end is the log end, i.e. no transaction is open on it: an open transaction there
can only be a previous owner's (a crashed or cut-off processor), and it may still
commit events whose input offsets this instance would then skip. Waiting for it to
resolve (commit, abort, or the transaction timeout) keeps the store exact.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from logging import Logger
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from processors.engine import EventBeforeStart
from processors.kafka import watermarks
from processors.kafka.fetch import resume_now
from processors.runtime.fold import Folder
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import NO_OFFSET, PartitionStore
from schemas import DecodeError

_STABILITY_RECHECK_S = 0.25
# After this long without an end-of-partition event, check the reader's position instead: after
# a broker fenced itself, a reassigned reader was seen never to report EOF on an empty partition.
_NO_EOF_CHECK_S = 2.0
_RENEW_READERS_AFTER_S = 5.0  # end offsets unavailable this long: new restore clients
_PROGRESS_EVERY_S = 10.0  # a restore still running logs how far it got this often


@dataclass
class _Restore:
    partition: int
    started: float
    start_offset: int
    events: int = 0
    first_offset: int = NO_OFFSET  # of the first event read: retention may have removed those before it
    last_offset: int = NO_OFFSET
    end_seen: int | None = None  # offset of the last end-of-partition event
    recheck_at: float = 0.0
    offsets_error: str = ""  # the last failure to get end offsets (logged when it changes)
    failing_since: float | None = None  # end offsets unavailable since
    # runs whose events begin after their RunAccepted: retention deleted their beginning
    before_start: set[str] = field(default_factory=set)
    # A restore from run-state (a new store): the run-events committed end taken before
    # run-state is read (None: a restore from the log), each run's latest snapshot read so far
    # (None: a tombstone), and whether run-state reached its stable end.
    events_from: int | None = None
    reading_state: bool = False
    snapshots: dict[bytes, bytes | None] = field(default_factory=dict)
    state_end_seen: int | None = None
    state_recheck_at: float = 0.0
    seeded_runs: int = 0


def restore_progress(r: _Restore, log_end: int, now: float) -> dict[str, Any]:
    """How far a restore got, for its progress log: events folded, the next offset to read,
    the log end (-1 unknown), the offsets left (transaction markers take offsets too, so a
    little more than the events left), the rate so far and the time left at that rate."""
    position = r.last_offset + 1 if r.last_offset != NO_OFFSET else max(r.start_offset, 0)
    log_end = max(log_end, -1)  # librdkafka says -1001 before the first fetch
    left = max(0, log_end - position) if log_end >= 0 else None
    elapsed = now - r.started
    rate = r.events / elapsed if elapsed > 0 else 0.0
    read_from = r.first_offset if r.first_offset != NO_OFFSET else max(r.start_offset, 0)
    offset_rate = (position - read_from) / elapsed if elapsed > 0 else 0.0  # markers too, like `left`
    return {
        "partition": r.partition,
        "restored_events": r.events,
        "next_offset": position,
        "log_end": log_end,
        "offsets_left": left,
        "events_per_s": round(rate),
        "eta_s": round(left / offset_rate) if left and offset_rate else None,
    }


class Partitions:
    """The stores of the owned partitions and their restore state. The loop thread
    mutates; the query server reads `store(p)` under the lock."""

    def __init__(
        self, settings: ProcessorSettings, folder: Folder, metrics: ProcessorMetrics, log: Logger
    ) -> None:
        self._settings = settings
        self._folder = folder
        self._metrics = metrics
        self._log = log
        self._root = settings.store_root()
        self._events_topic = settings.topics.run_events
        self._inputs = (settings.topics.commands, settings.topics.receipts)
        self._reader, self._log_end = self._new_readers()
        self._state_topic = settings.topics.run_state
        self._state_reader: Consumer | None = None  # run-state, while a restore reads it
        self._readers_renewed_at = time.monotonic()
        self._lock = threading.Lock()
        self._stores: dict[int, PartitionStore] = {}
        self.restoring: dict[int, _Restore] = {}
        self._progress_at = 0.0  # monotonic time of the next restore progress log

    def _new_readers(self) -> tuple[Consumer, watermarks.Offsets]:
        reader = Consumer(self._settings.side_consumer_config("restore"))
        # the committed end (LSO) and the log end (high watermark), never asked of a consumer
        log_end = watermarks.Offsets.like(self._settings.side_consumer_config("watermarks"))
        return reader, log_end

    def _renew_readers(self) -> None:
        """After a broker fenced itself, a side client was seen answering "Unknown partition" from
        its metadata cache for good (a metadata refresh did not help): new clients resume every
        restore from what its store has applied."""
        self._log.warning(
            "restore clients keep failing; replacing them", extra={"restoring": sorted(self.restoring)}
        )
        old = (self._reader, self._log_end)
        self._reader, self._log_end = self._new_readers()
        self._readers_renewed_at = time.monotonic()
        resume = []
        for p, r in self.restoring.items():
            if r.reading_state:  # its run-events reader is assigned once run-state is read
                continue
            applied = self._stores[p].applied_offset
            resume.append(
                TopicPartition(
                    self._events_topic, p, applied + 1 if applied != NO_OFFSET else OFFSET_BEGINNING
                )
            )
            r.end_seen, r.recheck_at, r.failing_since = None, 0.0, None
        if resume:
            self._reader.incremental_assign(resume)
        for client in old:
            with contextlib.suppress(Exception):
                client.close()

    # ---- views -----------------------------------------------------------------------------
    def store(self, partition: int) -> PartitionStore | None:
        with self._lock:
            return self._stores.get(partition)

    def ready_store(self, partition: int) -> PartitionStore | None:
        if partition in self.restoring:
            return None
        return self._stores.get(partition)

    def ready(self) -> list[PartitionStore]:
        return [s for p, s in self._stores.items() if p not in self.restoring]

    def owned(self) -> list[int]:
        with self._lock:
            return sorted(self._stores)

    def _inputs_of(self, partition: int) -> list[TopicPartition]:
        return [TopicPartition(t, partition) for t in self._inputs]

    # ---- assignment ------------------------------------------------------------------------
    def open(self, partitions: list[int]) -> None:
        """Open each partition's store and start restoring it (its input must be paused)."""
        to_read: list[TopicPartition] = []
        for p in partitions:
            if p in self._stores:
                continue
            store = self._open_store(p)
            with self._lock:
                self._stores[p] = store
            r = self.restoring[p] = _Restore(p, time.monotonic(), store.applied_offset + 1)
            if store.applied_offset == NO_OFFSET and self._settings.restore_from_state:
                r.events_from = self._events_from(p)
            if r.events_from is not None:
                r.reading_state = True
                self._read_state(p)
                continue
            start = store.applied_offset + 1 if store.applied_offset != NO_OFFSET else OFFSET_BEGINNING
            to_read.append(TopicPartition(self._events_topic, p, start))
        if to_read:
            # The reader's leader for these partitions, before it needs one: assigned without it,
            # librdkafka waits for its next metadata refresh and then its 500 ms offset-query
            # timer, ~1 s before the first fetch (an empty partition: 1.06 s -> 0.06 s to EOF).
            with contextlib.suppress(KafkaException):
                self._reader.list_topics(self._events_topic, timeout=2)
            self._reader.incremental_assign(to_read)
            self._progress_at = max(self._progress_at, time.monotonic() + _PROGRESS_EVERY_S)
        self._metrics.partitions_assigned.set(len(self._stores))
        self._metrics.partitions_restoring.set(len(self.restoring))

    def _events_from(self, p: int) -> int | None:
        """E0, the run-events committed end before run-state is read: every event before it
        was committed in a transaction that also wrote its run's snapshot, so run-state read
        to its stable end afterwards reflects them all (docs/runtime.md). None: a restore
        from the log (nothing to skip, or the end unknown)."""
        try:
            e0 = watermarks.log_end(
                self._log_end, TopicPartition(self._events_topic, p), 10.0, committed=True
            )
        except KafkaException as e:
            self._log.warning(
                "run-events end unavailable; restoring from the log",
                extra={"partition": p, "error": e.args[0].str()},
            )
            return None
        return e0 if e0 > 0 else None

    def _read_state(self, p: int) -> None:
        if self._state_reader is None:
            self._state_reader = Consumer(self._settings.side_consumer_config("restore-state"))
        tp = TopicPartition(self._state_topic, p, OFFSET_BEGINNING)
        with contextlib.suppress(KafkaException):
            self._state_reader.list_topics(self._state_topic, timeout=2)
        self._state_reader.incremental_assign([tp])

    def _open_store(self, p: int) -> PartitionStore:
        path = self._root / f"p{p}"
        store = PartitionStore(path, p, self._settings.state_cache_runs)
        if store.applied_offset == NO_OFFSET:
            return store
        try:
            log_end = watermarks.log_end(
                self._log_end, TopicPartition(self._events_topic, p), 10.0, committed=False
            )
        except KafkaException as e:  # inside on_assign: raising would stop the processor
            self._log.warning(
                "could not compare the store with run-events (broker unavailable); keeping it",
                extra={"partition": p, "error": e.args[0].str()},
            )
            return store
        if store.applied_offset < log_end:
            if (
                self._settings.restore_from_state
                and log_end - store.applied_offset > self._settings.restore_state_lag
            ):
                # Folding all it missed takes longer than a restore from run-state: rebuild it.
                self._log.warning(
                    "store far behind run-events; rebuilding it from run-state",
                    extra={"partition": p, "store_offset": store.applied_offset, "log_end": log_end},
                )
                store.close()
                PartitionStore.destroy(path)
                return PartitionStore(path, p, self._settings.state_cache_runs)
            return store
        # The store reflects events the log does not have (topic recreated, wrong cluster):
        # it cannot be trusted. Rebuild it from the log.
        self._log.error(
            "store is ahead of run-events; rebuilding it from the log",
            extra={
                "partition": p,
                "store_offset": store.applied_offset,
                "log_end": log_end,
                "path": str(path),
            },
        )
        store.close()
        PartitionStore.destroy(path)
        return PartitionStore(path, p, self._settings.state_cache_runs)

    def close(self, partitions: list[int]) -> None:
        restoring = [p for p in partitions if p in self.restoring]
        reading_state = [p for p in restoring if self.restoring[p].reading_state]
        stop_reading = [TopicPartition(self._events_topic, p) for p in restoring if p not in reading_state]
        if stop_reading:
            self._reader.incremental_unassign(stop_reading)
        if reading_state and self._state_reader is not None:
            self._state_reader.incremental_unassign(
                [TopicPartition(self._state_topic, p) for p in reading_state]
            )
        for p in partitions:
            self.restoring.pop(p, None)
            with self._lock:
                store = self._stores.pop(p, None)
            if store is not None:
                store.close()
        self._metrics.partitions_assigned.set(len(self._stores))
        self._metrics.partitions_restoring.set(len(self.restoring))

    def close_all(self) -> None:
        self.close(list(self._stores))

    # ---- restore ---------------------------------------------------------------------------
    def restore_step(self, consumer: Consumer, timeout_s: float) -> list[int]:
        """Fold up to one chunk of run events into restoring stores; resume the input of
        partitions that caught up. Returns the partitions that became ready."""
        if any(r.reading_state for r in self.restoring.values()):
            self._state_step(timeout_s)
        overlays: dict[int, PartitionOverlay] = {}
        folded = 0
        for msg in self._reader.consume(self._settings.restore_chunk, timeout_s):
            err = msg.error()
            p = msg.partition()
            r = self.restoring.get(p) if p is not None else None
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and r is not None:
                    r.end_seen = msg.offset()
                elif err.code() != KafkaError._PARTITION_EOF:
                    self._log.warning("restore reader error", extra={"error": str(err)})
                continue
            offset = msg.offset()
            if r is None or p is None or offset is None:  # a record always has both
                continue
            ov = overlays.get(p)
            if ov is None:
                ov = overlays[p] = PartitionOverlay(self._stores[p])
            restored = True
            try:
                self._folder.fold_committed(ov, msg.value())
            except DecodeError as e:
                # Our own output: never expected. Say so loudly and keep the partition alive.
                self._log.error(
                    "undecodable run event skipped during restore",
                    extra={"partition": p, "offset": offset, "error": e.reason},
                )
            except EventBeforeStart as e:
                # The log starts after this run's RunAccepted (run_events_retention_ms shorter than
                # the run): it cannot be rebuilt. Skip its events rather than stop for good: every
                # restart would stop here again. Its id stays taken; said at `partition ready`.
                r.before_start.add(e.run_id)
                ov.lost.add(e.run_id)
                self._metrics.events_before_start.inc()
                restored = False
            if r.first_offset == NO_OFFSET:
                r.first_offset = offset
            r.last_offset = offset
            if restored:
                r.events += 1
                folded += 1
        for p, ov in overlays.items():
            Folder.dump_all(ov)
            ov.write(self.restoring[p].last_offset)
        if folded:
            self._metrics.events_restored.inc(folded)
        done = self._finish_caught_up(consumer)
        if self.restoring and time.monotonic() >= self._progress_at:
            self._log_progress()
        return done

    def _state_step(self, timeout_s: float) -> None:
        """Read a chunk of run-state for the partitions restoring from it; a partition whose
        run-state reached its stable end gets its store seeded and reads run-events from E0."""
        reader = self._state_reader
        assert reader is not None
        for msg in reader.consume(self._settings.restore_chunk, timeout_s):
            err = msg.error()
            p = msg.partition()
            r = self.restoring.get(p) if p is not None else None
            if r is None or not r.reading_state:
                continue
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    r.state_end_seen = msg.offset()
                else:
                    self._log.warning("restore run-state reader error", extra={"error": str(err)})
                continue
            key = msg.key()
            if key is not None:  # compaction keeps the last value of a key: so does this
                r.snapshots.pop(key, None)  # re-inserted: the order they were last written
                r.snapshots[key] = msg.value()
        now = time.monotonic()
        for p, r in list(self.restoring.items()):
            if not r.reading_state or (r.state_end_seen is None and now < r.state_recheck_at):
                continue
            if r.state_end_seen is None and now - r.started < _NO_EOF_CHECK_S:
                continue
            checked_eof = r.state_end_seen is not None
            if self._state_at_stable_end(p, r):
                self._seed(p, r)
            else:
                r.state_end_seen = None
                # Without an end-of-partition event the reader is most likely still reading: ask
                # the broker for the ends (two round trips) rarely, not every 0.25 s while it reads
                # (asked for every partition at each recheck, they took most of a restore's time).
                r.state_recheck_at = now + (_STABILITY_RECHECK_S if checked_eof else _NO_EOF_CHECK_S)

    def _state_at_stable_end(self, p: int, r: _Restore) -> bool:
        """run-state read to its committed end, and that end the log end: no transaction open
        on it (only a fenced previous owner's can be: waited out, as for run-events)."""
        reader = self._state_reader
        assert reader is not None
        tp = TopicPartition(self._state_topic, p)
        try:
            committed_end = watermarks.log_end(self._log_end, tp, 5.0, committed=True)
            log_end = watermarks.log_end(self._log_end, tp, 5.0, committed=False)
        except KafkaException as e:
            self._log.warning(
                "restore: run-state end offsets unavailable; retrying",
                extra={"partition": p, "error": e.args[0].str()},
            )
            return False
        if committed_end < log_end:
            return False
        position = r.state_end_seen
        if position is None:
            pos = reader.position([tp])[0].offset
            position = pos if pos >= 0 else 0
        return bool(position >= committed_end)

    def _seed(self, p: int, r: _Restore) -> None:
        """Write each run's latest snapshot into the new store in one batch, with E0 - 1 as
        its applied offset, then fold run-events from E0."""
        assert self._state_reader is not None and r.events_from is not None
        self._state_reader.incremental_unassign([TopicPartition(self._state_topic, p)])
        ov = PartitionOverlay(self._stores[p])
        for key, value in r.snapshots.items():
            if value is None:
                continue  # a purged run: its tombstone
            try:
                self._folder.seed_snapshot(ov, value)
            except (DecodeError, ValueError, KeyError, TypeError) as e:
                self._log.error(
                    "undecodable run-state snapshot skipped during restore",
                    extra={"partition": p, "key": key.decode(errors="replace"), "error": str(e)},
                )
                continue
            r.seeded_runs += 1
        Folder.dump_all(ov)
        ov.store.mark_seeded(r.events_from)  # first: a crash after it re-seeds a store still new
        ov.write(r.events_from - 1)
        self._metrics.runs_seeded.inc(r.seeded_runs)
        r.snapshots = {}
        r.reading_state = False
        r.start_offset = r.events_from
        self._log.info(
            "partition seeded from run-state",
            extra={
                "partition": p,
                "runs": r.seeded_runs,
                "events_from": r.events_from,
                "seed_ms": round((time.monotonic() - r.started) * 1000, 1),
            },
        )
        self._reader.incremental_assign([TopicPartition(self._events_topic, p, r.events_from)])

    def _log_progress(self) -> None:
        """A long restore (a new instance, a lost store) says how far it got and how long it
        has left, every `_PROGRESS_EVERY_S`, instead of nothing until `partition ready`."""
        now = time.monotonic()
        self._progress_at = now + _PROGRESS_EVERY_S
        for p, r in sorted(self.restoring.items()):
            try:  # the high watermark of the reader's last fetch: no request
                _low, log_end = self._reader.get_watermark_offsets(
                    TopicPartition(self._events_topic, p), cached=True
                )
            except KafkaException:
                log_end = -1
            self._log.info("restoring", extra=restore_progress(r, log_end, now))

    def _finish_caught_up(self, consumer: Consumer) -> list[int]:
        done: list[int] = []
        now = time.monotonic()
        for p, r in list(self.restoring.items()):
            if r.reading_state:
                continue
            if r.end_seen is None and now < r.recheck_at:
                continue
            if r.end_seen is None and r.recheck_at == 0.0 and now - r.started < _NO_EOF_CHECK_S:
                continue  # not at the end yet and never was: keep reading
            if self._at_stable_end(p, r):
                done.append(p)
            else:
                r.end_seen = None
                r.recheck_at = now + _STABILITY_RECHECK_S
        for p in done:
            r = self.restoring.pop(p)
            self._reader.incremental_unassign([TopicPartition(self._events_topic, p)])
            # before any input of it is folded
            redone = self._stores[p].redo_interrupted_purge(self._settings.finished_retention_ms > 0)
            if redone:
                self._metrics.runs_purged.inc(redone)
            resume_now(consumer, self._inputs_of(p))
            self._log.info(
                "partition ready",
                extra={
                    "partition": p,
                    "restored_events": r.events,
                    "from_offset": r.start_offset,
                    "seeded_runs": r.seeded_runs,
                    "restore_ms": round((time.monotonic() - r.started) * 1000, 1),
                },
            )
            if r.before_start:
                # Mostly runs long finished (and purged): harmless. A run still live is lost, which
                # its snapshot (not terminal) shows; the processor cannot tell the two apart here.
                self._log.warning(
                    "runs not restored: the run-events log no longer holds their beginning (its retention "
                    "deleted their RunAccepted); their ids stay taken, their receipts are dropped as stale "
                    "and their state snapshots stay as they were. Finished runs lose nothing; keep "
                    "run_events_retention_ms longer than any run lives",
                    extra={"partition": p, "runs": len(r.before_start), "some": sorted(r.before_start)[:5]},
                )
        if done:
            self._metrics.partitions_restoring.set(len(self.restoring))
        return done

    def _at_stable_end(self, p: int, r: _Restore) -> bool:
        tp = TopicPartition(self._events_topic, p)
        try:
            committed_end = watermarks.log_end(self._log_end, tp, 5.0, committed=True)
            log_end = watermarks.log_end(self._log_end, tp, 5.0, committed=False)
        except KafkaException as e:
            # Broker unreachable or the partition leaderless for a moment (restart, a broker that
            # fenced itself): not known to be at the end yet; ask again on the next recheck. A
            # client whose metadata was fetched meanwhile keeps answering "Unknown partition"
            # from its cache until refreshed: refresh it.
            if e.args[0].str() != r.offsets_error:
                r.offsets_error = e.args[0].str()
                self._log.warning(
                    "restore: run-events end offsets unavailable; retrying",
                    extra={"partition": p, "error": r.offsets_error},
                )
            for client in (self._reader, self._log_end):
                with contextlib.suppress(KafkaException):
                    client.list_topics(self._events_topic, timeout=2)
            now = time.monotonic()
            r.failing_since = r.failing_since or now
            if (
                now - r.failing_since > _RENEW_READERS_AFTER_S
                and now - self._readers_renewed_at > _RENEW_READERS_AFTER_S
            ):
                self._renew_readers()
            return False
        r.failing_since = None
        position = r.end_seen
        if position is None:
            pos = self._reader.position([tp])[0].offset
            position = pos if pos >= 0 else r.start_offset
        if committed_end < log_end:
            if r.recheck_at == 0.0:
                self._log.warning(
                    "waiting for an open transaction on run-events before resuming",
                    extra={"partition": p, "committed_end": committed_end, "log_end": log_end},
                )
            return False
        return bool(position >= committed_end)

    def restore_info(self) -> dict[str, Any]:
        return {str(p): {"events": r.events, "last_offset": r.last_offset} for p, r in self.restoring.items()}

    def close_readers(self) -> None:
        self._reader.close()
        self._log_end.close()
        if self._state_reader is not None:
            self._state_reader.close()
