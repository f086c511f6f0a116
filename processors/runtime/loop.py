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

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processors import native_engine
from processors.engine import Catalog, Ceilings, EngineContext
from processors.kafka.exits import (
    FENCED_CODES,
    ExitCode,
    ProcessorStopped,
    Stopping,
    StopRequested,
)
from processors.kafka.fetch import first_then_buffered
from processors.kafka.watchdog import Watchdog
from processors.metrics_endpoint import CannotServe
from processors.runtime import deadletter, logs
from processors.runtime.assignment import Partitions
from processors.runtime.definitions import DefinitionsReader
from processors.runtime.fold import Folder
from processors.runtime.housekeeping import Housekeeping
from processors.runtime.membership import GroupMembership
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.preflight import check_state_dir, check_topology
from processors.runtime.producers import KAFKA_TIMEOUT_S, TxnProducers
from processors.runtime.query import QueryServer
from processors.runtime.queue_watch import QueueWatch
from processors.runtime.settings import ProcessorSettings
from processors.runtime.timers import TimerFirer
from processors.runtime.txn import ProduceFailed, RecordTooLarge, Transaction, now_ms
from processors.runtime.txn_failures import TxnFailures
from processors.service_logs import repeat_key
from schemas import Codec


class Processor:
    """One processor instance, composed of its parts: the open transaction and its commit
    protocol (txn.py), what is done when one fails (txn_failures.py), the input consumer's
    group membership and the partitions it owns (membership.py), purging and lag between
    transactions (housekeeping.py). The loop itself, start-up and shutdown are here."""

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
        self.stopping = Stopping(stop)
        self.stop_event = self.stopping.event
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
        self._client_errors = logs.RepeatThrottle()  # non-fatal client errors, logged once per 10 s
        self.producers = TxnProducers(
            settings, self.metrics, self.log, self._bounded, self._on_client_error, self._alive
        )
        self.txn = Transaction(
            settings, self.producers, self.metrics, self.log, self._bounded, self.stop_event
        )
        self.folder = Folder(
            self.ctx,
            self.codec,
            self.topics,
            self.txn.produce,
            self.txn.on_event_delivery,
            now_ms,
            settings.finished_retention_ms,
        )
        self.timers = TimerFirer(
            self.codec, self.topics.receipts, self.txn.produce, self.metrics, settings.timers_per_transaction
        )
        self.membership = GroupMembership(settings, self.txn, self.stopping, self.log, self._on_client_error)
        self.failures = TxnFailures(
            settings, self.txn, self.producers, self.membership, self.log, self._bounded
        )
        self.housekeeping = Housekeeping(
            self.topics,
            self.txn,
            self.failures,
            self.membership,
            self.metrics,
            marker=self.folder.purged_marker,
        )
        self.txn.attach(self.folder.snapshots, self.failures, self.housekeeping.refresh_statuses)
        self._definitions: DefinitionsReader | None = None
        self.queue_watch = QueueWatch(settings, self.metrics, self.log)
        self.folder.definition_missing = self._definition_missing
        self._definitions_current_at = 0  # wall ms before which every definition record is applied
        self._definitions_read_at = -1e9  # monotonic time of the last read_to_now
        self._query: Any = None
        self.partition_count = 0
        self.metrics_port: int | None = None
        self.query_port: int | None = None
        self.ready = threading.Event()  # set once definitions are loaded and the group joined
        self._exit_on_stall = exit_on_stall
        self.watchdog = (
            Watchdog(settings.stall_timeout_ms / 1000.0, self._on_stall)
            if settings.stall_timeout_ms
            else None
        )

    @property
    def partitions(self) -> Partitions | None:
        """The stores of the partitions this instance owns (None before start-up)."""
        return self.membership.partitions

    # ---- lifecycle -------------------------------------------------------------------------
    def run(self) -> ExitCode:
        """Run until `stop_event` is set; returns the process exit code."""
        code = ExitCode.OK
        try:
            if self.watchdog is not None:
                self.watchdog.start()
            self._start()
            while not self.stop_event.is_set():
                if self.watchdog is not None:
                    self.watchdog.beat()
                self._iterate()
                if self.stopping.fatal is not None:
                    raise self.stopping.fatal
            if self.stopping.fatal is not None:
                raise self.stopping.fatal
            if self.txn.open:
                self.txn.commit()
        except StopRequested:
            self.log.info("stop requested while waiting for the cluster")
        except ProcessorStopped as e:
            self.stopping.fatal = e
            code = e.code
            self.log.error("processor stopped", extra={"reason": str(e), "exit_code": code})
        except Exception as e:
            self.stopping.fatal = ProcessorStopped(ExitCode.FATAL, f"{type(e).__name__}: {e}")
            code = ExitCode.FATAL
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
            "processor starting",
            extra={
                "settings": s.redacted(),
                "transactional_id": s.transactional_id,
                "engine": native_engine.running(),  # compiled or interpreted (`runfold engine status`)
            },
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
        except CannotServe as e:  # a port in use, a token refused: say which, not a traceback
            raise ProcessorStopped(ExitCode.CONFIG, str(e)) from e
        consumer = self.membership.connect()
        partitions = self.partition_count = check_topology(consumer, s, KAFKA_TIMEOUT_S, self.stop_event)
        self.folder.set_partitions(partitions)
        self.producers.start(self.stop_event)
        self.membership.partitions = Partitions(s, self.folder, self.metrics, self.log)
        self._definitions = DefinitionsReader(
            s.side_consumer_config("definitions"),
            self.topics.definitions,
            self.catalog,
            self.codec,
            self.metrics,
            self.log,
        )
        n = self._definitions.catch_up(KAFKA_TIMEOUT_S, self.stop_event)
        self.membership.subscribe()
        self.queue_watch.start()
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
        if self.membership.consumer is not None:
            try:
                self.membership.consumer.close()  # runs on_revoke: commits or drops what is open, closes stores
            except Exception as e:
                self.log.warning("consumer close failed", extra={"error": str(e)})
        if self.partitions is not None:
            self.partitions.close_all()
            self.partitions.close_readers()
        if self.stopping.fatal is None:
            self.producers.flush(5)
        self.queue_watch.close()
        if self._definitions is not None:
            self._definitions.close()
        if self._query is not None:
            self._query.close()
        self.metrics.close()
        self.log.info(
            "processor stopped cleanly" if self.stopping.fatal is None else "processor shut down",
            extra={"transactional_id": self.settings.transactional_id},
        )

    # ---- one iteration ---------------------------------------------------------------------
    def _iterate(self) -> None:
        membership = self.membership
        consumer, partitions = membership.consumer, membership.partitions
        assert consumer is not None and self._definitions is not None and partitions is not None
        if membership.consumer_failed is not None:
            membership.replace_consumer(membership.consumer_failed)
            return
        self._definitions.poll()
        if partitions.restoring:
            partitions.restore_step(consumer, 0.0 if self.txn.open else 0.01)
        txn = self.txn
        batch = 1 if self.failures.isolate_left > 0 else self.settings.batch_size
        if txn.open:
            msgs = consumer.consume(batch - txn.records, 0) if txn.records < batch else []
        else:
            msgs = first_then_buffered(consumer, batch, self._idle_timeout())
        if self.stopping.fatal is not None:  # a rebalance callback inside poll/consume failed: stop now
            return
        if msgs:
            self._fold(msgs)
        now = now_ms()
        for store in partitions.ready():
            if TimerFirer.any_due(store, now):
                txn.begin()
                try:
                    self.timers.fire_due(store, txn.overlay(store.partition, store), now)
                except (RecordTooLarge, ProduceFailed) as e:  # _STATE: an earlier delivery failed
                    self.failures.produce_failed(
                        e.err
                        if isinstance(e, ProduceFailed)
                        else KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, str(e)),
                        "timers",
                    )
                    break
        # the inputs of the transaction this iteration may commit (or of one a failed fold aborted)
        folded = max(txn.records if txn.open else 0, len(msgs))
        if txn.open and (not msgs or txn.records >= batch or time.monotonic() >= txn.deadline):
            txn.commit()
        chores = self.housekeeping
        if (
            not txn.open
            and self.settings.finished_retention_ms > 0
            and (chores.purge_more or time.monotonic() >= chores.next_purge)
        ):
            chores.purge_finished(folded)
        if time.monotonic() >= chores.next_lag:
            chores.report_lag()
            chores.refresh_statuses()
            membership.check()
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

    def _fold(self, msgs: list[Any]) -> None:
        partitions = self.partitions
        assert partitions is not None
        txn = self.txn
        txn.begin()
        overlays = txn.overlays
        fold = self.folder.fold_input
        counters = txn.counters
        not_ready: dict[tuple[str, int], int] = {}
        poison = self.failures.poison
        for i, m in enumerate(msgs):
            if m.error() is not None:
                self.membership.on_consume_error(m)
                continue
            topic = m.topic()
            p = m.partition()
            ov = overlays.get(p)
            tp = (topic, p)
            if ov is None:
                store = partitions.ready_store(p)
                if store is None:  # fetched before it was paused: give it back untouched
                    not_ready.setdefault(tp, m.offset())
                    continue
                ov = txn.overlay(p, store)
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
                    poison[(topic, p, off)] = (
                        (parked[0], min(parked[1] + 1, 2), parked[2])
                        if parked
                        else (str(e), 0, deadletter.OUTPUT_TOO_LARGE)
                    )
                    txn.abort(f"output too large: {e}")
                else:
                    self.failures.produce_failed(e.err, "produce")
                break
        else:
            txn.records += len(msgs)
        if not_ready:
            self._give_back(not_ready)

    def _definition_missing(self, record_ts: int) -> None:
        """A StartRun names a definition the catalog lacks. If it was produced after the
        definitions were last read to their end, the definition may have been registered just
        before it (`runfold defs register` then `runs start`) and not be polled yet: read the
        definitions topic up to now before the command is decided, so it is not rejected
        NotFound by mistake. At most once per 10 ms (a flood of starts of unknown definitions
        costs a watermark query per 10 ms, not per command); `record_ts` <= 0: no timestamp."""
        reader = self._definitions
        if reader is None or (0 < record_ts <= self._definitions_current_at):
            return
        mono = time.monotonic()
        if mono - self._definitions_read_at < 0.01:
            return
        self._definitions_read_at = mono
        began = now_ms()
        try:
            if reader.read_to_now(1.0):
                self._definitions_current_at = began
        except KafkaException as e:  # the command is decided on what is known
            self.log.warning("definitions not read to their end", extra={"error": str(e)})

    def _give_back(self, offsets: dict[tuple[str, int], int]) -> None:
        consumer = self.membership.consumer
        assert consumer is not None
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        for tp in tps:
            consumer.seek(tp)
        consumer.pause(tps)

    def _alive(self) -> None:
        """A wait for the cluster (a producer replaced while no broker answers) is not a stall."""
        if self.watchdog is not None:
            self.watchdog.beat()

    def _bounded(
        self, call: str, timeout_s: float = KAFKA_TIMEOUT_S
    ) -> contextlib.AbstractContextManager[None]:
        """A transactional call, watched against its timeout (watchdog.py)."""
        return self.watchdog.call(call, timeout_s) if self.watchdog is not None else contextlib.nullcontext()

    # ---- errors and lag --------------------------------------------------------------------
    def _on_stall(self, stalled_s: float, stack: str) -> None:
        """Watchdog thread: the loop has not begun an iteration for `stall_timeout_ms`."""
        self.metrics.loop_stalls.inc()
        self.log.error(
            "processor loop stalled" + ("; exiting so that it is restarted" if self._exit_on_stall else ""),
            extra={"stalled_s": round(stalled_s, 1), "exit_code": ExitCode.STUCK, "stack": stack},
        )
        if self._exit_on_stall:
            logging.shutdown()  # flush the handlers: the loop thread holds no lock we need
            os._exit(ExitCode.STUCK)  # the stuck call cannot be interrupted; uncommitted work is redone

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            if err.code() in FENCED_CODES and not self.txn.timed_out():
                self.stopping.fail(
                    ProcessorStopped(
                        ExitCode.FENCED,
                        (
                            f"fenced: another processor with instance id {self.settings.instance_id!r} has "
                            "started; this one stops. Give each running processor its own "
                            f"RUNFOLD_INSTANCE_ID. ({err.str()})"
                        ),
                    )
                )
            else:
                # The failing call says so too: a transactional one replaces the producer once
                # (TxnFailures._renew_producer), a consumer's arrives as a _FATAL message
                # (GroupMembership.on_consume_error).
                self.log.error("fatal Kafka client error", extra={"error": err.str()})
        else:
            repeats = self._client_errors.admit(repeat_key(err.str()), time.monotonic())
            if repeats is not None:  # librdkafka repeats a down cluster many times a second
                self.log.warning(
                    "kafka client error", extra={"error": err.str(), "repeats_suppressed": repeats}
                )
