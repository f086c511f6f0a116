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
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors.engine import Catalog, Ceilings, EngineContext
from processors.kafka.exits import (  # re-exported: the exit codes callers know the loop by
    EXIT_FATAL,
    EXIT_FENCED,
    EXIT_OK,
    EXIT_STALLED,
    FENCED_CODES,
    ProcessorStopped,
    StopRequested,
)
from processors.kafka.fetch import first_then_buffered
from processors.kafka.transactions import commit_resuming
from processors.kafka.watchdog import CallAbandoned, Watchdog
from processors.metrics_endpoint import CannotServe
from processors.runtime import deadletter, logs
from processors.runtime.assignment import Partitions
from processors.runtime.definitions import DefinitionsReader
from processors.runtime.fold import Folder
from processors.runtime.housekeeping import Housekeeping
from processors.runtime.membership import GroupMembership
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.preflight import check_state_dir, check_topology
from processors.runtime.producers import KAFKA_TIMEOUT_S, TxnProducers
from processors.runtime.query import QueryServer
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import PURGE_PAGE
from processors.runtime.timers import TimerFirer
from processors.runtime.txn import ProduceFailed, RecordTooLarge, Txn, now_ms
from processors.runtime.txn_failures import TxnFailures
from processors.service_logs import repeat_key
from schemas import Codec


