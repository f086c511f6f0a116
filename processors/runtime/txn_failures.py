"""When a transaction fails: abort and rewind the input, replace a producer that failed, stop
when fenced, and find the input whose outputs the broker refuses as too large. A part of
`Processor` (loop.py), which owns the state declared here."""

from __future__ import annotations

import contextlib
import threading
from logging import Logger
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from processors.kafka.exits import EXIT_FATAL, EXIT_FENCED, FENCED_CODES, ProcessorStopped
from processors.kafka.watchdog import CallAbandoned
from processors.runtime import deadletter
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.producers import KAFKA_TIMEOUT_S, TxnProducers
from processors.runtime.settings import ProcessorSettings
from processors.runtime.txn import Txn

_MAX_STALE_REFUSALS = 3


class TxnFailures:
    settings: ProcessorSettings
    txn: Txn
    producers: TxnProducers
    metrics: ProcessorMetrics
    log: Logger
    stop_event: threading.Event
    _consumer: Consumer | None
    _consumer_failed: KafkaError | None
    _rejoin_stale: bool
    _stale_refusals: int  # offsets refused FENCED_INSTANCE_ID since the last commit
    _aborts_in_a_row: int
    # Output too large: see Processor.__init__
    _isolate_left: int
    _poison: dict[tuple[str, int, int], tuple[str, int, str]]

    if TYPE_CHECKING:

        def _bounded(
            self, call: str, timeout_s: float = KAFKA_TIMEOUT_S
        ) -> contextlib.AbstractContextManager[None]: ...
        def _txn_timed_out(self) -> bool: ...

    def _txn_failed(self, e: KafkaException, stage: str) -> None:
        err: KafkaError = e.args[0]
        if (
            err.code() == KafkaError.FENCED_INSTANCE_ID
            and not err.fatal()
            and stage != "abort"
            and self._stale_refusals < _MAX_STALE_REFUSALS
        ):
            # The offsets' group metadata names a member id the coordinator has replaced: our
            # consumer rejoined (after our own session loss, or a broker restart) and the id
            # sent is stale (librdkafka#3437), or another instance joined with our id. That one
            # initialised its transactional producers, with our ids, before joining, so ours are
            # fenced and the abort fails right there and stops us (exit 3). Otherwise rejoin with
            # a new consumer. Refused again and again with no commit between: stop as fenced.
            self._stale_refusals += 1
            self.log.warning(
                "offsets refused: stale group membership; aborting and replacing the consumer",
                extra={"error": err.str(), "refusals": self._stale_refusals},
            )
            self._abort(f"{stage}: {err.str()}")
            self._consumer_failed = err
            self._rejoin_stale = True
            return
        if err.code() in FENCED_CODES and (self.producers.renewed or not self._txn_timed_out()):
            raise ProcessorStopped(
                EXIT_FENCED,
                (
                    f"fenced at {stage}: another processor with transactional.id "
                    f"{self.settings.transactional_id!r} has started (same instance_id); this one stops. "
                    f"Give each running processor its own RUNFOLD_INSTANCE_ID. ({err.str()})"
                ),
            )
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
            raise ProcessorStopped(
                EXIT_FATAL,
                f"{stage}: produce failed ({err.str()}) yet the transaction "
                "committed; restart to restore from the committed log",
            )
        self._abort(f"{stage}: {err.str()}")

    def _txn_inputs(self) -> int:
        txn = self.txn
        return sum(n - txn.start[tp] for tp, n in txn.next.items())

    def _output_too_large(self, reason: str) -> None:
        """A record of this transaction was too large for the broker: find its input (`_isolate`)."""
        self._isolate(reason, deadletter.OUTPUT_TOO_LARGE, "input produces a record too large for the broker")

    def _isolate(self, reason: str, cause: str, what: str) -> None:
        """The transaction failed for a reason that names no input (`cause`, a dead-letter
        reason: the broker refused a record as too large, or the commit's own work raised).
        With exactly one input in the transaction, that input is the cause: park it (the
        second time without its original bytes, in case the dead letter is what is too large).
        Otherwise replay the transaction's input one record per transaction to find it."""
        txn = self.txn
        if self._txn_inputs() == 1:
            (topic, p), off = next((tp, n - 1) for tp, n in txn.next.items() if n > txn.start[tp])
            parked = self._poison.get((topic, p, off))
            self._poison[(topic, p, off)] = (
                (parked[0], min(parked[1] + 1, 2), parked[2]) if parked else (reason, 0, cause)
            )
            self.log.warning(
                what + ": dead-lettering it",
                extra={"topic": topic, "partition": p, "offset": off, "reason": reason},
            )
        else:
            self._isolate_left = max(self._isolate_left, self._txn_inputs())
            self.log.warning(
                what + ": replaying the batch one record per transaction",
                extra={"records": self._isolate_left, "reason": reason},
            )
        # Each such abort makes progress (an input marked, its level raised, or the batch split),
        # so it does not grow the back-off meant for what keeps failing (a broker down).
        self._aborts_in_a_row = 0
        self._abort(f"{cause}: {reason}")

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
        self.log.warning(
            "transaction aborted",
            extra={"reason": reason, "records": txn.records, "aborts_in_a_row": self._aborts_in_a_row},
        )
        txn.reset()
        self.producers.advance()
        # Back off when something keeps failing (broker down, topic deleted): no tight loop.
        self.stop_event.wait(min(0.05 * (2 ** min(self._aborts_in_a_row, 7)), 5.0))
