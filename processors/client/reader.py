"""Reading committed records of chosen partitions: catch up to the end, or follow.

The client never joins a consumer group: it assigns the one partition it needs
(a run's partition, computed with the producers' partitioner) and reads with
`isolation.level=read_committed`, so it sees exactly what the processor's
transactions committed. The end of a partition is the partition-EOF event, which
under read_committed arrives at the last stable offset (transaction markers at
the tail are never delivered, so "offset == high watermark - 1" would not work).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from processors.client.errors import BrokerUnavailable, RunfoldError, RunfoldTimeout
from processors.kafka.fetch import first_then_buffered
from processors.kafka.watermarks import Offsets
from topology.settings import KafkaSettings, consumer_config

T = TypeVar("T")
_BATCH = 1000
# librdkafka's own log lines (connection refused, ...) go through logging, not raw to stderr:
# the client reports broker trouble as typed errors; apps that configure logging still see them.
KAFKA_LOGGER = logging.getLogger("runfold.client.kafka")
KAFKA_LOGGER.addHandler(logging.NullHandler())
# a topic created a moment ago answers these until its leader is elected
_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
}
_BROKER_DOWN = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
# What a cluster answers while it fails over (a broker killed or restarted, a leader or a
# coordinator moving): retried for the call's timeout, then raised as `BrokerUnavailable`, the
# documented retryable error. `_DESTROY_BROKER` is a request whose broker connection librdkafka
# tore down (seen from `start()` when a broker of three was killed: it was a bare RunfoldError).
_FAILING_OVER = {
    KafkaError._DESTROY_BROKER,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._WAIT_COORD,
    KafkaError._NODE_UPDATE,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.REPLICA_NOT_AVAILABLE,
}
_NO_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}


class TopicMissing(RunfoldError):
    """A runfold topic does not exist (the topology was not created for this prefix)."""


def broker_error(exc: KafkaException | KafkaError, what: str, bootstrap: str) -> RunfoldError:
    """The typed error for a Kafka error: `BrokerUnavailable` for every error that means the
    cluster cannot serve the call now (down, failing over, or an error librdkafka calls
    retriable), `TopicMissing`, else a `RunfoldError` naming what failed."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    code = err.code() if isinstance(err, KafkaError) else None
    if code in _BROKER_DOWN:
        return BrokerUnavailable(f"{what}: no Kafka broker answered at {bootstrap} ({err})")
    if code in _NO_TOPIC:
        return TopicMissing(f"{what}: topic missing ({err}); create it with `runfold topology create`")
    if code in _FAILING_OVER or (isinstance(err, KafkaError) and err.retriable()):
        return BrokerUnavailable(
            f"{what}: the Kafka cluster at {bootstrap} cannot serve it now, retry ({err})"
        )
    return RunfoldError(f"{what}: {err}")


class PartitionReader:
    """An assign-only read_committed consumer for point reads of a few partitions."""

    def __init__(self, settings: KafkaSettings, *, timeout_s: float = 10.0, **overrides: Any) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        cfg = consumer_config(
            settings,
            f"runfold-client-{uuid.uuid4().hex[:12]}",
            enable_partition_eof=True,
            fetch_wait_max_ms=20,
            **overrides,
        )
        cfg["logger"] = KAFKA_LOGGER
        self._consumer = Consumer(cfg)
        # ends, starts and offsets for a time: never the consumer's own queries, which abort the
        # process while brokers fail over (processors/kafka/watermarks.py)
        self._offsets = Offsets(settings, logger=KAFKA_LOGGER)
        self._partitions: dict[str, int] = {}

    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()

    def partition_count(self, topic: str) -> int:
        """The topic's partition count (cached: partitions are never removed)."""
        n = self._partitions.get(topic)
        if n is not None:
            return n
        try:
            md = self._consumer.list_topics(topic, timeout=self.timeout_s)
        except KafkaException as e:
            raise broker_error(e, f"reading metadata of {topic}", self.settings.bootstrap_servers) from None
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            raise TopicMissing(
                f"topic {topic} does not exist; create it with `runfold topology create` "
                f"(prefix {self.settings.topic_prefix!r})"
            )
        n = self._partitions[topic] = len(tmd.partitions)
        return n

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Retry retriable broker errors (a new topic's leader not elected yet, ...) until the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return call()
            except KafkaException as e:
                err = e.args[0] if e.args else None
                # No broker at all fails at once; a cluster failing over is given the timeout.
                retriable = (
                    isinstance(err, KafkaError)
                    and err.code() not in (KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
                    and (err.retriable() or err.code() in _SETTLING or err.code() in _FAILING_OVER)
                )
                if not retriable or time.monotonic() > deadline:
                    raise broker_error(e, what, self.settings.bootstrap_servers) from None
                time.sleep(0.1)

    def end_offset(self, topic: str, partition: int) -> int:
        """Where a read_committed reader's partition ends now (its last stable offset)."""
        tp = TopicPartition(topic, partition)
        return self._retrying(
            f"reading offsets of {topic}[{partition}]", lambda: self._offsets.end(tp, self.timeout_s)
        )

    def start_offset(self, topic: str, partition: int) -> int:
        """The first offset the partition still holds (above 0 once retention deleted records)."""
        tp = TopicPartition(topic, partition)
        return self._retrying(
            f"reading offsets of {topic}[{partition}]", lambda: self._offsets.start(tp, self.timeout_s)
        )

    def offset_for_time(self, topic: str, partition: int, ts_ms: int) -> int:
        """The first offset with a record timestamp >= ts_ms (the end offset if there is none)."""
        tp = TopicPartition(topic, partition)
        offset = self._retrying(
            f"looking up offsets of {topic}[{partition}]",
            lambda: self._offsets.for_time(tp, ts_ms, self.timeout_s),
        )
        return offset if offset >= 0 else self.end_offset(topic, partition)

    def read(
        self, starts: dict[tuple[str, int], int], *, follow: bool = False, deadline: float | None = None
    ) -> Iterator[Message | None]:
        """Committed records of each (topic, partition) from its start offset (OFFSET_BEGINNING ok).

        Without `follow` it stops once every partition reached its end. With `follow` it
        never stops by itself and yields `None` when idle, so the caller can check its
        own stop condition. Raises `RunfoldTimeout` past `deadline` (time.monotonic)."""
        pending = set(starts)
        if not follow:  # an empty partition gives no EOF event after assign: skip it up front
            for topic, partition in list(pending):
                if self.end_offset(topic, partition) == 0:
                    pending.discard((topic, partition))
            if not pending:
                return
        self._consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in starts])
        try:
            while follow or pending:
                if deadline is not None and time.monotonic() > deadline:
                    raise RunfoldTimeout(f"reading {sorted(starts)} did not finish in time")
                msgs = first_then_buffered(self._consumer, _BATCH, 0.2)
                if not msgs and follow:
                    yield None
                for msg in msgs:
                    err = msg.error()
                    if err is None:
                        yield msg
                    elif err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic(), msg.partition()))
                        if follow:
                            yield None
                    elif err.fatal() or not err.retriable():
                        raise broker_error(err, f"reading {msg.topic()}", self.settings.bootstrap_servers)
        finally:
            self._consumer.unassign()

    def read_all(self, topic: str, *, deadline: float | None = None) -> Iterator[Message]:
        """Every committed record of every partition of `topic`, from the beginning to the end."""
        n = self.partition_count(topic)
        for msg in self.read({(topic, p): OFFSET_BEGINNING for p in range(n)}, deadline=deadline):
            if msg is not None:
                yield msg