class Processor(GroupMembership, TxnFailures, Housekeeping):
    """One processor instance. Its parts: the group membership (membership.py), what happens
    when a transaction fails (txn_failures.py), purging and lag between transactions
    (housekeeping.py); the loop itself, start-up and shutdown are here."""

    def __init__(
        self,
        settings: ProcessorSettings,
        stop: threading.Event | None = None,
        ceilings: Ceilings | None = None,
        codec: Codec | None = None,
        exit_on_stall: bool = False,
    ) -> None:
        """`exit_on_stall`: a loop stuck for `stall_timeout_ms` ends the process (the CLI's
        choice: its supervisor restarts it); otherwise the stall is only logged."""
        self.settings = settings
        self.stop_event = stop or threading.Event()
        self.log = logs.get_logger()
        self.metrics = ProcessorMetrics()
        self.codec = codec or Codec.default()
        self.topics = settings.topics
        self.catalog = Catalog(ceilings)
        self.ctx = EngineContext(
            catalog=self.catalog,
            ceilings=ceilings or Ceilings(),
            queues=frozenset(settings.activation_queues),
        )
        self.txn = Txn()
        self._fatal: ProcessorStopped | None = None
        self._aborts_in_a_row = 0
        self._client_errors = logs.RepeatThrottle()  # non-fatal client errors, logged once per 10 s
        self._session_lost_at = -1e9  # monotonic time of the last on_lost (session timed out)
        self._stale_refusals = 0  # offsets refused FENCED_INSTANCE_ID since the last commit
        self._rejoin_stale = False  # the consumer is replaced for a stale membership, not another instance
        self._consumer_failed: KafkaError | None = None  # fatal input-consumer error, handled next iteration
        self._consumer_replaced_at = -1e9
        self._unassigned_since: float | None = None  # subscribed or lost/revoked, no on_assign since
        # A failure that names no input (an output too large for the broker, the commit's own
        # work raising): the transaction's input is replayed one record per transaction
        # (`_isolate_left` records) until the input that caused it is alone in a failing one;
        # that input is then parked in `_poison` (coordinates -> (reason, level: see
        # Folder.park; raised each time the parked input is refused again, dead-letter reason))
        # and dead-lettered instead of folded when it comes back.
        self._isolate_left = 0
        self._poison: dict[tuple[str, int, int], tuple[str, int, str]] = {}
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
        self._purge_turn = 0  # where the next purge pass starts (an index into the ready partitions)
        self.purge_page = PURGE_PAGE  # finished runs purged per partition and transaction
        self.folder = Folder(
            self.ctx,
            self.codec,
            self.topics,
            self._produce,
            self._on_event_delivery,
            now_ms,
            settings.finished_retention_ms,
        )
        self.timers = TimerFirer(
            self.codec, self.topics.receipts, self._produce, self.metrics, settings.timers_per_transaction
        )
        self._exit_on_stall = exit_on_stall
        # Offsets and commit get no longer than the transaction itself: the coordinator aborts
        # a transaction older than transaction_timeout_ms, so waiting longer gains nothing.
        self._txn_call_s = min(KAFKA_TIMEOUT_S, settings.transaction_timeout_ms / 1000.0)
        self.watchdog = (
            Watchdog(settings.stall_timeout_ms / 1000.0, self._on_stall)
            if settings.stall_timeout_ms
            else None
        )

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
        self.log.info(
            "processor starting", extra={"settings": s.redacted(), "transactional_id": s.transactional_id}
        )
        check_state_dir(s)
        # The ports first: one in use stops this instance before it fences its predecessor.
        # (Run queries answer 503 "starting" and /health ready=false until the loop is up.)
        try:
            if s.metrics_port is not None:
                self.metrics_port = self.metrics.serve(s.metrics_port, s.http_host)
            if s.query_port is not None:
                self._query = QueryServer(self, s.http_host, s.query_port)
                self.query_port = self._query.port
        except CannotServe as e:  # a port in use: say which, not a traceback
            raise ProcessorStopped(EXIT_FATAL, str(e)) from e
        self._consumer = self._new_consumer()
        partitions = self.partition_count = check_topology(
            self._consumer, s, KAFKA_TIMEOUT_S, self.stop_event
        )
        self.folder.set_partitions(partitions)
        self.producers.start(self.stop_event)
        self.partitions = Partitions(s, self.folder, self.metrics, self.log)
        self._definitions = DefinitionsReader(
            s.side_consumer_config("definitions"),
            self.topics.definitions,
            self.catalog,
            self.codec,
            self.metrics,
            self.log,
        )
        n = self._definitions.catch_up(KAFKA_TIMEOUT_S, self.stop_event)
        self._subscribe()
        self.log.info(
            "processor started",
            extra={
                "definitions": n,
                "partitions": partitions,
                "group": s.group,
                "metrics_port": self.metrics_port,
                "query_port": self.query_port,
            },
        )
        self.ready.set()

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
        self.log.info(
            "processor stopped cleanly" if self._fatal is None else "processor shut down",
            extra={"transactional_id": self.settings.transactional_id},
        )

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
            msgs = first_then_buffered(consumer, batch, self._idle_timeout())
        if self._fatal is not None:  # a rebalance callback inside poll/consume failed: stop now
            return
        if msgs:
            self._fold(msgs)
        now = now_ms()
        for store in self.partitions.ready():
            if TimerFirer.any_due(store, now):
                self._begin()
                try:
                    self.timers.fire_due(store, self._overlay(store.partition, store), now)
                except (RecordTooLarge, ProduceFailed) as e:  # _STATE: an earlier delivery failed
                    self._produce_failed(
                        e.err
                        if isinstance(e, ProduceFailed)
                        else KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, str(e)),
                        "timers",
                    )
                    break
        # the inputs of the transaction this iteration may commit (or of one a failed fold aborted)
        folded = max(txn.records if txn.open else 0, len(msgs))
        if txn.open and (not msgs or txn.records >= batch or time.monotonic() >= txn.deadline):
            self._commit()
        if (
            not txn.open
            and self.settings.finished_retention_ms > 0
            and (self._purge_more or time.monotonic() >= self._next_purge)
        ):
            self._purge_finished(folded)
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
        now = now_ms()
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
                    fold(ov, counters, topic, p, off, m.key(), m.value(), m.timestamp()[1], m.headers)
                else:
                    self.folder.park(ov, counters, topic, p, off, m.key(), m.value(), *parked)
            except (RecordTooLarge, ProduceFailed) as e:
                # Nothing produced in this transaction can be taken back: abort, and rewind the
                # records of this batch not folded yet too (their partitions may be new to it).
                for rest in msgs[i + 1 :]:
                    if rest.error() is None:
                        txn.start.setdefault((rest.topic(), rest.partition()), rest.offset())
                if isinstance(e, RecordTooLarge):  # the first reason stays: the dead letter's
                    self._poison[(topic, p, off)] = (
                        (parked[0], min(parked[1] + 1, 2), parked[2])
                        if parked
                        else (str(e), 0, deadletter.OUTPUT_TOO_LARGE)
                    )
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
                raise RecordTooLarge(
                    f"{topic} record of {len(value or b'')} bytes refused: {err.str()}"
                ) from e
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
            try:
                for p, ov in txn.overlays.items():
                    self.folder.snapshots(ov, p, txn.counters)
            except (KafkaException, RecordTooLarge, ProduceFailed):
                raise
            except Exception as e:  # no input is named (every state was serialized at its fold): find it
                self._isolate(
                    f"{type(e).__name__} while writing the run-state snapshots: {e}",
                    deadletter.UNSERIALIZABLE,
                    "a run-state snapshot could not be written",
                )
                return
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
        self.metrics.flush_batch(
            c.records_in, c.records_out, c.dead, c.dropped, c.rejected, txn.records, c.misrouted, c.retimed
        )
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

    def _bounded(
        self, call: str, timeout_s: float = KAFKA_TIMEOUT_S
    ) -> contextlib.AbstractContextManager[None]:
        """A transactional call, watched against its timeout (watchdog.py)."""
        return self.watchdog.call(call, timeout_s) if self.watchdog is not None else contextlib.nullcontext()

    def _commit_transaction(self, producer: Producer) -> None:
        """A retriable failure (a timeout: the commit goes on in the background) must be resumed
        by calling commit_transaction again, never aborted ("Conflicting commit_transaction API
        call"): its outcome is unknown until a call returns it (kafka/transactions.py). After 5
        attempts the error goes to `_txn_failed`, whose abort then stops the processor (a restart
        restores from the log)."""
        commit_resuming(
            producer,
            self._txn_call_s,
            lambda err, attempt: self.log.warning(
                "commit_transaction failed, resuming it", extra={"error": err.str(), "attempt": attempt}
            ),
            lambda: self._bounded("commit_transaction", self._txn_call_s),
        )

    def _txn_timed_out(self) -> bool:
        """The open transaction began longer than transaction_timeout_ms ago (this process was
        frozen: GC, CPU starvation, SIGSTOP): the coordinator has aborted it and bumped the
        producer epoch (KIP-890), so a fence now is our own doing, not another instance's."""
        txn = self.txn
        began = txn.deadline - self.settings.commit_interval_ms / 1000.0
        return txn.open and time.monotonic() - began >= self.settings.transaction_timeout_ms / 1000.0

    # ---- errors and lag --------------------------------------------------------------------
    def _on_stall(self, stalled_s: float, stack: str) -> None:
        """Watchdog thread: the loop has not begun an iteration for `stall_timeout_ms`."""
        self.metrics.loop_stalls.inc()
        self.log.error(
            "processor loop stalled" + ("; exiting so that it is restarted" if self._exit_on_stall else ""),
            extra={"stalled_s": round(stalled_s, 1), "exit_code": EXIT_STALLED, "stack": stack},
        )
        if self._exit_on_stall:
            logging.shutdown()  # flush the handlers: the loop thread holds no lock we need
            os._exit(EXIT_STALLED)  # the stuck call cannot be interrupted; uncommitted work is redone

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            if err.code() in FENCED_CODES and not self._txn_timed_out():
                self._fatal = ProcessorStopped(
                    EXIT_FENCED,
                    (
                        f"fenced: another processor with instance id {self.settings.instance_id!r} has started; "
                        f"this one stops. Give each running processor its own RUNFOLD_INSTANCE_ID. ({err.str()})"
                    ),
                )
                self.stop_event.set()
            else:
                # The failing call says so too: a transactional one replaces the producer once
                # (_renew_producer), a consumer's arrives as a _FATAL message (_on_consume_error).
                self.log.error("fatal Kafka client error", extra={"error": err.str()})
        else:
            repeats = self._client_errors.admit(repeat_key(err.str()), time.monotonic())
            if repeats is not None:  # librdkafka repeats a down cluster many times a second
                self.log.warning(
                    "kafka client error", extra={"error": err.str(), "repeats_suppressed": repeats}
                )
