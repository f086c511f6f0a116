"""The transaction loop: consume → fold → produce → commit, exactly once (KIP-447).

One iteration: take what input is buffered (blocking only when no transaction is
open), fold each record into the write overlay, fire due timers, and commit when
the input is drained, the batch is full, or `commit_interval_ms` has passed. A
commit is: one run-state snapshot per touched run → `send_offsets_to_transaction`
with the consumer's group metadata → `commit_transaction` → only then the overlay
goes to RocksDB, with the run-events offsets the delivery reports gave.

Any error before the commit completes aborts the transaction, drops the overlay and
seeks the input back to the transaction's first offsets. A fenced or fatal producer
ends the loop with a non-zero exit code and a message saying why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors.engine import Catalog, Ceilings, EngineContext
from processors.metrics_endpoint import CannotServe
from processors.runtime import logs
from processors.runtime.assignment import Partitions
from processors.runtime.definitions import DefinitionsReader
from processors.runtime.exits import (  # re-exported: the exit codes callers know the loop by
    EXIT_FATAL,
    EXIT_FENCED,
    EXIT_OK,
    EXIT_STALLED,
    FENCED_CODES,
    ProcessorStopped,
    StopRequested,
)
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.preflight import check_state_dir, check_topology
from processors.runtime.producers import KAFKA_TIMEOUT_S, TxnProducers
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import PURGE_PAGE
from processors.runtime.timers import TimerFirer
from processors.runtime.watchdog import CallAbandoned, Watchdog
from schemas import Codec

_LAG_EVERY_S = 5.0
_PURGE_EVERY_S = 1.0
_MAX_STALE_REFUSALS = 3
_REPLACE_SPACING_S = 5.0


class RecordTooLarge(Exception):
    """produce() refused a record over the client's `message.max.bytes`."""


