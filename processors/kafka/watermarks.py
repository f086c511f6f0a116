"""Partition offsets asked of the cluster (log end, log start, offset for a time, a group's
committed offset): the one home of every such query on runfold's paths, through calls that do
not crash the process while brokers fail over.

Why not the consumer's own queries. librdkafka's synchronous `get_watermark_offsets(...,
cached=False)` (`rd_kafka_query_watermark_offsets`) and `offsets_for_times`
(`rd_kafka_offsets_for_times`) share one code path: a leader lookup, then ListOffsets requests
whose callback writes into a state on the caller's stack and re-sends the request itself on a
transport error. During a broker rolling restart it aborts the process
(confluentinc/librdkafka#5160, open; `Assertion failed ... rwlock_rdlock` inside the call) and
confluent-kafka 2.16.2 / librdkafka 2.16.0, the newest release, does not fix it. The admin
client's coordinator requests (`list_consumer_group_offsets`, `describe_consumer_groups`) abort
with `rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0' failed` when a node
restarts (librdkafka#4605, #3663, open) and crashed on NOT_COORDINATOR (#5040): that assertion,
seen in a runfold client that polled `list_consumer_group_offsets` while two of three brokers
came back (issue 48), is only raised by that coordinator-request code (rdkafka_admin.c).

What is used instead:
- ends, starts and offsets for a time: the admin client's ListOffsets (`AdminClient.list_offsets`,
  KIP-396). It is asynchronous (results through futures; no state on the caller's stack, no
  request re-sent from the caller's thread) and asks the partition leaders, never a
  coordinator: not the code either defect is in. The isolation level is given per call, so
  one admin client answers both the committed end (last stable offset, read_committed) and the
  log end (high watermark, read_uncommitted).
- a group's committed offset: `Consumer.committed()` of a consumer that never joins the group
  (no subscribe, no assign, no auto commit): the OffsetFetch path every group consumer runs on
  each rebalance, not the admin client's.
The cached `get_watermark_offsets(..., cached=True)` reads the client's own state (no request)
and stays where it is used.

A query sent while the partition's leader is a broker just lost waits its whole timeout on that
broker, although Kafka moves the leader within its broker session (9 s by default) and the
client learns of it only by refreshing its metadata: one 10 s call answered nothing for 10 s in
the 3-node chaos scenario (tests/chaos/test_cluster_faults.py). Every query here is asked in
slices of `SLICE_S` with a metadata refresh between them, and answers as soon as the cluster
does; `KafkaException` (its last error) when no slice was answered within the total.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from topology.settings import KafkaSettings, admin_config, consumer_config

SLICE_S = 1.0
_SPEC: Any = OffsetSpec  # untyped in confluent-kafka
T = TypeVar("T")


def sliced(
    call: Callable[[float], T], refresh: Callable[[float], object], total_s: float, slice_s: float
) -> T:
    """`call(timeout)` again every `slice_s` for at most `total_s`, `refresh(timeout)` (a metadata
    request) between two tries; the last KafkaException when no try was answered in time."""
    deadline = time.monotonic() + total_s
    while True:
        left = deadline - time.monotonic()
        try:
            return call(max(0.1, min(slice_s, left)))
        except KafkaException:
            if time.monotonic() >= deadline - 0.05:
                raise
            with contextlib.suppress(KafkaException):
                refresh(max(0.1, min(1.0, deadline - time.monotonic())))


class Offsets:
    """Offsets of partitions through one admin client (see the module's docstring). Thread-safe:
    the admin client is, and each call waits only on its own futures."""

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        logger: Any = None,
        admin: Any = None,
        **overrides: Any,
    ) -> None:
        if admin is None:
            assert settings is not None, "Offsets needs the settings or an admin client"
            cfg = admin_config(settings, **overrides)
            if logger is not None:
                cfg["logger"] = logger
            admin = AdminClient(cfg)
        self._admin = admin

    @classmethod
    def like(cls, client_config: dict[str, Any]) -> Offsets:
        """Offsets through the cluster a consumer's or producer's configuration names (its
        connection and security settings, none of its own)."""
        keep = ("bootstrap.", "security.", "sasl.", "ssl.", "client.id", "socket.", "broker.", "reconnect.")
        cfg = {k: v for k, v in client_config.items() if k.startswith(keep) or k == "logger"}
        return cls(admin=AdminClient(cfg))

    def _list(self, tp: TopicPartition, spec: Any, committed: bool, timeout: float) -> int:
        key = TopicPartition(tp.topic, tp.partition)
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        futures = self._admin.list_offsets({key: spec}, isolation_level=level, request_timeout=timeout)
        try:
            [future] = futures.values()
            # the request's own timeout ends it; a little more for the answer to come back
            return int(future.result(timeout=timeout + 1.0).offset)
        except FutureTimeout:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"ListOffsets {tp.topic}[{tp.partition}]")
            ) from None

    def _refresh(self, topic: str) -> Callable[[float], object]:
        return lambda timeout: self._admin.list_topics(topic, timeout=timeout)

    def end(
        self, tp: TopicPartition, total_s: float, *, committed: bool = True, slice_s: float = SLICE_S
    ) -> int:
        """The partition's end: the last stable offset (`committed`, where a read_committed
        reader's partition-EOF is) or the high watermark (`committed=False`, the log end)."""
        return sliced(
            lambda t: self._list(tp, _SPEC.latest(), committed, t),
            self._refresh(tp.topic),
            total_s,
            slice_s,
        )

    def start(self, tp: TopicPartition, total_s: float, *, slice_s: float = SLICE_S) -> int:
        """The first offset the partition still holds (above 0 once retention deleted records)."""
        return sliced(
            lambda t: self._list(tp, _SPEC.earliest(), True, t),
            self._refresh(tp.topic),
            total_s,
            slice_s,
        )

    def watermarks(
        self, tp: TopicPartition, total_s: float, *, committed: bool = True, slice_s: float = SLICE_S
    ) -> tuple[int, int]:
        """(start, end) as `start` and `end`; an empty partition has start == end."""
        deadline = time.monotonic() + total_s
        low = self.start(tp, total_s, slice_s=slice_s)
        high = self.end(tp, max(0.1, deadline - time.monotonic()), committed=committed, slice_s=slice_s)
        return low, max(low, high)

    def for_time(self, tp: TopicPartition, ts_ms: int, total_s: float, *, slice_s: float = SLICE_S) -> int:
        """The first offset with a record timestamp >= ts_ms; -1 when there is none."""
        return sliced(
            lambda t: self._list(tp, _SPEC.for_timestamp(ts_ms), True, t),
            self._refresh(tp.topic),
            total_s,
            slice_s,
        )

    def list_topics(self, topic: str, timeout: float) -> Any:
        return self._admin.list_topics(topic, timeout=timeout)

    def close(self) -> None:
        """Nothing to release but the client itself (the admin client has no close)."""
        self._admin = None


def log_end(
    offsets: Offsets, tp: TopicPartition, total_s: float, *, committed: bool = True, slice_s: float = SLICE_S
) -> int:
    """`offsets.end(...)`: the restore's spelling."""
    return offsets.end(tp, total_s, committed=committed, slice_s=slice_s)


class GroupOffsets:
    """A consumer group's committed offsets, read without joining the group: a consumer of that
    group id that never subscribes, never assigns and never commits asks its coordinator
    (OffsetFetch) through `committed()`, the path every member runs on each rebalance, not the
    admin client's coordinator requests (see the module's docstring). read_uncommitted: an
    offset in a transaction still open is not waited for (OffsetFetch's RequireStable)."""

    def __init__(self, settings: KafkaSettings, group: str, *, logger: Any = None) -> None:
        cfg = consumer_config(settings, group, read_committed=False)
        cfg["enable.auto.commit"] = False
        cfg["enable.auto.offset.store"] = False
        if logger is not None:
            cfg["logger"] = logger
        self._consumer = Consumer(cfg)

    def committed(self, tp: TopicPartition, timeout: float) -> int | None:
        """The group's committed offset of `tp` (the next input it will read); None when it has
        none or the cluster did not answer within `timeout`."""
        try:
            [got] = self._consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=timeout)
        except KafkaException:
            return None
        return None if got.error is not None or got.offset < 0 else int(got.offset)

    def close(self) -> None:
        self._consumer.close()
