"""The child-run executor: child activations become commands, child outcomes become receipts.

Inputs (one consumer, `read_committed`, group `<prefix>-child-executor`):
- `<p>.child-activations`: `ChildRunActivation` -> `StartRun` for `child_run_id` (the pinned
  bundle, the parent ref, the input); `ChildRunCancel` -> `CancelRun` for the child. An
  activation whose `deadline_ms` has passed starts nothing (deadlines are absolute, so time
  queued counts): the parent's node-timeout timer, due at the same deadline, settles the step
  with `Timeout` under the node's retry policy, as it does for an action the worker refuses.
- `<p>.run-events`: a child's `RunSucceeded` / `RunFailed` / `RunCancelled` -> a
  `ChildRunFinished` receipt keyed by the parent run id (a `RunRejected` of a child's
  `StartRun`, e.g. depth or input, -> `ChildRunFinished` failed, so the parent never hangs;
  a `RunRejected` NotFound of a `CancelRun`, a child never started, -> `ChildRunFinished`
  cancelled: the parent's stopping step has its stop, engine/stopping.py).

Each polled batch is one Kafka transaction: the produced commands/receipts and the consumed
offsets commit together, so a crash neither loses nor duplicates an outcome.

Which runs are children, and whose: a child's `RunAccepted` carries its `ParentRef`; the
executor keeps child_run_id -> parent step in memory from those events (both live in the
child's run-events partition, so the instance that sees a child's terminal event also saw its
`RunAccepted`, unless it restarted or the partition moved in between). For a run it has no
entry for, it derives the parent step from the child run id itself, whose format is fixed by
the contract (`{parent}/{node}[{lineage}]#{attempt}`); the parent's dispatch id is recomputed
from it. So a restart needs no rebuild. A root run whose client-chosen id happens to match
that format would yield a receipt the processor drops as stale (no such step).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from processors.engine.ids import dispatch_id
from processors.engine.vocabulary import TERMINAL_EVENTS, CancelRunCommand, StartRunCommand, zero_usage
from processors.executors.metrics import ChildBatchTally, ChildExecutorMetrics
from processors.executors.settings import LOOPBACK
from processors.kafka.coordinators import SHAKEN_CODES, CoordinatorWatch, StaleWait, cluster_whole
from processors.kafka.exits import (
    FENCED_CODES,
    ExitCode,
    StopRequested,
)
from processors.kafka.fetch import connect_first, first_then_buffered
from processors.kafka.records import coordinates
from processors.kafka.transactions import WAIT_ROUND_S, Renewals, commit_resuming, init_transactions_waiting
from processors.kafka.watchdog import CallAbandoned, CallThread, send_offsets_flushing
from processors.metrics_endpoint import CannotServe
from processors.service_logs import ClusterUnreachable, await_cluster, kafka_log
from schemas import Codec, DecodeError
from topology.catalog import TopicNames
from topology.settings import (
    KafkaSettings,
    consumer_config,
    load_settings,
    transactional_producer_config,
)

log = logging.getLogger("runfold.child_executor")
TXN_TIMEOUT_S = 30.0
# send_offsets_to_transaction and commit_transaction: a broker lost moves its coordinators
# within Kafka's broker session (9 s by default), so 10 s is enough and a longer wait only
# holds the children's commands back (the processor gives them the same).
CALL_TIMEOUT_S = 10.0
# send_offsets_to_transaction can wait for good on a coordinator lost across a broker restart
# (librdkafka#5456, #5511; docs/runtime.md): past its timeout + this, the executor leaves the
# call and its producer behind and goes on with a new producer, as the processor does.
ABANDON_AFTER_S = 5.0
# Abandoned calls still running (each holds a thread and a client): past this many, exit 4.
MAX_STUCK_CALLS = 3
# lineage: a map index ("3"), or an agent tool call's "~t.i" / "3~t.i" (docs/messages.md)
CHILD_ID = re.compile(
    r"^(?P<parent>.+)/(?P<node>[^/\[\]#]+)(?:\[(?P<lineage>[0-9~.]+)\])?(?:#(?P<attempt>\d+))?$"
)


class Stuck(Exception):
    """Too many transactional calls never returned: the process must restart (exit 4)."""


def parent_step_from_id(child_run_id: str) -> dict[str, Any] | None:
    """The parent step identity encoded in a child run id, or None if it is not one."""
    m = CHILD_ID.match(child_run_id)
    if m is None:
        return None
    parent, node, lineage = m["parent"], m["node"], m["lineage"] or ""
    attempt = int(m["attempt"] or 1)
    return {
        "run_id": parent,
        "node": node,
        "lineage": lineage,
        "attempt": attempt,
        "dispatch_id": dispatch_id(parent, node, lineage, attempt),
    }


def parent_step_from_ref(child_run_id: str, parent: dict[str, Any]) -> dict[str, Any]:
    derived = parent_step_from_id(child_run_id)
    attempt = derived["attempt"] if derived else 1
    return {
        "run_id": parent["parent_run_id"],
        "node": parent["parent_node"],
        "lineage": parent.get("parent_lineage") or "",
        "attempt": attempt,
        "dispatch_id": parent["parent_dispatch_id"],
    }


def expired(act: dict[str, Any], now_ms: int) -> bool:
    """The parent step's deadline passed before the child could start."""
    deadline = act.get("deadline_ms")
    return deadline is not None and now_ms >= deadline


