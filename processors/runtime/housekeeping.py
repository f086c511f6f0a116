"""Between transactions: purge finished runs past their retention, report consumer lag and
runs by status. A part of `Processor` (loop.py), which owns the state declared here."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from processors.runtime.assignment import Partitions
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.txn import ProduceFailed, Txn, now_ms
from topology.catalog import TopicNames

_LAG_EVERY_S = 5.0
_PURGE_EVERY_S = 1.0


class Housekeeping:
    topics: TopicNames
    txn: Txn
    partitions: Partitions | None
    metrics: ProcessorMetrics
    purge_page: int  # finished runs purged per partition and transaction
    _consumer: Consumer | None
    _next_lag: float
    _next_purge: float
    _purge_more: bool  # the last purge pass left due runs behind (a full page)

    if TYPE_CHECKING:
        def _begin(self) -> None: ...
        def _commit(self) -> None: ...
        def _overlay(self, partition: int, store: Any) -> PartitionOverlay: ...
        def _produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None: ...
        def _produce_failed(self, err: KafkaError, stage: str) -> None: ...

    def _refresh_statuses(self) -> None:
        assert self.partitions is not None
        self.metrics.set_run_statuses([s.stats for s in self.partitions.ready()])

    def _purge_finished(self, busy: bool = False) -> None:
        """Finished runs past `finished_retention_ms` leave the local store and the run-state
        table: a transaction of their run-state tombstones, whose commit applies the store
        deletions (overlay). Only between transactions, so no overlay holds a purged run; an
        abort leaves them for the next pass. A pass takes at most a page per partition; while
        one fills a page the next pass follows at once, so a backlog (a burst of runs finishing
        together, a long stop) drains at the loop's pace rather than a page a second. `busy`
        (this iteration folded input): a tenth of a page, so that a backlog holds live runs
        up ~25 ms a partition between their transactions, not ~100 (benchmarks/purge_bench.py)."""
        assert self.partitions is not None
        self._next_purge = time.monotonic() + _PURGE_EVERY_S
        now = now_ms()
        page = max(1, self.purge_page // 10) if busy else self.purge_page
        due = [(store, store.due_purges(now, page)) for store in self.partitions.ready()]
        due = [(store, runs) for store, runs in due if runs]
        self._purge_more = any(len(runs) >= page for _, runs in due)
        if not due:
            return
        self._begin()
        try:
            for store, runs in due:
                ov = self._overlay(store.partition, store)
                for xkey, run_id, status in runs:
                    if status is not None:  # else a stale entry: only it goes
                        self._produce(self.topics.run_state, None, run_id.encode(), partition=store.partition)
                        self.txn.counters.purged += 1
                    ov.purge(xkey, run_id, status)
        except ProduceFailed as e:  # the next pass takes them again
            self._produce_failed(e.err, "purge")
            return
        self._commit()

    def _report_lag(self) -> None:
        self._next_lag = time.monotonic() + _LAG_EVERY_S
        consumer = self._consumer
        assert consumer is not None and self.partitions is not None
        tps = [TopicPartition(t, p) for p in self.partitions.owned()
               for t in (self.topics.commands, self.topics.receipts)]
        if not tps:
            return
        try:
            for tp in consumer.position(tps):
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))
        except KafkaException:
            pass
