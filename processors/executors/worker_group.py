"""The worker's input consumer in its group: subscribing, the rebalance callbacks, pausing
under backpressure, and replacing a consumer that failed or sits outside the group (see
docs/executors.md "Stalls"). A part of the `WorkerRunner` (runner.py)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from processors.executors.inflight import Entry
from processors.executors.metrics import WorkerMetrics
from processors.executors.offsets import OffsetTracker
from processors.executors.receipt_delivery import ReceiptDelivery
from processors.kafka.fetch import resume_now
from processors.service_logs import kafka_log
from topology.settings import KafkaSettings, consumer_config

log = logging.getLogger("runfold.worker")
PAUSE_AFTER_S = 0.5
UNASSIGNED_LIMIT_S = (
    30.0  # no assignment this long after subscribing or losing partitions: replace the consumer
)
REPLACE_SPACING_S = 5.0  # at most one consumer replacement per this many seconds


class WorkerGroup:
    def __init__(
        self,
        kafka: KafkaSettings,
        group_id: str,
        worker_id: str,
        topics: list[str],
        metrics: WorkerMetrics,
        tracker: OffsetTracker,
        backlog: OrderedDict[str, Entry],
        receipts: ReceiptDelivery,
        admission: int,
        load: Callable[[], int],
    ) -> None:
        """`backlog`: the activations waiting for a slot (dispatch_id -> entry), shared with the
        runner; `receipts`: flushed before a revocation commits; `load()` against `admission`:
        when to pause."""
        self._kafka = kafka
        self._group_id = group_id
        self._worker_id = worker_id
        self._topics = topics
        self._metrics = metrics
        self._tracker = tracker
        self._backlog = backlog
        self._receipts = receipts
        self._admission = admission
        self._load = load
        self.paused = False
        self._full_since: float | None = None
        self.consumer_failed: str | None = None  # why the consumer must be replaced (handled in the loop)
        self._unassigned_since: float | None = None  # subscribed or lost/revoked, no on_assign since
        self._replaced_at = -1e9
        self.consumer = self._new_consumer()

    def _new_consumer(self) -> Consumer:
        return Consumer(
            {
                **consumer_config(self._kafka, self._group_id, read_committed=True),
                "on_commit": self._on_commit,
                "logger": kafka_log(),  # librdkafka's lines through logging, repeats collapsed
            }
        )

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The group coordinator's answer to a commit request (served by poll): a rebalance in
        between rejects it, and the next owner re-runs those activations (leases cover it)."""
        rejected = err is not None or any(tp.error is not None for tp in partitions)
        self._metrics.count("offset_commits", "rejected" if rejected else "committed")

    def subscribe(self) -> None:
        self.consumer.subscribe(
            self._topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._unassigned_since = time.monotonic()

    def check(self) -> None:
        """Replace a consumer that failed or sits outside the group (see docs/executors.md "Stalls")."""
        since = self._unassigned_since
        if (
            self.consumer_failed is None
            and since is not None
            and time.monotonic() - since > UNASSIGNED_LIMIT_S
        ):
            self.consumer_failed = (
                f"no partition assignment {UNASSIGNED_LIMIT_S:.0f} s after joining the group"
            )
        if self.consumer_failed is not None and time.monotonic() - self._replaced_at >= REPLACE_SPACING_S:
            self.replace(self.consumer_failed)

    def replace(self, reason: str) -> None:
        """A consumer that lost its coordinator (broker restart/freeze) may never rejoin: after a
        _FATAL error (e.g. it fenced itself, confluentinc/librdkafka#3437), committed offsets it
        could not fetch (librdkafka#5586) or no assignment for UNASSIGNED_LIMIT_S. A new consumer
        with the same config joins the group. Handlers in flight keep running and their receipts
        are still produced, but their offsets are no longer ours to commit: all tracking is reset
        and the new owner of each partition resumes at its committed offset (a settled activation
        coming back is recognised by `finished`; others re-run: at-least-once)."""
        log.warning("worker %s: consumer failed (%s); replacing it", self._worker_id, reason)
        self._metrics.count("consumer_replacements")
        self.consumer_failed = None
        self._replaced_at = time.monotonic()
        self._tracker.forget(self._tracker.partitions())
        self._backlog.clear()  # never started and uncommitted: delivered again to the next owner
        self.paused = False
        self._full_since = None
        old = self.consumer
        self.consumer = self._new_consumer()
        self.subscribe()
        # Closing a failed consumer can block until its group requests time out: close it aside.
        # Its rebalance callbacks are ignored (they name a consumer that is no longer ours).
        threading.Thread(
            target=self._close_quietly, args=(old,), name="close-failed-consumer", daemon=True
        ).start()

    @staticmethod
    def _close_quietly(consumer: Consumer) -> None:
        try:
            consumer.close()
        except Exception as exc:
            log.warning("closing the failed consumer failed: %s", exc)

    def backpressure(self) -> None:
        """Pause the partitions after admission has been full for PAUSE_AFTER_S; resume below it.

        A short burst never pauses: pausing makes the client drop its prefetched records and
        fetch them again on resume, which costs more than it saves when slots free quickly."""
        if self._load() >= self._admission:
            mono = time.monotonic()
            if self._full_since is None:
                self._full_since = mono
            elif not self.paused and mono - self._full_since >= PAUSE_AFTER_S:
                self.consumer.pause(self.consumer.assignment())
                self.paused = True
        else:
            self._full_since = None
            if self.paused:
                resume_now(self.consumer, self.consumer.assignment())
                self.paused = False

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced consumer closing
        self._unassigned_since = None
        self.paused = False
        log.info("assigned %s", [(p.topic, p.partition) for p in partitions])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced consumer closing: its partitions' tracking is already reset
        self._unassigned_since = time.monotonic()
        revoked = [(p.topic, p.partition) for p in partitions]
        self._receipts.flush(5)  # settle receipts in flight so their offsets can still be committed
        commits = self._tracker.take_commits(only=revoked)
        if commits:
            with contextlib.suppress(Exception):
                consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in commits.items()], asynchronous=False
                )
        self._tracker.forget(revoked)
        # Not started and not committed: the partitions' next owner runs them, so must not we.
        gone = set(revoked)
        for dispatch in [d for d, e in self._backlog.items() if e.tp in gone]:
            del self._backlog[dispatch]
        self.paused = False
        log.info("revoked %s", revoked)