def start_command(act: dict[str, Any], ts_ms: int) -> StartRunCommand:
    child = act["child_run_id"]
    return {
        "type": "StartRun",
        "run_id": child,
        "ts_ms": ts_ms,
        "record_id": f"start:{child}",
        "definition_id": act["definition_id"],
        "revision": act.get("revision"),
        "input": act.get("input"),
        "parent": act["parent"],
        "bundle": act.get("bundle"),
        "budgets": None,
        "labels": {},
    }


def cancel_command(cancel: dict[str, Any], ts_ms: int) -> CancelRunCommand:
    child = cancel["child_run_id"]
    return {
        "type": "CancelRun",
        "run_id": child,
        "ts_ms": ts_ms,
        "record_id": f"cancel:{child}:{cancel['dispatch_id']}",
        "reason": cancel.get("reason") or "parent cancelled",
    }


def finished_receipt(
    step: dict[str, Any], child_run_id: str, event: dict[str, Any], ts_ms: int
) -> dict[str, Any]:
    """ChildRunFinished for a terminal (or rejected-start) event of the child."""
    kind = event["type"]
    output = failure = None
    if kind == "RunSucceeded":
        status, output = "succeeded", event.get("output")
    elif kind == "RunFailed":
        status, failure = "failed", event.get("failure")
    elif kind == "RunCancelled" or event.get("command_type") == "CancelRun":
        status = "cancelled"
        failure = {
            "code": "Cancelled",
            "message": event.get("reason") or "child run cancelled",  # (a never started one: NotFound)
            "retryable": False,
            "node": None,
            "lineage": None,
        }
    else:  # RunRejected of the child's StartRun
        status = "failed"
        failure = {
            "code": event.get("code") or "InvalidInput",
            "message": event.get("reason") or "child rejected",
            "retryable": False,
            "node": None,
            "lineage": None,
        }
    return {
        "type": "ChildRunFinished",
        "run_id": step["run_id"],
        "ts_ms": ts_ms,
        "record_id": f"finished:{child_run_id}:{event.get('sequence', 0)}",
        "node": step["node"],
        "lineage": step["lineage"],
        "attempt": step["attempt"],
        "dispatch_id": step["dispatch_id"],
        "child_run_id": child_run_id,
        "status": status,
        "output": output,
        "failure": failure,
        "usage": event.get("usage") or zero_usage(),
    }


