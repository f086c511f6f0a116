"""The open transaction (one at a time per processor): its bookkeeping, and the commit protocol
as numbered steps in one place — begin, produce, commit, abort (cf. Quix Streams'
checkpointing/checkpoint.py).

A commit is: (1) one run-state snapshot per touched run, (2) send_offsets_to_transaction with
the consumer's group metadata, (3) commit_transaction, resumed (never aborted) on a timeout,
(4) only then the overlays go to RocksDB, with the run-events offsets the delivery reports gave,
(5) the metrics of the transaction, (6) the bookkeeping reset and the next transaction on the
other producer. A step 1-3 that fails goes to `Failures` (txn_failures.py), which aborts and
rewinds, isolates the input that caused it, replaces the producer, or stops; a failure at 4
stops the processor (Kafka has the transaction; restore catches the store up).

An abort is: (1) abort_transaction (fenced or fatal: to `Failures`; a timeout: a new producer
aborts it at the coordinator), (2) the input seeks back to the transaction's first offsets, (3)
counted, logged, reset, the next transaction on the other producer, (4) a back-off that grows
while aborts repeat with no progress.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from logging import Logger
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors.kafka.exits import FENCED_CODES, ExitCode, ProcessorStopped
from processors.kafka.transactions import GroupMetadata, commit_resuming
from processors.kafka.watchdog import CallAbandoned
from processors.runtime import deadletter
from processors.runtime.fold import TxnCounters
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.producers import KAFKA_TIMEOUT_S, Bounded, TxnProducers
from processors.runtime.settings import ProcessorSettings

# A commit longer than this is logged with the time of each of its steps.
SLOW_COMMIT_S = 1.0


class RecordTooLarge(Exception):
    """produce() refused a record over the client's `message.max.bytes`."""