class ProduceFailed(Exception):
    """produce() failed otherwise (e.g. `_STATE`: an earlier delivery already failed the
    transaction); the transaction must abort."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


@dataclass
class _Txn:
    open: bool = False
    deadline: float = 0.0
    records: int = 0
    overlays: dict[int, PartitionOverlay] = field(default_factory=dict)
    start: dict[tuple[str, int], int] = field(default_factory=dict)  # first offset per input partition
    next: dict[tuple[str, int], int] = field(default_factory=dict)  # offset to commit per input partition
    event_offsets: dict[int, int] = field(default_factory=dict)  # max run-events offset per partition
    counters: TxnCounters = field(default_factory=TxnCounters)

    def reset(self) -> None:
        self.open = False
        self.records = 0
        self.overlays.clear()
        self.start.clear()
        self.next.clear()
        self.event_offsets.clear()
        self.counters.clear()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Processor:
    def __init__(self, settings: ProcessorSettings, stop: threading.Event | None = None,
                 ceilings: Ceilings | None = None, codec: Codec | None = None,
                 exit_on_stall: bool = False) -> None:
        """`exit_on_stall`: a loop stuck for `stall_timeout_ms` ends the process (the CLI's
        choice: its supervisor restarts it); otherwise the stall is only logged."""
        self.settings = settings
        self.stop_event = stop or threading.Event()
        self.log = logs.get_logger()
        self.metrics = ProcessorMetrics()
        self.codec = codec or Codec.default()
        self.topics = settings.topics
        self.catalog = Catalog(ceilings)
        self.ctx = EngineContext(catalog=self.catalog, ceilings=ceilings or Ceilings(),
                                 queues=frozenset(settings.activation_queues))
        self.txn = _Txn()
        self._fatal: ProcessorStopped | None = None
        self._aborts_in_a_row = 0
        self._client_errors = logs.RepeatThrottle()  # non-fatal client errors, logged once per 10 s
        self._session_lost_at = -1e9  # monotonic time of the last on_lost (session timed out)
        self._stale_refusals = 0  # offsets refused FENCED_INSTANCE_ID since the last commit
        self._rejoin_stale = False  # the consumer is replaced for a stale membership, not another instance
        self._consumer_failed: KafkaError | None = None  # fatal input-consumer error, handled next iteration
        self._consumer_replaced_at = -1e9
        self._unassigned_since: float | None = None  # subscribed or lost/revoked, no on_assign since
        # Output too large: a transaction's input is replayed one record per transaction
        # (`_isolate_left` records) until the input that caused it is alone in a failing one;
        # that input is then parked in `_poison` (coordinates -> (reason, level: see
        # Folder.park_too_large; raised each time the parked input is refused again))
        # and dead-lettered instead of folded when it comes back.
        self._isolate_left = 0
        self._poison: dict[tuple[str, int, int], tuple[str, int]] = {}
        self.producers = TxnProducers(settings, self.metrics, self.log, self._bounded, self._on_client_error)
        self._consumer: Consumer | None = None
        self.partitions: Partitions | None = None
        self._definitions: DefinitionsReader | None = None
        self._query: Any = None
        self.partition_count = 0
        self.metrics_port: int | None = None
        self.query_port: int | None = None
        self.ready = threading.Event()  # set once definitions are loaded and the group joined
        self._next_lag = 0.0
        self._next_purge = 0.0
        self._purge_more = False  # the last purge pass left due runs behind (a full page)
        self.purge_page = PURGE_PAGE  # finished runs purged per partition and transaction
        self.folder = Folder(self.ctx, self.codec, self.topics, self._produce, self._on_event_delivery, _now_ms,
                             settings.finished_retention_ms)
        self.timers = TimerFirer(self.codec, self.topics.receipts, self._produce, self.metrics,
                                 settings.timers_per_transaction)
        self._exit_on_stall = exit_on_stall
        # Offsets and commit get no longer than the transaction itself: the coordinator aborts
        # a transaction older than transaction_timeout_ms, so waiting longer gains nothing.
        self._txn_call_s = min(KAFKA_TIMEOUT_S, settings.transaction_timeout_ms / 1000.0)
        self.watchdog = Watchdog(settings.stall_timeout_ms / 1000.0, self._on_stall) \
            if settings.stall_timeout_ms else None

    # ---- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until `stop_event` is set; returns the process exit code."""
        code = EXIT_OK
        try:
            if self.watchdog is not None:
                self.watchdog.start()
            self._start()
            while not self.stop_event.is_set():
                if self.watchdog is not None:
                    self.watchdog.beat()
                self._iterate()
                if self._fatal is not None:
                    raise self._fatal
            if self._fatal is not None:
                raise self._fatal
            if self.txn.open:
                self._commit()
        except StopRequested:
            self.log.info("stop requested during start-up")
        except ProcessorStopped as e:
            self._fatal = e
            code = e.code
            self.log.error("processor stopped", extra={"reason": str(e), "exit_code": code})
        except Exception as e:
            self._fatal = ProcessorStopped(EXIT_FATAL, f"{type(e).__name__}: {e}")
            code = EXIT_FATAL
            self.log.exception("processor crashed", extra={"exit_code": code})
        finally:
            try:
                self._shutdown()
            finally:
                self.producers.close()
                if self.watchdog is not None:
                    self.watchdog.stop()
        return code

    def stop(self) -> None:
        self.stop_event.set()

    def _start(self) -> None:
        s = self.settings
        self.log.info("processor starting", extra={"settings": s.redacted(),
                                                   "transactional_id": s.transactional_id})
        check_state_dir(s)
        # The ports first: one in use stops this instance before it fences its predecessor.
        # (Run queries answer 503 "starting" and /health ready=false until the loop is up.)
        try:
            if s.metrics_port is not None:
                self.metrics_port = self.metrics.serve(s.metrics_port, s.http_host)
            if s.query_port is not None:
                from processors.runtime.query import QueryServer

                self._query = QueryServer(self, s.http_host, s.query_port)
                self.query_port = self._query.port
        except CannotServe as e:  # a port in use: say which, not a traceback
            raise ProcessorStopped(EXIT_FATAL, str(e)) from e
        self._consumer = self._new_consumer()
        partitions = self.partition_count = check_topology(self._consumer, s, KAFKA_TIMEOUT_S, self.stop_event)
        self.producers.start(self.stop_event)
        self.partitions = Partitions(s, self.folder, self.metrics, self.log)
        self._definitions = DefinitionsReader(s.side_consumer_config("definitions"), self.topics.definitions,
                                              self.catalog, self.codec, self.metrics, self.log)
        n = self._definitions.catch_up(KAFKA_TIMEOUT_S, self.stop_event)
        self._subscribe()
        self.log.info("processor started", extra={
            "definitions": n, "partitions": partitions, "group": s.group,
            "metrics_port": self.metrics_port, "query_port": self.query_port})
        self.ready.set()

    def _new_consumer(self) -> Consumer:
        return Consumer({**self.settings.input_consumer_config(), "error_cb": self._on_client_error})

    def _subscribe(self) -> None:
        assert self._consumer is not None
        self._consumer.subscribe([self.topics.commands, self.topics.receipts], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._unassigned_since = time.monotonic()

    def _shutdown(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()  # runs on_revoke: commits or drops what is open, closes stores
            except Exception as e:
                self.log.warning("consumer close failed", extra={"error": str(e)})
        if self.partitions is not None:
            self.partitions.close_all()
            self.partitions.close_readers()
        if self._fatal is None:
            self.producers.flush(5)
        if self._definitions is not None:
            self._definitions.close()
        if self._query is not None:
            self._query.close()
        self.metrics.close()
        self.log.info("processor stopped cleanly" if self._fatal is None else "processor shut down",
                      extra={"transactional_id": self.settings.transactional_id})

    # ---- one iteration ---------------------------------------------------------------------
    def _iterate(self) -> None:
        consumer = self._consumer
        assert consumer is not None and self._definitions is not None and self.partitions is not None
        if self._consumer_failed is not None:
            self._replace_consumer(self._consumer_failed)
            return
        self._definitions.poll()
        if self.partitions.restoring:
            self.partitions.restore_step(consumer, 0.0 if self.txn.open else 0.01)
        txn = self.txn
        batch = 1 if self._isolate_left > 0 else self.settings.batch_size
        if txn.open:
            msgs = consumer.consume(batch - txn.records, 0) if txn.records < batch else []
        else:
            first = consumer.poll(self._idle_timeout())
            msgs = [first] if first is not None else []
            if first is not None and batch > 1:
                msgs.extend(consumer.consume(batch - 1, 0))
        if self._fatal is not None:  # a rebalance callback inside poll/consume failed: stop now
            return
        if msgs:
            self._fold(msgs)
        now = _now_ms()
        for store in self.partitions.ready():
            if TimerFirer.any_due(store, now):
                self._begin()
                try:
                    self.timers.fire_due(store, self._overlay(store.partition, store), now)
                except (RecordTooLarge, ProduceFailed) as e:  # _STATE: an earlier delivery failed
                    self._produce_failed(e.err if isinstance(e, ProduceFailed) else KafkaError(
                        KafkaError.MSG_SIZE_TOO_LARGE, str(e)), "timers")
                    break
        if txn.open and (not msgs or txn.records >= batch or time.monotonic() >= txn.deadline):
            self._commit()
        if not txn.open and self.settings.finished_retention_ms > 0 and (
                self._purge_more or time.monotonic() >= self._next_purge):
            self._purge_finished()
        if time.monotonic() >= self._next_lag:
            self._report_lag()
            self._refresh_statuses()
            self._check_membership()
            self.producers.poll_idle()

    def _idle_timeout(self) -> float:
        assert self.partitions is not None
        timeout = self.settings.idle_poll_ms / 1000.0
        if self.partitions.restoring:
            return 0.0
        now = _now_ms()
        for store in self.partitions.ready():
            if store.next_due_ms is not None:
                timeout = min(timeout, max(0.0, (store.next_due_ms - now) / 1000.0))
        return timeout

    def _overlay(self, partition: int, store: Any) -> PartitionOverlay:
        ov = self.txn.overlays.get(partition)
        if ov is None:
            ov = self.txn.overlays[partition] = PartitionOverlay(store)
        return ov

    def _fold(self, msgs: list[Any]) -> None:
        assert self.partitions is not None
        self._begin()
        txn = self.txn
        overlays = txn.overlays
        fold = self.folder.fold_input
        counters = txn.counters
        not_ready: dict[tuple[str, int], int] = {}
        poison = self._poison
        for i, m in enumerate(msgs):
            if m.error() is not None:
                self._on_consume_error(m)
                continue
            topic = m.topic()
            p = m.partition()
            ov = overlays.get(p)
            tp = (topic, p)
            if ov is None:
                store = self.partitions.ready_store(p)
                if store is None:  # fetched before it was paused: give it back untouched
                    not_ready.setdefault(tp, m.offset())
                    continue
                ov = overlays[p] = PartitionOverlay(store)
            off = m.offset()
            if tp not in txn.start:
                txn.start[tp] = off
            txn.next[tp] = off + 1
            try:
                parked = poison.get((topic, p, off)) if poison else None
                if parked is None:
                    fold(ov, counters, topic, p, off, m.key(), m.value())
                else:
                    self.folder.park_too_large(ov, counters, topic, p, off, m.key(), m.value(), *parked)
            except (RecordTooLarge, ProduceFailed) as e:
                # Nothing produced in this transaction can be taken back: abort, and rewind the
                # records of this batch not folded yet too (their partitions may be new to it).
                for rest in msgs[i + 1:]:
                    if rest.error() is None:
                        txn.start.setdefault((rest.topic(), rest.partition()), rest.offset())
                if isinstance(e, RecordTooLarge):  # the first reason stays: the dead letter's
                    self._poison[(topic, p, off)] = (parked[0], min(parked[1] + 1, 2)) if parked else (str(e), 0)
                    self._abort(f"output too large: {e}")
                else:
                    self._produce_failed(e.err, "produce")
                break
        else:
            txn.records += len(msgs)
        if not_ready:
            self._give_back(not_ready)

    def _give_back(self, offsets: dict[tuple[str, int], int]) -> None:
        assert self._consumer is not None
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        for tp in tps:
            self._consumer.seek(tp)
        self._consumer.pause(tps)

    # ---- transactions ----------------------------------------------------------------------
    def _produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        producer = self.producers.current
        assert producer is not None
        try:
            try:
                producer.produce(topic, value, key, **kw)
            except BufferError:
                # Local queue full: let deliveries drain, then try once more.
                producer.poll(0.5)
                producer.produce(topic, value, key, **kw)
        except BufferError as e:  # still full: the batch's outputs outgrow the queue (aborts)
            raise ProduceFailed(KafkaError(KafkaError._QUEUE_FULL, f"local producer queue full: {e}")) from e
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise RecordTooLarge(f"{topic} record of {len(value or b'')} bytes refused: {err.str()}") from e
            raise ProduceFailed(err) from e

    def _on_event_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            offsets = self.txn.event_offsets
            p = msg.partition()
            off = msg.offset()
            if off > offsets.get(p, -1):
                offsets[p] = off

    def _begin(self) -> None:
        txn = self.txn
        if txn.open:
            return
        self.producers.prepare_current()
        producer = self.producers.current
        assert producer is not None
        try:
            with self._bounded("begin_transaction"):
                producer.begin_transaction()
        except KafkaException as e:  # only fatal or state errors can happen here
            err: KafkaError = e.args[0]
            if err.fatal() and err.code() not in FENCED_CODES and not self.producers.renewed:
                self.producers.renew(err, "begin")
                return self._begin()
            self._fatal = ProcessorStopped(EXIT_FATAL, f"begin_transaction failed: {err.str()}")
            raise self._fatal from e
        txn.open = True
        txn.deadline = time.monotonic() + self.settings.commit_interval_ms / 1000.0

    def _commit(self) -> None:
        txn = self.txn
        producer, consumer = self.producers.current, self._consumer
        assert producer is not None and consumer is not None
        t0 = time.perf_counter()
        try:
            for p, ov in txn.overlays.items():
                self.folder.snapshots(ov, p, txn.counters)
            if txn.next:
                offsets = [TopicPartition(t, p, o) for (t, p), o in txn.next.items()]
                self.producers.send_offsets(offsets, consumer.consumer_group_metadata(), self._txn_call_s)
            self._commit_transaction(producer)
        except KafkaException as e:
            if e.args[0].code() == KafkaError._STATE:
                # "Erroneous state": a delivery failed first; learn which (too large → find and
                # park the input), as when produce() says so, instead of replaying the same batch.
                self._produce_failed(e.args[0], "commit")
            else:
                self._txn_failed(e, "commit")
            return
        except CallAbandoned as e:
            self._call_abandoned("send_offsets_to_transaction", e)
            return
        except RecordTooLarge as e:  # a run-state snapshot: which input made it is not known
            self._output_too_large(str(e))
            return
        except ProduceFailed as e:
            self._produce_failed(e.err, "commit")
            return
        self.metrics.commit_latency.observe(time.perf_counter() - t0)
        self.metrics.transactions.labels("committed").inc()
        try:
            for p, ov in txn.overlays.items():
                ov.write(txn.event_offsets.get(p))
        except Exception as e:
            # Kafka has the transaction; the store is now behind and restore will catch it up.
            raise ProcessorStopped(EXIT_FATAL, f"state store write failed after commit: {e}") from e
        c = txn.counters
        self.metrics.flush_batch(c.records_in, c.records_out, c.dead, c.dropped, c.rejected, txn.records)
        if c.purged:
            self.metrics.runs_purged.inc(c.purged)
        if txn.overlays:
            self._refresh_statuses()
        self._aborts_in_a_row = 0
        self._stale_refusals = 0
        self.producers.renewed = False
        if self._isolate_left or self._poison:
            self._after_isolated_commit()
        txn.reset()
        self.producers.advance()

    def _bounded(self, call: str, timeout_s: float = KAFKA_TIMEOUT_S) -> contextlib.AbstractContextManager[None]:
        """A transactional call, watched against its timeout (watchdog.py)."""
        return self.watchdog.call(call, timeout_s) if self.watchdog is not None else contextlib.nullcontext()

    def _commit_transaction(self, producer: Producer) -> None:
        """A retriable failure (a timeout: the commit goes on in the background) must be resumed
        by calling commit_transaction again, never aborted ("Conflicting commit_transaction API
        call"): its outcome is unknown until a call returns it. After 5 attempts the error goes
        to `_txn_failed`, whose abort then stops the processor (a restart restores from the log)."""
        for attempt in range(5):
            try:
                with self._bounded("commit_transaction", self._txn_call_s):
                    producer.commit_transaction(self._txn_call_s)
                return
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or err.txn_requires_abort() or err.fatal() or attempt == 4:
                    raise
                self.log.warning("commit_transaction failed, resuming it", extra={
                    "error": err.str(), "attempt": attempt + 1})

    def _txn_timed_out(self) -> bool:
        """The open transaction began longer than transaction_timeout_ms ago (this process was
        frozen: GC, CPU starvation, SIGSTOP): the coordinator has aborted it and bumped the
        producer epoch (KIP-890), so a fence now is our own doing, not another instance's."""
        txn = self.txn
        began = txn.deadline - self.settings.commit_interval_ms / 1000.0
        return txn.open and time.monotonic() - began >= self.settings.transaction_timeout_ms / 1000.0

    def _txn_failed(self, e: KafkaException, stage: str) -> None:
        err: KafkaError = e.args[0]
        if (err.code() == KafkaError.FENCED_INSTANCE_ID and not err.fatal() and stage != "abort"
                and self._stale_refusals < _MAX_STALE_REFUSALS):
            # The offsets' group metadata names a member id the coordinator has replaced: our
            # consumer rejoined (after our own session loss, or a broker restart) and the id
            # sent is stale (librdkafka#3437), or another instance joined with our id. That one
            # initialised its transactional producers, with our ids, before joining, so ours are
            # fenced and the abort fails right there and stops us (exit 3). Otherwise rejoin with
            # a new consumer. Refused again and again with no commit between: stop as fenced.
            self._stale_refusals += 1
            self.log.warning("offsets refused: stale group membership; aborting and replacing the consumer",
                             extra={"error": err.str(), "refusals": self._stale_refusals})
            self._abort(f"{stage}: {err.str()}")
            self._consumer_failed = err
            self._rejoin_stale = True
            return
        if err.code() in FENCED_CODES and (self.producers.renewed or not self._txn_timed_out()):
            raise ProcessorStopped(EXIT_FENCED, (
                f"fenced at {stage}: another processor with transactional.id "
                f"{self.settings.transactional_id!r} has started (same instance_id); this one stops. "
                f"Give each running processor its own RUNFOLD_INSTANCE_ID. ({err.str()})"))
        if err.fatal():
            if self.producers.renewed:  # a second one in a row: not a one-off, stop
                raise ProcessorStopped(EXIT_FATAL, f"fatal Kafka error at {stage}: {err.str()}")
            self._renew_producer(err, stage)
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:  # a delivery failed: the broker's limit
            self._output_too_large(err.str())
            return
        self._abort(f"{stage}: {err.str()}")

    def _produce_failed(self, err: KafkaError, stage: str) -> None:
        """produce() raised: fenced or fatal stops; anything else aborts. `_STATE` means a delivery
        already failed the transaction (e.g. a record over the broker's limit, reported
        asynchronously): commit_transaction cannot succeed in that state and returns the
        delivery's error, which `_txn_failed` acts on (too large → find and park the input)."""
        if err.code() in FENCED_CODES or err.fatal():
            self._txn_failed(KafkaException(err), stage)
            return
        if err.code() == KafkaError._QUEUE_FULL and self._txn_inputs() > 1:
            # The same batch would fill the queue again: replay it one record per transaction.
            self._isolate_left = max(self._isolate_left, self._txn_inputs())
        if err.code() == KafkaError._STATE and self.txn.open:
            producer = self.producers.current
            assert producer is not None
            try:
                with self._bounded("commit_transaction"):
                    producer.commit_transaction(KAFKA_TIMEOUT_S)
            except KafkaException as e:
                self._txn_failed(e, stage)
                return
            raise ProcessorStopped(EXIT_FATAL, f"{stage}: produce failed ({err.str()}) yet the transaction "
                                               "committed; restart to restore from the committed log")
        self._abort(f"{stage}: {err.str()}")

    def _txn_inputs(self) -> int:
        txn = self.txn
        return sum(n - txn.start[tp] for tp, n in txn.next.items())

    def _output_too_large(self, reason: str) -> None:
        """A record of this transaction was too large for the broker. With exactly one input in
        the transaction, that input is the cause: park it (the second time without its original
        bytes, in case the dead letter is what is too large). Otherwise replay the transaction's
        input one record per transaction to find it."""
        txn = self.txn
        if self._txn_inputs() == 1:
            (topic, p), off = next((tp, n - 1) for tp, n in txn.next.items() if n > txn.start[tp])
            parked = self._poison.get((topic, p, off))
            self._poison[(topic, p, off)] = (parked[0], min(parked[1] + 1, 2)) if parked else (reason, 0)
            self.log.warning("input produces a record too large for the broker: dead-lettering it", extra={
                "topic": topic, "partition": p, "offset": off, "reason": reason})
        else:
            self._isolate_left = max(self._isolate_left, self._txn_inputs())
            self.log.warning("record too large for the broker: replaying the batch one record per "
                             "transaction", extra={"records": self._isolate_left, "reason": reason})
        # Each such abort makes progress (an input marked, its level raised, or the batch split),
        # so it does not grow the back-off meant for what keeps failing (a broker down).
        self._aborts_in_a_row = 0
        self._abort(f"output too large: {reason}")

    def _after_isolated_commit(self) -> None:
        txn = self.txn
        if self._isolate_left:
            self._isolate_left = max(0, self._isolate_left - self._txn_inputs())
        for key in [k for k in self._poison if k[2] < txn.next.get((k[0], k[1]), -1)]:
            del self._poison[key]  # committed as a dead letter

    def _renew_producer(self, err: KafkaError, stage: str) -> None:
        """A fatal error on the current producer (producers.py); its transaction went with it."""
        self.producers.renew(err, stage)
        self.txn.open = False  # txn.start still rewinds the input

    def _call_abandoned(self, call: str, e: CallAbandoned) -> None:
        """`call` did not return (librdkafka#5456, #5511: it can wait for good on a coordinator
        lost across a broker restart): its producer is left behind, and a new one's
        init_transactions aborts the open transaction at the coordinator; the input is
        rewound as for any abort."""
        try:
            self.producers.abandon(call, e)
        except ProcessorStopped:
            self.txn.reset()  # its records went with the abandoned producer; the restart rewinds
            raise
        self.txn.open = False
        self._abort(f"{call} did not return")

    def _abort(self, reason: str) -> None:
        txn = self.txn
        producer, consumer = self.producers.current, self._consumer
        assert producer is not None and consumer is not None
        if txn.open:
            try:
                with self._bounded("abort_transaction"):
                    producer.abort_transaction(KAFKA_TIMEOUT_S)
            except KafkaException as e:
                err = e.args[0]
                if err.code() in FENCED_CODES or err.fatal():
                    self._txn_failed(e, "abort")  # stops, or replaces the producer and rewinds
                    return
                if err.code() != KafkaError._TIMED_OUT:
                    # Notably _CONFLICT after a commit that timed out: the commit may still land,
                    # so the input must not be replayed here; the restart restores from the log.
                    raise ProcessorStopped(EXIT_FATAL, f"abort_transaction failed: {err.str()}") from e
                # The abort itself timed out: it goes on inside librdkafka and can wait for good
                # on a coordinator lost across a broker restart. A new producer's
                # init_transactions aborts the transaction at the coordinator instead.
                self.producers.replace("abort_transaction timed out", "abort_timed_out", error=err.str())
        for (t, p), off in txn.start.items():
            # A partition no longer assigned raises: its next owner starts from the committed offset.
            with contextlib.suppress(KafkaException):
                consumer.seek(TopicPartition(t, p, off))
        self.metrics.transactions.labels("aborted").inc()
        self._aborts_in_a_row += 1
        self.log.warning("transaction aborted", extra={
            "reason": reason, "records": txn.records, "aborts_in_a_row": self._aborts_in_a_row})
        txn.reset()
        self.producers.advance()
        # Back off when something keeps failing (broker down, topic deleted): no tight loop.
        self.stop_event.wait(min(0.05 * (2 ** min(self._aborts_in_a_row, 7)), 5.0))

    # ---- rebalance callbacks (run inside consumer.poll/consume/close) -------------------------
    def _is_current(self, consumer: Consumer) -> bool:
        return consumer is self._consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return  # a replaced consumer closing (see _replace_consumer)
        self._unassigned_since = None
        by_topic: dict[str, set[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, set()).add(tp.partition)
        cmds = by_topic.get(self.topics.commands, set())
        rcps = by_topic.get(self.topics.receipts, set())
        consumer.assign(partitions)
        consumer.pause(partitions)
        if cmds != rcps:
            self._fatal = ProcessorStopped(EXIT_FATAL, (
                f"assignment does not co-locate commands {sorted(cmds)} and receipts {sorted(rcps)}: "
                "the group must use partition.assignment.strategy=range and equal partition counts"))
            self.stop_event.set()
            return
        self.partitions.open(sorted(cmds))
        self.log.info("partitions assigned", extra={"partitions": sorted(cmds),
                                                    "owned": self.partitions.owned()})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return
        if self.txn.open:
            if self._fatal is None:
                try:
                    self._commit()
                except ProcessorStopped as e:
                    self._fatal = e
                    self.stop_event.set()
            else:
                self.txn.reset()
        self._unassigned_since = time.monotonic()
        revoked = sorted({tp.partition for tp in partitions})
        self.partitions.close(revoked)
        self.log.info("partitions revoked", extra={"partitions": revoked})

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return
        if self.txn.open and self._fatal is None:
            try:
                self._abort("partitions lost (session timed out)")
            except ProcessorStopped as e:
                self._fatal = e
                self.stop_event.set()
        self._session_lost_at = self._unassigned_since = time.monotonic()
        lost = sorted({tp.partition for tp in partitions})
        self.partitions.close(lost)
        self.log.warning("partitions lost", extra={"partitions": lost})

    # ---- errors and lag --------------------------------------------------------------------
    def _on_stall(self, stalled_s: float, stack: str) -> None:
        """Watchdog thread: the loop has not begun an iteration for `stall_timeout_ms`."""
        self.metrics.loop_stalls.inc()
        self.log.error("processor loop stalled" + ("; exiting so that it is restarted" if self._exit_on_stall
                                                   else ""),
                       extra={"stalled_s": round(stalled_s, 1), "exit_code": EXIT_STALLED, "stack": stack})
        if self._exit_on_stall:
            logging.shutdown()  # flush the handlers: the loop thread holds no lock we need
            os._exit(EXIT_STALLED)  # the stuck call cannot be interrupted; uncommitted work is redone

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            if err.code() in FENCED_CODES and not self._txn_timed_out():
                self._fatal = ProcessorStopped(EXIT_FENCED, (
                    f"fenced: another processor with instance id {self.settings.instance_id!r} has started; "
                    f"this one stops. Give each running processor its own RUNFOLD_INSTANCE_ID. ({err.str()})"))
                self.stop_event.set()
            else:
                # The failing call says so too: a transactional one replaces the producer once
                # (_renew_producer), a consumer's arrives as a _FATAL message (_on_consume_error).
                self.log.error("fatal Kafka client error", extra={"error": err.str()})
        else:
            repeats = self._client_errors.admit(err.str(), time.monotonic())
            if repeats is not None:  # librdkafka repeats a down cluster many times a second
                self.log.warning("kafka client error", extra={"error": err.str(), "repeats_suppressed": repeats})

    def _on_consume_error(self, m: Any) -> None:
        err = m.error()
        if err.fatal() or err.code() == KafkaError._FATAL:
            # A consumer's fatal error arrives as a message with code _FATAL (fatal() is False):
            # the consumer fetches and rebalances no more, so this must never be just logged.
            self._consumer_failed = err
            return
        if m.topic() is None and "committed offsets" in err.str():
            # An OffsetFetch answered NOT_COORDINATOR as a whole (the coordinator moved: broker
            # restart or fencing) leaves the assigned partitions without a position for good:
            # librdkafka neither retries nor fetches (confluentinc/librdkafka#5586). A new
            # consumer asks the new coordinator.
            self._consumer_failed = err
        self.log.warning("consume error", extra={"error": err.str(), "topic": m.topic(),
                                                 "partition": m.partition()})

    def _replace_consumer(self, err: KafkaError) -> None:
        """After a session timeout librdkafka rejoins as a static member with a new member id
        while a request with the old id is still in flight; the coordinator answers that one
        FENCED_INSTANCE_ID and librdkafka fences *itself* for good (confluentinc/librdkafka#3437):
        a silent stall. Shortly after our own session loss that is the cause, so a new consumer
        (same group.instance.id) rejoins and takes the partitions back. Otherwise another
        processor runs with our instance id, or the consumer failed for another reason: stop.
        A consumer whose committed offsets could not be fetched (librdkafka#5586) is replaced too."""
        self._consumer_failed = None
        stuck = (not err.fatal() and err.code() not in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID))
        if stuck:  # no offsets fetched, or no assignment
            # at most one replacement per _REPLACE_SPACING_S while the coordinator keeps moving
            self.stop_event.wait(max(0.0, self._consumer_replaced_at + _REPLACE_SPACING_S - time.monotonic()))
        elif not (self._session_lost_recently() or self._rejoin_stale):
            if "fenced" in err.str().lower():
                raise ProcessorStopped(EXIT_FENCED, (
                    f"consumer fenced: another processor with instance id {self.settings.instance_id!r} "
                    f"joined the group; this one stops. Give each running processor its own "
                    f"RUNFOLD_INSTANCE_ID. ({err.str()})"))
            raise ProcessorStopped(EXIT_FATAL, f"fatal consumer error: {err.str()}")
        assert self._consumer is not None and self.partitions is not None
        self.log.warning("input consumer failed; replacing it", extra={
            "error": err.str(), "seconds_since_session_lost": round(time.monotonic() - self._session_lost_at, 1)})
        if self.txn.open:
            self._abort(f"input consumer failed: {err.str()}")
        self.partitions.close(self.partitions.owned())  # restored again when reassigned
        old = self._consumer
        self._consumer = self._new_consumer()
        self._subscribe()
        self._session_lost_at = -1e9  # one replacement per session loss
        self._rejoin_stale = False
        self._consumer_replaced_at = time.monotonic()
        # Closing a failed consumer can block until its in-flight group requests time out (a
        # JoinGroup waits up to the rebalance timeout): close it aside; its rebalance callbacks
        # are ignored (they name a consumer that is no longer ours).
        threading.Thread(target=self._close_failed, args=(old,), name="close-failed-consumer",
                         daemon=True).start()
        self.log.info("input consumer replaced; rejoining the group", extra={"group": self.settings.group})

    def _session_lost_recently(self) -> bool:
        """Our own session loss (on_lost) happened within the window where a FENCED_INSTANCE_ID is
        our stale membership rather than another instance with our id; one replacement per loss."""
        window = max(30.0, 3 * self.settings.session_timeout_ms / 1000.0)
        return time.monotonic() - self._session_lost_at <= window

    def _check_membership(self) -> None:
        """A consumer that gets no assignment (not even an empty one) long after subscribing or
        losing its partitions is stuck outside the group: after a coordinator move librdkafka was
        seen never to rejoin. Replace it like a failed one."""
        since = self._unassigned_since
        bound = max(30.0, 3 * self.settings.session_timeout_ms / 1000.0)
        if since is not None and self._consumer_failed is None and time.monotonic() - since > bound:
            self._consumer_failed = KafkaError(KafkaError._TIMED_OUT, f"no partition assignment {bound:.0f} s "
                                               "after joining the group")

    def _close_failed(self, consumer: Consumer) -> None:
        t0 = time.monotonic()
        try:
            consumer.close()
        except Exception as e:
            self.log.warning("closing the failed consumer failed", extra={"error": str(e)})
        self.log.info("failed consumer closed", extra={"close_ms": round((time.monotonic() - t0) * 1000)})

    def _refresh_statuses(self) -> None:
        assert self.partitions is not None
        self.metrics.set_run_statuses([s.stats for s in self.partitions.ready()])

    def _purge_finished(self) -> None:
        """Finished runs past `finished_retention_ms` leave the local store and the run-state
        table: a transaction of their run-state tombstones, whose commit applies the store
        deletions (overlay). Only between transactions, so no overlay holds a purged run; an
        abort leaves them for the next pass. A pass takes at most a page per partition; while
        one fills a page the next pass follows at once, so a backlog (a burst of runs finishing
        together) drains at the loop's pace rather than a page a second."""
        assert self.partitions is not None
        self._next_purge = time.monotonic() + _PURGE_EVERY_S
        now = _now_ms()
        due = [(store, store.due_purges(now, self.purge_page)) for store in self.partitions.ready()]
        due = [(store, runs) for store, runs in due if runs]
        self._purge_more = any(len(runs) >= self.purge_page for _, runs in due)
        if not due:
            return
        self._begin()
        try:
            for store, runs in due:
                ov = self._overlay(store.partition, store)
                for xkey, run_id, status in runs:
                    if status is not None:  # else a stale entry: only it goes
                        self._produce(self.topics.run_state, None, run_id.encode(), partition=store.partition)
                        self.txn.counters.purged += 1
                    ov.purge(xkey, run_id, status)
        except ProduceFailed as e:  # the next pass takes them again
            self._produce_failed(e.err, "purge")
            return
        self._commit()

    def _report_lag(self) -> None:
        self._next_lag = time.monotonic() + _LAG_EVERY_S
        consumer = self._consumer
        assert consumer is not None and self.partitions is not None
        tps = [TopicPartition(t, p) for p in self.partitions.owned()
               for t in (self.topics.commands, self.topics.receipts)]
        if not tps:
            return
        try:
            for tp in consumer.position(tps):
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))
        except KafkaException:
            pass