class ChildExecutor:
    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        topic_prefix: str | None = None,
        instance_id: str = "0",
        batch: int = 500,
        metrics_port: int | None = None,
        metrics_host: str = LOOPBACK,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.kafka = kafka or load_settings()
        prefix = topic_prefix or self.kafka.topic_prefix
        self.names = TopicNames(prefix)
        self.codec = Codec.default()
        self.batch = batch
        # owned run-events partition -> child_run_id -> parent step; a revoked partition's entries
        # go with it (their children's ends are read by the partition's next owner)
        self.parents: dict[int, dict[str, dict[str, Any]]] = {}
        self._stop = threading.Event()
        self.counts = {
            "started": 0,
            "expired": 0,
            "cancelled": 0,
            "finished": 0,
            "dead_letters": 0,
            "aborts": 0,
        }
        self.metrics = ChildExecutorMetrics()
        self._metrics_at = (metrics_port, metrics_host)
        self.metrics_port: int | None = None  # bound /metrics port once serving
        self._tally = ChildBatchTally()  # the open transaction's work
        self.connect_timeout_s = connect_timeout_s
        self.consumer = Consumer(
            {
                **consumer_config(self.kafka, f"{prefix}-child-executor", read_committed=True),
                "logger": kafka_log(),
            }
        )
        self._producer_failed: KafkaError | None = None  # a fatal error reported while idle
        self._watch: CoordinatorWatch | None = None  # where its coordinators were (after init_transactions)
        self._renewals = Renewals()  # a fatal producer replaced recently with no commit since
        self._instance_id = instance_id
        self.producer = self._new_producer()
        self._calls = CallThread("runfold-child-txn-call")
        # Producers left inside a call that never returned, with its done event: never called
        # again, nor destroyed while the call runs.
        self._abandoned: list[tuple[Producer, threading.Event]] = []
        self.producers_replaced = 0

    def _new_producer(self) -> Producer:
        return Producer(
            {
                **transactional_producer_config(self.kafka, self._transactional_id, linger_ms=2),
                "error_cb": self._on_producer_error,
                "logger": kafka_log(),  # librdkafka's lines through logging, repeats collapsed
            }
        )

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def run(self, install_signals: bool = True) -> ExitCode:
        """Consume until SIGTERM/SIGINT; returns the exit code (`ExitCode`, docs/runtime.md)."""
        if install_signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        log.info("child executor starting (cluster %s)", self.kafka.bootstrap_servers)
        try:
            port, host = self._metrics_at
            if port is not None:
                self.metrics_port = self.metrics.serve(port, host)
            try:
                await_cluster(
                    self.producer,
                    self.kafka.bootstrap_servers,
                    self.connect_timeout_s,
                    self._stop,
                    self.names.commands,
                )
            except StopRequested:
                log.info("child executor stopped during start-up")
                return ExitCode.OK
            except ClusterUnreachable as exc:
                log.error("child executor stopped: %s", exc)
                return ExitCode.CONFIG
            connect_first(self.producer, self.names.commands)
            try:  # a cluster down or below quorum is waited for, however long (issue 48)
                init_transactions_waiting(self.producer, self._stop, WAIT_ROUND_S, self._init_waiting)
            except StopRequested:
                log.info("child executor stopped during start-up")
                return ExitCode.OK
            self._watch_coordinators()
            self.consumer.subscribe(
                [self.names.child_activations, self.names.run_events],
                on_assign=self._own,
                on_revoke=self._forget_parents,
                on_lost=self._forget_parents,
            )
            log.info(
                "child executor consuming %s, %s (metrics port %s)",
                self.names.child_activations,
                self.names.run_events,
                self.metrics_port,
            )
            while not self.stopping:
                msgs = first_then_buffered(self.consumer, self.batch, 0.1)
                if msgs:
                    self._transact(msgs)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() in FENCED_CODES:
                log.error("child executor stopped: fenced (another instance has its instance id): %s", exc)
                return ExitCode.FENCED
            log.error("child executor stopped: %s", exc)
            return ExitCode.FATAL
        except CannotServe as exc:
            log.error("child executor stopped: %s", exc)
            return ExitCode.CONFIG
        except StopRequested:  # while a replaced producer waited for the cluster
            log.info("child executor stopped")
            return ExitCode.OK
        except Stuck as exc:
            log.error("child executor stopped: %s; exiting so that it is restarted", exc)
            return ExitCode.STUCK
        finally:
            self.consumer.close()
            self.metrics.close()
            self._calls.close()
            kafka_log().flush()
        return ExitCode.OK

    @property
    def _transactional_id(self) -> str:
        return f"{self.names.prefix}-child-executor-{self._instance_id}"

    def _watch_coordinators(self, shaken_at: float | None = None) -> None:
        """After init_transactions: where the new producer's coordinators are (coordinators.py)."""
        self._watch = CoordinatorWatch(
            self.producer, self._transactional_id, f"{self.names.prefix}-child-executor"
        )
        self._watch.shaken_at = shaken_at

    def _on_producer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._producer_failed = err
        if err.code() in SHAKEN_CODES and self._watch is not None:
            self._watch.shaken()
        log.warning("producer error: %s", err)

    def _transact(self, msgs: list[Message]) -> None:
        finished: list[tuple[int, str]] = []
        tally = self._tally = ChildBatchTally()
        # begin_transaction on a producer that failed fatally while idle can block for good
        # (librdkafka#4420): serve its error callbacks first, and stop (exit 1) if it did.
        self.producer.poll(0)
        if self._producer_failed is not None:
            if self._renewals.recent or self._producer_failed.code() in FENCED_CODES:
                raise KafkaException(self._producer_failed)
            self._renew(self._producer_failed)  # failed fatally while idle: a new one carries on
        moved = self._watch.moved() if self._watch is not None else None
        if moved is not None:  # librdkafka would keep the old coordinators' handles (coordinators.py)
            self._fresh_producer(moved)
        self.producer.begin_transaction()
        try:
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("consumer error: %s", err)
                    continue
                self._handle(msg, finished)
            positions = self._positions(msgs)
            committing = time.perf_counter()
            group = self.consumer.consumer_group_metadata()
            stale = StaleWait(
                self.producer,
                self._transactional_id,
                f"{self.names.prefix}-child-executor",
                known=self._watch.known if self._watch is not None else None,
            )
            send_offsets_flushing(
                self._calls,
                self.producer,
                positions,
                group,
                CALL_TIMEOUT_S,
                CALL_TIMEOUT_S + ABANDON_AFTER_S,
                stale.check,
            )
            # a commit that timed out is resumed, never aborted (an abort would conflict with it)
            commit_resuming(
                self.producer,
                CALL_TIMEOUT_S,
                lambda err, attempt: log.warning(
                    "commit_transaction failed (%s), resuming it (attempt %d)", err, attempt
                ),
                cluster_lost=lambda: (
                    not self._stop.is_set() and not cluster_whole(self.producer, 2.0, self.names.commands)
                ),
            )
        except CallAbandoned as exc:
            self._abandon(exc)
            return
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() and err.code() not in FENCED_CODES and not self._renewals.recent:
                # Not another instance: typically the coordinator was lost (a broker killed),
                # and its successor aborted the transaction and bumped the epoch, so the
                # producer's next call fails (INVALID_TXN_STATE). A new producer carries on,
                # unless one was just replaced (Renewals) with no commit since.
                self._renew(err)
                return
            if err.fatal() or (not err.txn_requires_abort() and not err.retriable()):
                raise
            self.counts["aborts"] += 1
            self.metrics.aborted()
            log.warning("transaction aborted (%s); rewinding to the committed offsets", err)
            try:
                self.producer.abort_transaction(TXN_TIMEOUT_S)
            except KafkaException as abort_exc:
                self._abort_failed(abort_exc)
                return
            self._rewind()
            return
        self._renewals.committed()
        for partition, child in finished:  # only once committed: an aborted batch is re-read and needs them
            self.parents.get(partition, {}).pop(child, None)
        self.metrics.committed(tally, len(msgs), time.perf_counter() - committing, self.known_parents())

    def _abort_failed(self, exc: KafkaException) -> None:
        """The abort itself failed. Fatal and not a fence (the lost coordinator's successor
        aborted the transaction and bumped the epoch: INVALID_TXN_STATE, seen in the 3-node
        scenario) or timed out (it can wait for good on a lost coordinator): a new producer, whose
        init_transactions aborts the transaction at the coordinator, and the input rewound, as
        the processor does. A fence, a second fatal error soon after a renewal, or an abort
        refused because a timed-out commit may still land (`_CONFLICT`: replaying would emit
        twice) stop the executor."""
        err = exc.args[0]
        if err.code() in FENCED_CODES or err.code() == KafkaError._CONFLICT:
            raise exc
        if err.fatal():
            if self._renewals.recent:
                raise exc
            self._renew(err)
        elif err.code() == KafkaError._TIMED_OUT:
            self._replace_producer(f"abort_transaction timed out: {err.str()}")
        else:
            raise exc

    def _abandon(self, exc: CallAbandoned) -> None:
        """send_offsets_to_transaction did not return: leave the call, its thread and its
        producer behind (never called nor destroyed again), and go on with a new producer,
        whose init_transactions fences the old one and aborts its transaction at the
        coordinator; the input is rewound to the committed offsets, as for an abort. With more
        than MAX_STUCK_CALLS such calls still running: `Stuck` (exit 4), to free them."""
        self._abandoned = [(p, done) for p, done in self._abandoned if not done.is_set()]
        self._abandoned.append((self.producer, exc.done))
        if len(self._abandoned) > MAX_STUCK_CALLS:
            raise Stuck(
                f"{len(self._abandoned)} send_offsets_to_transaction calls never returned "
                f"(the last: {exc}); a restart frees the clients left inside them"
            )
        self._replace_producer(f"send_offsets_to_transaction {exc}")

    def _renew(self, err: KafkaError) -> None:
        """A fatal error on the producer that is not a fence: replace it (once; a second one
        soon after with no commit between stops, exit 1: `Renewals`)."""
        self._renewals.renewed()
        self._replace_producer(f"it failed fatally: {err.str()}")

    def _replace_producer(self, why: str) -> None:
        """A new producer, whose init_transactions fences the old one and aborts its open
        transaction at the coordinator; the input is rewound to the committed offsets."""
        self.counts["aborts"] += 1
        self.metrics.aborted()
        self._fresh_producer(why)
        self._rewind()

    def _init_waiting(self, err: KafkaError, rounds: int) -> None:
        log.warning(
            "the cluster cannot serve init_transactions yet (no broker answers, or too few to elect "
            "the transaction coordinator): the transactional producer waits for it (%.0f s): %s",
            rounds * WAIT_ROUND_S,
            err.str(),
        )

    def _fresh_producer(self, why: str) -> None:
        """A new producer in the old one's place (between transactions: nothing to rewind)."""
        log.warning("replacing the transactional producer: %s", why)
        shaken_at = self._watch.shaken_at if self._watch is not None else None
        self.producer = self._new_producer()
        self._producer_failed = None
        producer = self.producer
        init_transactions_waiting(producer, self._stop, WAIT_ROUND_S, self._init_waiting)
        self._watch_coordinators(shaken_at)
        self.producers_replaced += 1

    def known_parents(self) -> int:
        return sum(len(children) for children in self.parents.values())

    def _own(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self.names.run_events:
                self.parents.setdefault(tp.partition, {})

    def _forget_parents(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self.names.run_events:
                self.parents.pop(tp.partition, None)

    def _positions(self, msgs: list[Message]) -> list[TopicPartition]:
        last: dict[tuple[str, int], int] = {}
        for m in msgs:
            if m.error() is None:
                topic, partition, offset = coordinates(m)
                last[(topic, partition)] = offset
        return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset. The group coordinator
        may be moving (a broker lost): the lookup is retried, in 5 s attempts, until it is
        answered or a stop is requested; exiting here stopped child workflows although the
        cluster was back seconds later."""
        failed_since: float | None = None
        while True:
            assignment = self.consumer.assignment()
            try:
                committed = self.consumer.committed(assignment, timeout=5)
                break
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or self.stopping:
                    raise
                now = time.monotonic()
                if failed_since is None:
                    failed_since = now
                    log.warning("committed offsets unavailable (%s); retrying", err.str())
                self._stop.wait(0.5)
        if failed_since is not None:
            log.info("committed offsets read after %.1f s", time.monotonic() - failed_since)
        for tp in committed:
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def _produce(self, topic: str, kind: str, msg: Mapping[str, Any]) -> None:
        self.producer.produce(topic, self.codec.encode(kind, dict(msg)), key=msg["run_id"].encode())

    def _handle(self, msg: Message, finished: list[tuple[int, str]]) -> None:
        topic, partition, _ = coordinates(msg)
        kind = "child_activations" if topic == self.names.child_activations else "run_events"
        try:
            record = self.codec.decode(kind, msg.value())
        except DecodeError as exc:
            if (
                kind == "child_activations"
            ):  # run-events are the processor's; a foreign record is not ours to judge
                self._dead_letter(msg, str(exc))
            return
        now = int(time.time() * 1000)
        rtype = record["type"]
        if rtype == "ChildRunActivation":
            if expired(record, now):
                log.info(
                    "child %s not started: its parent step's deadline passed %d ms ago",
                    record["child_run_id"],
                    now - record["deadline_ms"],
                )
                self.counts["expired"] += 1
                self._tally.expired += 1
                return
            self._produce(self.names.commands, "commands", start_command(record, now))
            self.counts["started"] += 1
            self._tally.activations += 1
        elif rtype == "ChildRunCancel":
            self._produce(self.names.commands, "commands", cancel_command(record, now))
            self.counts["cancelled"] += 1
            self._tally.cancels += 1
        elif rtype == "RunAccepted" and record.get("parent"):
            children = self.parents.get(partition)
            if children is not None:  # else fetched before its partition was revoked in this batch's consume
                children[record["run_id"]] = parent_step_from_ref(record["run_id"], record["parent"])
        elif (
            rtype in TERMINAL_EVENTS
            # every rejection, Conflict too (a run already holds the child's id): the parent's step
            # fails rather than waiting for good; one for a step already settled is dropped as stale
            or (rtype == "RunRejected" and record.get("command_type") == "StartRun")
            or (  # a cancel of a child never started (its deadline passed): stopped without work
                rtype == "RunRejected"
                and record.get("command_type") == "CancelRun"
                and record.get("code") == "NotFound"
            )
        ):
            child = record["run_id"]
            step = self.parents.get(partition, {}).get(child) or parent_step_from_id(child)
            if step is None:
                return
            receipt = finished_receipt(step, child, record, now)
            self._produce(self.names.receipts, "receipts", receipt)
            self.counts["finished"] += 1
            self._tally.count_finished(receipt["status"])
            finished.append((partition, child))

    def _dead_letter(self, msg: Message, error: str) -> None:
        self.counts["dead_letters"] += 1
        self._tally.dead_letters += 1
        log.error(
            "undecodable child activation at %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), error
        )
        self.producer.produce(
            self.names.dead_letters,
            self.codec.encode(
                "dead_letters",
                {
                    "record_id": f"{msg.topic()}:{msg.partition()}:{msg.offset()}",
                    "ts_ms": int(time.time() * 1000),
                    "source_topic": msg.topic(),
                    "source_partition": msg.partition(),
                    "source_offset": msg.offset(),
                    "key": msg.key(),
                    "error": error[:2000],
                    "original": msg.value() or b"",
                    "producer": "child-executor",
                },
            ),
            key=msg.key(),
        )
