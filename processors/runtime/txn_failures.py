"""When a transaction fails: abort and rewind the input, replace a producer that failed, stop
when fenced, and find the input whose outputs the broker refuses as too large. The
`Failures` a `Transaction` (txn.py) hands each failed step to."""

from __future__ import annotations

from logging import Logger

from confluent_kafka import KafkaError, KafkaException

from processors.kafka.exits import FENCED_CODES, ExitCode, ProcessorStopped
from processors.kafka.watchdog import CallAbandoned
from processors.runtime import deadletter
from processors.runtime.membership import GroupMembership
from processors.runtime.producers import KAFKA_TIMEOUT_S, Bounded, TxnProducers
from processors.runtime.settings import ProcessorSettings
from processors.runtime.txn import Transaction

_MAX_STALE_REFUSALS = 3


class TxnFailures:
    """The `Failures` of a `Transaction` (txn.py): how each failed step is answered."""

    def __init__(
        self,
        settings: ProcessorSettings,
        txn: Transaction,
        producers: TxnProducers,
        membership: GroupMembership,
        log: Logger,
        bounded: Bounded,
    ) -> None:
        self._settings = settings
        self._txn = txn
        self._producers = producers
        self._membership = membership
        self._log = log
        self._bounded = bounded
        self._stale_refusals = 0  # offsets refused FENCED_INSTANCE_ID since the last commit
        # A failure that names no input (an output too large for the broker, the commit's own
        # work raising): the transaction's input is replayed one record per transaction
        # (`isolate_left` records) until the input that caused it is alone in a failing one;
        # that input is then parked in `poison` (coordinates -> (reason, level: see
        # Folder.park; raised each time the parked input is refused again, dead-letter reason))
        # and dead-lettered instead of folded when it comes back (loop.py).
        self.isolate_left = 0
        self.poison: dict[tuple[str, int, int], tuple[str, int, str]] = {}

    def txn_failed(self, e: KafkaException, stage: str) -> None:
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
            self._log.warning(
                "offsets refused: stale group membership; aborting and replacing the consumer",
                extra={"error": err.str(), "refusals": self._stale_refusals},
            )
            self._txn.abort(f"{stage}: {err.str()}")
            self._membership.consumer_failed = err
            self._membership.rejoin_stale = True
            return
        if err.code() in FENCED_CODES and (self._producers.renewals.recent or not self._txn.timed_out()):
            raise ProcessorStopped(
                ExitCode.FENCED,
                (
                    f"fenced at {stage}: another processor with transactional.id "
                    f"{self._settings.transactional_id!r} has started (same instance_id); this one stops. "
                    f"Give each running processor its own RUNFOLD_INSTANCE_ID. ({err.str()})"
                ),
            )
        if err.fatal():
            if self._producers.renewals.recent:  # a second one in a row: not a one-off, stop
                raise ProcessorStopped(ExitCode.FATAL, f"fatal Kafka error at {stage}: {err.str()}")
            self._renew_producer(err, stage)
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:  # a delivery failed: the broker's limit
            self.output_too_large(err.str())
            return
        self._txn.abort(f"{stage}: {err.str()}")

    def produce_failed(self, err: KafkaError, stage: str) -> None:
        """produce() raised: fenced or fatal stops; anything else aborts. `_STATE` means a delivery
        already failed the transaction (e.g. a record over the broker's limit, reported
        asynchronously): commit_transaction cannot succeed in that state and returns the
        delivery's error, which `txn_failed` acts on (too large → find and park the input)."""
        if err.code() in FENCED_CODES or err.fatal():
            self.txn_failed(KafkaException(err), stage)
            return
        if err.code() == KafkaError._QUEUE_FULL and self._txn.inputs() > 1:
            # The same batch would fill the queue again: replay it one record per transaction.
            self.isolate_left = max(self.isolate_left, self._txn.inputs())
        if err.code() == KafkaError._STATE and self._txn.open:
            producer = self._producers.current
            assert producer is not None
            try:
                with self._bounded("commit_transaction", KAFKA_TIMEOUT_S):
                    producer.commit_transaction(KAFKA_TIMEOUT_S)
            except KafkaException as e:
                self.txn_failed(e, stage)
                return
            raise ProcessorStopped(
                ExitCode.FATAL,
                f"{stage}: produce failed ({err.str()}) yet the transaction "
                "committed; restart to restore from the committed log",
            )
        self._txn.abort(f"{stage}: {err.str()}")

    def output_too_large(self, reason: str) -> None:
        """A record of this transaction was too large for the broker: find its input (`isolate`)."""
        self.isolate(reason, deadletter.OUTPUT_TOO_LARGE, "input produces a record too large for the broker")

    def isolate(self, reason: str, cause: str, what: str) -> None:
        """The transaction failed for a reason that names no input (`cause`, a dead-letter
        reason: the broker refused a record as too large, or the commit's own work raised).
        With exactly one input in the transaction, that input is the cause: park it (the
        second time without its original bytes, in case the dead letter is what is too large).
        Otherwise replay the transaction's input one record per transaction to find it."""
        txn = self._txn
        if self._txn.inputs() == 1:
            (topic, p), off = next((tp, n - 1) for tp, n in txn.next.items() if n > txn.start[tp])
            parked = self.poison.get((topic, p, off))
            self.poison[(topic, p, off)] = (
                (parked[0], min(parked[1] + 1, 2), parked[2]) if parked else (reason, 0, cause)
            )
            self._log.warning(
                what + ": dead-lettering it",
                extra={"topic": topic, "partition": p, "offset": off, "reason": reason},
            )
        else:
            self.isolate_left = max(self.isolate_left, self._txn.inputs())
            self._log.warning(
                what + ": replaying the batch one record per transaction",
                extra={"records": self.isolate_left, "reason": reason},
            )
        # Each such abort makes progress (an input marked, its level raised, or the batch split),
        # so it does not grow the back-off meant for what keeps failing (a broker down).
        self._txn.aborts_in_a_row = 0
        self._txn.abort(f"{cause}: {reason}")

    def committed(self) -> None:
        """After a commit: a commit is progress (no stale refusals since), and the inputs
        isolated or parked that it committed are done with."""
        self._stale_refusals = 0
        if not (self.isolate_left or self.poison):
            return
        txn = self._txn
        if self.isolate_left:
            self.isolate_left = max(0, self.isolate_left - self._txn.inputs())
        for key in [k for k in self.poison if k[2] < txn.next.get((k[0], k[1]), -1)]:
            del self.poison[key]  # committed as a dead letter

    def _renew_producer(self, err: KafkaError, stage: str) -> None:
        """A fatal error on the current producer (producers.py); its transaction went with it."""
        self._producers.renew(err, stage)
        self._txn.open = False  # txn.start still rewinds the input

    def call_abandoned(self, call: str, e: CallAbandoned) -> None:
        """`call` did not return (librdkafka#5456, #5511: it can wait for good on a coordinator
        lost across a broker restart): its producer is left behind, and a new one's
        init_transactions aborts the open transaction at the coordinator; the input is
        rewound as for any abort."""
        try:
            self._producers.abandon(call, e)
        except ProcessorStopped:
            self._txn.reset()  # its records went with the abandoned producer; the restart rewinds
            raise
        self._txn.open = False
        self._txn.abort(f"{call} did not return")
