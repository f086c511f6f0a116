"""The input consumer's group membership: the consumer and the partitions it owns, the
rebalance callbacks (run inside consumer.poll/consume/close), and replacing a consumer that
failed, was fenced by its own stale membership or is stuck outside the group."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from logging import Logger
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from processors.kafka.exits import ExitCode, ProcessorStopped, Stopping
from processors.runtime.assignment import Partitions
from processors.runtime.settings import ProcessorSettings
from processors.runtime.txn import Transaction
from processors.service_logs import kafka_log

_REPLACE_SPACING_S = 5.0


class GroupMembership:
    def __init__(
        self,
        settings: ProcessorSettings,
        txn: Transaction,
        stopping: Stopping,
        log: Logger,
        on_client_error: Callable[[KafkaError], None],
    ) -> None:
        self._settings = settings
        self._topics = settings.topics
        self._txn = txn
        self._stopping = stopping
        self._log = log
        self._on_client_error = on_client_error
        self.consumer: Consumer | None = None  # connect()
        self.partitions: Partitions | None = None  # the owned partitions' stores (set at start-up)
        self.consumer_failed: KafkaError | None = None  # fatal input-consumer error, handled next iteration
        self.rejoin_stale = False  # the consumer is replaced for a stale membership, not another instance
        self._session_lost_at = -1e9  # monotonic time of the last on_lost (session timed out)
        self.consumer_replaced_at = -1e9
        self._unassigned_since: float | None = None  # subscribed or lost/revoked, no on_assign since

    def connect(self) -> Consumer:
        """The input consumer (not subscribed yet: the topology is checked with it first)."""
        self.consumer = self._txn.input = self._new_consumer()
        return self.consumer

    def _new_consumer(self) -> Consumer:
        return Consumer(
            {
                **self._settings.input_consumer_config(),
                "error_cb": self._on_client_error,
                "logger": kafka_log(),
            }
        )

    def subscribe(self) -> None:
        """Join the group; the partitions assigned are opened in `partitions`."""
        assert self.partitions is not None
        self._subscribe()

    def _subscribe(self) -> None:
        assert self.consumer is not None
        self.consumer.subscribe(
            [self._topics.commands, self._topics.receipts],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._unassigned_since = time.monotonic()

    # ---- rebalance callbacks (run inside consumer.poll/consume/close) -------------------------
    def _is_current(self, consumer: Consumer) -> bool:
        return consumer is self.consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return  # a replaced consumer closing (see replace_consumer)
        self._txn.group_metadata.forget()  # a new generation
        self._unassigned_since = None
        by_topic: dict[str, set[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, set()).add(tp.partition)
        cmds = by_topic.get(self._topics.commands, set())
        rcps = by_topic.get(self._topics.receipts, set())
        consumer.assign(partitions)
        consumer.pause(partitions)
        if cmds != rcps:
            self._stopping.fail(
                ProcessorStopped(
                    ExitCode.CONFIG,
                    (
                        f"assignment does not co-locate commands {sorted(cmds)} and receipts {sorted(rcps)}: "
                        "the group must use partition.assignment.strategy=range and equal partition counts"
                    ),
                )
            )
            return
        self.partitions.open(sorted(cmds))
        self._log.info(
            "partitions assigned", extra={"partitions": sorted(cmds), "owned": self.partitions.owned()}
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return
        if self._txn.open:
            if self._stopping.fatal is None:
                try:
                    self._txn.commit()
                except ProcessorStopped as e:
                    self._stopping.fail(e)
            else:
                self._txn.reset()
        self._txn.group_metadata.forget()  # after the commit above, under the old generation
        self._unassigned_since = time.monotonic()
        revoked = sorted({tp.partition for tp in partitions})
        self.partitions.close(revoked)
        self._log.info("partitions revoked", extra={"partitions": revoked})

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.partitions is not None
        if not self._is_current(consumer):
            return
        if self._txn.open and self._stopping.fatal is None:
            try:
                self._txn.abort("partitions lost (session timed out)")
            except ProcessorStopped as e:
                self._stopping.fail(e)
        self._txn.group_metadata.forget()
        self._session_lost_at = self._unassigned_since = time.monotonic()
        lost = sorted({tp.partition for tp in partitions})
        self.partitions.close(lost)
        self._log.warning("partitions lost", extra={"partitions": lost})

    def on_consume_error(self, m: Any) -> None:
        err = m.error()
        if err.fatal() or err.code() == KafkaError._FATAL:
            # A consumer's fatal error arrives as a message with code _FATAL (fatal() is False):
            # the consumer fetches and rebalances no more, so this must never be just logged.
            self.consumer_failed = err
            return
        if m.topic() is None and "committed offsets" in err.str():
            # An OffsetFetch answered NOT_COORDINATOR as a whole (the coordinator moved: broker
            # restart or fencing) leaves the assigned partitions without a position for good:
            # librdkafka neither retries nor fetches (confluentinc/librdkafka#5586). A new
            # consumer asks the new coordinator.
            self.consumer_failed = err
        self._log.warning(
            "consume error", extra={"error": err.str(), "topic": m.topic(), "partition": m.partition()}
        )

    def replace_consumer(self, err: KafkaError) -> None:
        """After a session timeout librdkafka rejoins as a static member with a new member id
        while a request with the old id is still in flight; the coordinator answers that one
        FENCED_INSTANCE_ID and librdkafka fences *itself* for good (confluentinc/librdkafka#3437):
        a silent stall. Shortly after our own session loss that is the cause, so a new consumer
        (same group.instance.id) rejoins and takes the partitions back. Otherwise another
        processor runs with our instance id, or the consumer failed for another reason: stop.
        A consumer whose committed offsets could not be fetched (librdkafka#5586) is replaced too."""
        self.consumer_failed = None
        stuck = not err.fatal() and err.code() not in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID)
        if stuck:  # no offsets fetched, or no assignment
            # at most one replacement per _REPLACE_SPACING_S while the coordinator keeps moving
            self._stopping.event.wait(
                max(0.0, self.consumer_replaced_at + _REPLACE_SPACING_S - time.monotonic())
            )
        elif not (self._session_lost_recently() or self.rejoin_stale):
            if "fenced" in err.str().lower():
                raise ProcessorStopped(
                    ExitCode.FENCED,
                    (
                        f"consumer fenced: another processor with instance id {self._settings.instance_id!r} "
                        f"joined the group; this one stops. Give each running processor its own "
                        f"RUNFOLD_INSTANCE_ID. ({err.str()})"
                    ),
                )
            raise ProcessorStopped(ExitCode.FATAL, f"fatal consumer error: {err.str()}")
        assert self.consumer is not None and self.partitions is not None
        self._log.warning(
            "input consumer failed; replacing it",
            extra={
                "error": err.str(),
                "seconds_since_session_lost": round(time.monotonic() - self._session_lost_at, 1),
            },
        )
        if self._txn.open:
            self._txn.abort(f"input consumer failed: {err.str()}")
        self.partitions.close(self.partitions.owned())  # restored again when reassigned
        old = self.consumer
        self.consumer = self._txn.input = self._new_consumer()
        self._subscribe()
        self._session_lost_at = -1e9  # one replacement per session loss
        self.rejoin_stale = False
        self.consumer_replaced_at = time.monotonic()
        # Closing a failed consumer can block until its in-flight group requests time out (a
        # JoinGroup waits up to the rebalance timeout): close it aside; its rebalance callbacks
        # are ignored (they name a consumer that is no longer ours).
        threading.Thread(
            target=self._close_failed, args=(old,), name="close-failed-consumer", daemon=True
        ).start()
        self._log.info("input consumer replaced; rejoining the group", extra={"group": self._settings.group})

    def _session_lost_recently(self) -> bool:
        """Our own session loss (on_lost) happened within the window where a FENCED_INSTANCE_ID is
        our stale membership rather than another instance with our id; one replacement per loss."""
        window = max(30.0, 3 * self._settings.session_timeout_ms / 1000.0)
        return time.monotonic() - self._session_lost_at <= window

    def check(self) -> None:
        """A consumer that gets no assignment (not even an empty one) long after subscribing or
        losing its partitions is stuck outside the group: after a coordinator move librdkafka was
        seen never to rejoin. Replace it like a failed one."""
        since = self._unassigned_since
        bound = max(30.0, 3 * self._settings.session_timeout_ms / 1000.0)
        if since is not None and self.consumer_failed is None and time.monotonic() - since > bound:
            self.consumer_failed = KafkaError(
                KafkaError._TIMED_OUT, f"no partition assignment {bound:.0f} s after joining the group"
            )

    def _close_failed(self, consumer: Consumer) -> None:
        t0 = time.monotonic()
        try:
            consumer.close()
        except Exception as e:
            self._log.warning("closing the failed consumer failed", extra={"error": str(e)})
        self._log.info("failed consumer closed", extra={"close_ms": round((time.monotonic() - t0) * 1000)})
