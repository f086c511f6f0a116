"""The processor's two transactional producers: which one runs the next transaction, and
replacing one that failed, lost the cluster or is stuck inside a call.

Two producers, used in turn: a transaction begun right after the previous one's EndTxn on the
same transactional id finds the coordinator still writing its markers, and librdkafka retries
AddPartitionsToTxn after a fixed 20 ms (9-25 % of transactions, docs/runtime.md). The other
id's last transaction ended a whole commit earlier. Strictly one transaction at a time: N is
committed before N+1 begins. `alternate_producers=false` runs every transaction on the first
(both are still initialised, so a zombie's second one is fenced too).

A replaced producer is dropped and never called again; the new one's init_transactions fences
it and aborts what it left open at the coordinator. The caller owns the transaction and
rewinds its input. Why each replacement exists is in docs/runtime.md ("recovered in-process").
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from logging import Logger
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from processors.kafka.coordinators import SHAKEN_CODES, CoordinatorWatch, StaleWait, cluster_whole
from processors.kafka.exits import FENCED_CODES, ExitCode, ProcessorStopped
from processors.kafka.fetch import connect_first
from processors.kafka.transactions import WAIT_ROUND_S, Renewals, init_transactions_waiting
from processors.kafka.watchdog import CALL_GRACE_S, CallAbandoned, CallThread, send_offsets_flushing
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.settings import ProcessorSettings
from processors.service_logs import kafka_log
from topology.settings import cluster_answers

KAFKA_TIMEOUT_S = 30.0
# A call librdkafka does not return in time is given up after its own timeout plus this,
# before the watchdog's grace (CALL_GRACE_S) would restart the process for it.
ABANDON_AFTER_S = CALL_GRACE_S / 2
# Abandoned calls still running (each holds a thread and a client): past this many, the
# process is restarted instead.
MAX_STUCK_CALLS = 3

Bounded = Callable[[str, float], contextlib.AbstractContextManager[None]]


class TxnProducers:
    def __init__(
        self,
        settings: ProcessorSettings,
        metrics: ProcessorMetrics,
        log: Logger,
        bounded: Bounded,
        on_client_error: Callable[[KafkaError], None],
        alive: Callable[[], None] = lambda: None,
    ) -> None:
        """`bounded(call, timeout)` watches a transactional call (the loop's watchdog);
        `on_client_error` gets every error callback after the producers' own bookkeeping;
        `alive()` tells the loop's watchdog that a wait for the cluster is not a stuck loop."""
        self._settings = settings
        self._metrics = metrics
        self._log = log
        self._bounded = bounded
        self._on_client_error = on_client_error
        self.alive = alive
        self._stop = threading.Event()  # the process's stop request (start): ends a wait for the cluster
        self._producers: list[Producer | None] = [None, None]
        self.slot = 0  # the producer of the current / next transaction
        self.failed: list[KafkaError | None] = [None, None]  # a fatal error callback, per slot
        self.cut_off = [False, False]  # saw every broker down since its init, per slot
        # Where each one's coordinators were when it began; whether they moved since a broker was lost.
        self.watches: list[CoordinatorWatch | None] = [None, None]
        self.renewals = Renewals()  # one failed fatally and was replaced recently, nothing committed since
        self._calls = CallThread("runfold-txn-call")  # send_offsets_to_transaction, which may never return
        # Producers left inside such a call, with the call's done event: never called again,
        # nor destroyed while the call runs.
        self._abandoned: list[tuple[Producer, threading.Event]] = []

    # ---- which producer ----------------------------------------------------------------------
    def start(self, stop: threading.Event) -> None:
        """Both producers, initialised; a stop request while the cluster does not answer yet
        ends the wait (StopRequested)."""
        self._stop = stop
        self._producers = [self.new(0, stop), self.new(1, stop)]

    @property
    def current(self) -> Producer | None:
        return self._producers[self.slot]

    def advance(self) -> None:
        """After a commit or an abort: the next transaction uses the other producer."""
        if self._settings.alternate_producers:
            self.slot ^= 1

    def poll_idle(self) -> None:
        """Serve the other producer's error callbacks, also when it is not alternated with."""
        idle = self._producers[self.slot ^ 1]
        if idle is not None:
            idle.poll(0)

    def new(self, slot: int, stop: threading.Event | None = None) -> Producer:
        """A producer for `slot`, initialised. At start-up (`stop` given) a cluster that does not
        answer within KAFKA_TIMEOUT_S stops the processor. A replacement while running waits
        for as long as the cluster is not whole (no broker answers: a whole cluster down or
        restarted; or a broker it names does not accept connections: two of three lost, below
        min ISR and without a controller quorum), as the consumer does: a stop request ends the
        wait (StopRequested); an error from a whole cluster stops the processor (exit 1)."""
        s = self._settings
        producer = Producer(
            {
                **s.producer_config(slot),
                "error_cb": functools.partial(self.on_error, slot),
                "logger": kafka_log(),
            }
        )
        connect_first(producer, s.topics.run_events)
        tid = s.transactional_ids[slot]

        def waiting(err: KafkaError, rounds: int) -> None:
            self._log.warning(
                "the cluster cannot serve init_transactions yet (no broker answers, or too few to "
                "elect the transaction coordinator): the new transactional producer waits for it",
                extra={
                    "transactional_id": tid,
                    "waited_s": round(rounds * WAIT_ROUND_S),
                    "error": err.str(),
                },
            )
            self.alive()

        try:
            # fences and aborts what an older one left open; at start-up (`stop`) as while
            # running, a cluster down or below quorum is waited for, however long (issue 48)
            init_transactions_waiting(
                producer,
                stop if stop is not None else self._stop,
                WAIT_ROUND_S,
                waiting,
                lambda: self._bounded("init_transactions", WAIT_ROUND_S),
            )
        except KafkaException as e:
            raise ProcessorStopped(
                ExitCode.FATAL, f"init_transactions failed for {tid}: {e.args[0].str()}"
            ) from e
        self.watches[slot] = CoordinatorWatch(producer, s.transactional_ids[slot], s.group)
        return producer

    def on_error(self, slot: int, err: KafkaError) -> None:
        if err.fatal() and err.code() not in FENCED_CODES:
            self.failed[slot] = err
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.cut_off[slot] = True
        if err.code() in SHAKEN_CODES:
            watch = self.watches[slot]
            if watch is not None:
                watch.shaken()
        self._on_client_error(err)

    # ---- before a transaction begins ---------------------------------------------------------
    def prepare_current(self) -> None:
        """Make the current producer fit to begin a transaction: serve its error callbacks
        first (it sat idle through the other's whole transaction, and begin_transaction on a
        producer already failed fatally can block for good, librdkafka#4420); replace it if it
        failed fatally meanwhile, or if it saw the whole cluster unreachable and the cluster
        answers again."""
        producer = self.current
        assert producer is not None
        producer.poll(0)
        failed = self.failed[self.slot]
        if failed is not None:
            if self.renewals.recent:  # the other one was just replaced too: not a one-off, stop
                raise ProcessorStopped(ExitCode.FATAL, f"fatal Kafka error (idle producer): {failed.str()}")
            self.renew(failed, "begin (failed while idle)")
        elif self.cut_off[self.slot] and self.cluster_answers():
            # librdkafka keeps its coordinator and broker handles across such an outage, and
            # send_offsets_to_transaction can then wait for good on a coordinator handle that
            # never comes back up (librdkafka#5456, #5511).
            self.replace("it saw the whole cluster unreachable", "cluster_unreachable")
        else:
            watch = self.watches[self.slot]
            moved = watch.moved() if watch is not None else None
            if moved is not None:
                # librdkafka would keep the old coordinators' handles (coordinators.py)
                self.replace(moved, "coordinator_moved")

    def cluster_answers(self) -> bool:
        assert self.current is not None
        return cluster_answers(self.current, 2.0, self._settings.topics.commands)

    def cluster_whole(self) -> bool:
        """The cluster answers and every broker it names accepts connections (`cluster_whole`):
        a commit in doubt is resumed while it is not, as while no broker answers."""
        assert self.current is not None
        return cluster_whole(self.current, 2.0, self._settings.topics.commands)

    # ---- replacing one -----------------------------------------------------------------------
    def renew(self, err: KafkaError, stage: str) -> None:
        """A fatal transactional error that is not another instance's fencing: typically this
        process was frozen past transaction_timeout_ms, the coordinator aborted the transaction
        and bumped the epoch, and the producer's next call fails (PRODUCER_FENCED, or
        INVALID_TXN_STATE when queued messages timed out first). A new producer carries on. At
        most once until a commit or RENEW_AGAIN_AFTER_S have passed (`Renewals`)."""
        self.replace("it failed fatally", "fatal", stage=stage, error=err.str())
        self.renewals.renewed()

    def replace(self, why: str, reason: str, **extra: Any) -> None:
        """A new producer for the current slot; the old one is purged and dropped."""
        slot = self.slot
        self._log.warning(
            f"replacing the transactional producer: {why}",
            extra={"transactional_id": self._settings.transactional_ids[slot], **extra},
        )
        old = self._producers[slot]
        self._producers[slot] = None
        if old is not None:
            with contextlib.suppress(Exception):
                old.purge()
        old_watch = self.watches[slot]
        shaken_at = old_watch.shaken_at if old_watch is not None else None
        self._producers[slot] = self.new(slot)
        watch = self.watches[slot]
        if watch is not None:  # a broker lost a moment ago may still move coordinators
            watch.shaken_at = shaken_at
        self.failed[slot] = None
        self.cut_off[slot] = False
        self._metrics.producers_replaced.labels(reason).inc()

    # ---- the call that may never return ------------------------------------------------------
    def send_offsets(self, offsets: list[TopicPartition], group: Any, timeout_s: float) -> float:
        """send_offsets_to_transaction on the current producer, from a helper thread, while the
        transaction's records are flushed (the flush's seconds are returned): CallAbandoned if
        it has not returned after its timeout + ABANDON_AFTER_S."""
        producer = self.current
        assert producer is not None
        s = self._settings
        watch = self.watches[self.slot]
        stale = StaleWait(
            producer,
            s.transactional_ids[self.slot],
            s.group,
            known=watch.known if watch is not None else None,
        )
        with self._bounded("send_offsets_to_transaction", timeout_s):
            return send_offsets_flushing(
                self._calls, producer, offsets, group, timeout_s, timeout_s + ABANDON_AFTER_S, stale.check
            )

    def abandon(self, call: str, e: CallAbandoned) -> None:
        """Leave the current producer inside `call`, never to be called nor destroyed while the
        call runs, and go on with a new one (the caller rewinds). Too many such calls still
        running: stop, so that the restart frees them."""
        producer = self.current
        assert producer is not None
        self._abandoned.append((producer, e.done))
        self._producers[self.slot] = None  # not purged nor dropped: its call may still be running
        if self.stuck_calls() > MAX_STUCK_CALLS:
            raise ProcessorStopped(
                ExitCode.STUCK,
                f"{self.stuck_calls()} {call} calls never returned; "
                "restart the process to free the clients left inside them",
            )
        self.replace(f"{call} did not return", "call_abandoned", error=str(e))

    def stuck_calls(self) -> int:
        """Abandoned calls still running. Producers whose call has returned since are let go."""
        self._abandoned = [(p, done) for p, done in self._abandoned if not done.is_set()]
        return len(self._abandoned)

    # ---- the end -----------------------------------------------------------------------------
    def flush(self, timeout_s: float) -> None:
        for producer in self._producers:
            if producer is not None:
                producer.flush(timeout_s)

    def close(self) -> None:
        self._calls.close()