class ProduceFailed(Exception):
    """produce() failed otherwise (e.g. `_STATE`: an earlier delivery already failed the
    transaction); the transaction must abort."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


class Failures(Protocol):
    """What is done when a step of the transaction fails (txn_failures.TxnFailures)."""

    def txn_failed(self, e: KafkaException, stage: str) -> None: ...
    def produce_failed(self, err: KafkaError, stage: str) -> None: ...
    def call_abandoned(self, call: str, e: CallAbandoned) -> None: ...
    def output_too_large(self, reason: str) -> None: ...
    def isolate(self, reason: str, cause: str, what: str) -> None: ...
    def committed(self) -> None: ...


Snapshots = Callable[[PartitionOverlay, int, TxnCounters], None]


class Transaction:
    def __init__(
        self,
        settings: ProcessorSettings,
        producers: TxnProducers,
        metrics: ProcessorMetrics,
        log: Logger,
        bounded: Bounded,
        stop: threading.Event,
    ) -> None:
        self._settings = settings
        self._producers = producers
        self._metrics = metrics
        self._log = log
        self._bounded = bounded
        self._stop = stop
        # Offsets and commit get no longer than the transaction itself: the coordinator aborts
        # a transaction older than transaction_timeout_ms, so waiting longer gains nothing.
        self.call_s = min(KAFKA_TIMEOUT_S, settings.transaction_timeout_ms / 1000.0)
        # The parts it works with, each of which works with it (attach).
        self._snapshots: Snapshots | None = None
        self._failures: Failures | None = None
        self._on_committed: Callable[[], None] = lambda: None
        self.input: Consumer | None = None  # the input consumer (membership.py keeps it current)
        # its group metadata for send_offsets, kept per generation (membership.py forgets it at
        # every rebalance callback, abort here)
        self.group_metadata = GroupMetadata()
        # The bookkeeping of the open transaction.
        self.open = False
        self.began = 0.0  # monotonic time it began
        self.deadline = 0.0  # monotonic time by which it commits (commit_interval_ms)
        self.records = 0  # inputs folded into it
        self.overlays: dict[int, PartitionOverlay] = {}
        self.start: dict[tuple[str, int], int] = {}  # first offset per input partition
        self.next: dict[tuple[str, int], int] = {}  # offset to commit per input partition
        self.event_offsets: dict[int, int] = {}  # max run-events offset per partition
        self.counters = TxnCounters()
        self.aborts_in_a_row = 0  # since the last commit or other progress: the back-off

    def attach(self, snapshots: Snapshots, failures: Failures, on_committed: Callable[[], None]) -> None:
        """The parts that themselves work with the transaction (the folder writes its records
        through `produce`, the failure handling aborts it): given once they exist.
        `on_committed` runs after a commit that touched a run (the status gauges)."""
        self._snapshots = snapshots
        self._failures = failures
        self._on_committed = on_committed

    @property
    def failures(self) -> Failures:
        assert self._failures is not None, "Transaction.attach was not called"
        return self._failures

    def reset(self) -> None:
        self.open = False
        self.records = 0
        self.overlays.clear()
        self.start.clear()
        self.next.clear()
        self.event_offsets.clear()
        self.counters.clear()

    def inputs(self) -> int:
        """Input records folded into the open transaction."""
        return sum(n - self.start[tp] for tp, n in self.next.items())

    def overlay(self, partition: int, store: Any) -> PartitionOverlay:
        ov = self.overlays.get(partition)
        if ov is None:
            ov = self.overlays[partition] = PartitionOverlay(store)
        return ov

    def timed_out(self) -> bool:
        """The open transaction began longer than transaction_timeout_ms ago (this process was
        frozen: GC, CPU starvation, SIGSTOP): the coordinator has aborted it and bumped the
        producer epoch (KIP-890), so a fence now is our own doing, not another instance's."""
        return self.open and time.monotonic() - self.began >= self._settings.transaction_timeout_ms / 1000.0

    # ---- begin -----------------------------------------------------------------------------
    def begin(self) -> None:
        """Open a transaction, unless one is open:
        1. the current producer, made fit first (a failed or cut-off one is replaced);
        2. begin_transaction (a fatal error that is not a fence renews the producer, once);
        3. open, to commit by now + commit_interval_ms."""
        if self.open:
            return
        producers = self._producers
        producers.prepare_current()  # 1
        producer = producers.current
        assert producer is not None
        try:  # 2
            with self._bounded("begin_transaction", KAFKA_TIMEOUT_S):
                producer.begin_transaction()
        except KafkaException as e:  # only fatal or state errors can happen here
            err: KafkaError = e.args[0]
            if err.fatal() and err.code() not in FENCED_CODES and not producers.renewals.recent:
                producers.renew(err, "begin")
                return self.begin()
            raise ProcessorStopped(ExitCode.FATAL, f"begin_transaction failed: {err.str()}") from e
        self.open = True  # 3
        self.began = time.monotonic()
        self.deadline = self.began + self._settings.commit_interval_ms / 1000.0

    # ---- produce (the hot path: every output record) -------------------------------------------
    def produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        producer = self._producers.current
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

    def on_event_delivery(self, err: KafkaError | None, msg: Any) -> None:
        """A run event's delivery report: the highest offset per partition goes to the store
        with the overlay (the restore's starting point)."""
        if err is None:
            offsets = self.event_offsets
            p = msg.partition()
            off = msg.offset()
            if off > offsets.get(p, -1):
                offsets[p] = off

    # ---- commit ----------------------------------------------------------------------------
    def commit(self) -> None:
        """Commit the open transaction (the steps in the module docstring)."""
        producer, consumer = self._producers.current, self.input
        assert producer is not None and consumer is not None and self._snapshots is not None
        failures = self.failures
        t0 = time.perf_counter()
        try:
            try:  # 1
                for p, ov in self.overlays.items():
                    self._snapshots(ov, p, self.counters)
            except (KafkaException, RecordTooLarge, ProduceFailed):
                raise
            except Exception as e:  # no input is named (every state was serialized at its fold): find it
                failures.isolate(
                    f"{type(e).__name__} while writing the run-state snapshots: {e}",
                    deadletter.UNSERIALIZABLE,
                    "a run-state snapshot could not be written",
                )
                return
            t1 = time.perf_counter()
            flush_s = 0.0
            if self.next:  # 2
                offsets = [TopicPartition(t, p, o) for (t, p), o in self.next.items()]
                flush_s = self._producers.send_offsets(offsets, self.group_metadata.of(consumer), self.call_s)
            t2 = time.perf_counter()
            self._commit_transaction(producer)  # 3
        except KafkaException as e:
            if e.args[0].code() == KafkaError._STATE:
                # "Erroneous state": a delivery failed first; learn which (too large → find and
                # park the input), as when produce() says so, instead of replaying the same batch.
                failures.produce_failed(e.args[0], "commit")
            else:
                failures.txn_failed(e, "commit")
            return
        except CallAbandoned as e:
            failures.call_abandoned("send_offsets_to_transaction", e)
            return
        except RecordTooLarge as e:  # a run-state snapshot: which input made it is not known
            failures.output_too_large(str(e))
            return
        except ProduceFailed as e:
            failures.produce_failed(e.err, "commit")
            return
        t3 = time.perf_counter()
        self._metrics.commit_latency.observe(t3 - t0)
        self._metrics.transactions.labels("committed").inc()
        if t3 - t0 >= SLOW_COMMIT_S:
            # Which call waited, and on what: the records' leaders (flush), the coordinators
            # (offsets), EndTxn; the figures a failover's stall is read from.
            self._log.warning(
                "slow commit",
                extra={
                    "seconds": round(t3 - t0, 3),
                    "snapshots_s": round(t1 - t0, 3),
                    "flush_s": round(flush_s, 3),
                    "send_offsets_s": round(t2 - t1, 3),
                    "commit_transaction_s": round(t3 - t2, 3),
                    "records": self.records,
                    "open_s": round(time.monotonic() - self.began, 3),
                },
            )
        try:  # 4
            for p, ov in self.overlays.items():
                ov.write(self.event_offsets.get(p))
        except Exception as e:
            # Kafka has the transaction; the store is now behind and restore will catch it up.
            raise ProcessorStopped(ExitCode.FATAL, f"state store write failed after commit: {e}") from e
        c = self.counters  # 5
        self._metrics.flush_batch(
            c.records_in, c.records_out, c.dead, c.dropped, c.rejected, self.records, c.misrouted, c.retimed
        )
        if c.purged:
            self._metrics.runs_purged.inc(c.purged)
        if self.overlays:
            self._on_committed()
        self.aborts_in_a_row = 0
        self._producers.renewals.committed()
        failures.committed()  # before the reset: it reads which inputs this one committed
        self.reset()  # 6
        self._producers.advance()

    def _commit_transaction(self, producer: Producer) -> None:
        """A retriable failure (a timeout: the commit goes on in the background) must be resumed
        by calling commit_transaction again, never aborted ("Conflicting commit_transaction API
        call"): its outcome is unknown until a call returns it (kafka/transactions.py). While no
        broker answers, or a broker it names is down (`cluster_whole`), it is resumed for up to 5
        minutes more (not once a stop is requested); after 5 attempts with a whole cluster, the
        error goes to `Failures.txn_failed`, whose abort then stops the processor (a restart
        restores from the log)."""

        def resuming(err: KafkaError, attempt: int) -> None:
            self._log.warning(
                "commit_transaction failed, resuming it", extra={"error": err.str(), "attempt": attempt}
            )
            self._producers.alive()  # a commit waiting for a lost cluster is not a stuck loop

        commit_resuming(
            producer,
            self.call_s,
            resuming,
            lambda: self._bounded("commit_transaction", self.call_s),
            cluster_lost=lambda: not self._stop.is_set() and not self._producers.cluster_whole(),
        )

    # ---- abort -----------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Abort the open transaction and rewind its input (the steps in the module docstring)."""
        producers = self._producers
        producer, consumer = producers.current, self.input
        assert producer is not None and consumer is not None
        self.group_metadata.forget()  # refused offsets (a stale generation) end here too
        if self.open:  # 1
            try:
                with self._bounded("abort_transaction", KAFKA_TIMEOUT_S):
                    producer.abort_transaction(KAFKA_TIMEOUT_S)
            except KafkaException as e:
                err = e.args[0]
                if err.code() in FENCED_CODES or err.fatal():
                    self.failures.txn_failed(e, "abort")  # stops, or replaces the producer and rewinds
                    return
                if err.code() != KafkaError._TIMED_OUT:
                    # Notably _CONFLICT after a commit that timed out: the commit may still land,
                    # so the input must not be replayed here; the restart restores from the log.
                    raise ProcessorStopped(ExitCode.FATAL, f"abort_transaction failed: {err.str()}") from e
                # The abort itself timed out: it goes on inside librdkafka and can wait for good
                # on a coordinator lost across a broker restart. A new producer's
                # init_transactions aborts the transaction at the coordinator instead.
                producers.replace("abort_transaction timed out", "abort_timed_out", error=err.str())
        for (t, p), off in self.start.items():  # 2
            # A partition no longer assigned raises: its next owner starts from the committed offset.
            with contextlib.suppress(KafkaException):
                consumer.seek(TopicPartition(t, p, off))
        self._metrics.transactions.labels("aborted").inc()  # 3
        self.aborts_in_a_row += 1
        self._log.warning(
            "transaction aborted",
            extra={
                "reason": reason,
                "records": self.records,
                "aborts_in_a_row": self.aborts_in_a_row,
                "open_s": round(time.monotonic() - self.began, 3),
            },
        )
        self.reset()
        producers.advance()
        # 4: back off when something keeps failing (broker down, topic deleted): no tight loop.
        self._stop.wait(min(0.05 * (2 ** min(self.aborts_in_a_row, 7)), 5.0))


def now_ms() -> int:
    return time.time_ns() // 1_000_000
