"""Between transactions: purge finished runs past their retention, report consumer lag and
runs by status."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaException, TopicPartition

from processors.runtime.assignment import Partitions
from processors.runtime.membership import GroupMembership
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.store import PURGE_PAGE, PartitionStore
from processors.runtime.txn import Failures, ProduceFailed, Transaction, now_ms
from topology.catalog import TopicNames

_LAG_EVERY_S = 5.0
_PURGE_EVERY_S = 1.0
_Due = list[tuple[PartitionStore, list[tuple[bytes, str, str | None]]]]  # partitions and their runs to purge


class Housekeeping:
    def __init__(
        self,
        topics: TopicNames,
        txn: Transaction,
        failures: Failures,
        membership: GroupMembership,
        metrics: ProcessorMetrics,
        purge_page: int = PURGE_PAGE,
        marker: Callable[[str, str], bytes] | None = None,
    ) -> None:
        self._topics = topics
        self._txn = txn
        self._failures = failures
        self._membership = membership
        self._metrics = metrics
        self.purge_page = purge_page  # finished runs purged per partition and transaction
        # a purged run's record on run-state (schemas/run_state.py); None: a tombstone (tests)
        self._marker = marker
        self.next_lag = 0.0  # monotonic time of the next lag report
        self.next_purge = 0.0  # monotonic time of the next purge pass
        self.purge_more = False  # the last purge pass left due runs behind (a full page)
        self._purge_turn = 0  # where the next purge pass starts (an index into the ready partitions)

    @property
    def _partitions(self) -> Partitions:
        partitions = self._membership.partitions
        assert partitions is not None
        return partitions

    def refresh_statuses(self) -> None:
        self._metrics.set_run_statuses([s.stats for s in self._partitions.ready()])

    def purge_finished(self, folded: int = 0) -> None:
        """Finished runs past `finished_retention_ms` leave the local store and the run-state
        table: a transaction of their run-state tombstones, whose commit applies the store
        deletions (overlay). Only between transactions, so no overlay holds a purged run; an
        abort leaves them for the next pass.

        An idle pass takes at most a page per partition. After a transaction that folded
        `folded` inputs, a pass takes at most a tenth of a page plus `folded` runs in all,
        partition after partition in turn. A backlog then holds live runs up between their
        transactions ~21 ms plus at most about two thirds of the transaction's own fold time
        (purge 0.13-0.22 ms a run, benchmarks/purge_bench.py --page 100; fold ~0.3 ms an
        input), not ~100 ms per partition; and it drains faster than runs finish, each having
        taken an input, even under saturation. While a pass fills its share the next pass
        comes at the next iteration, so a backlog (a burst of runs finishing together, a long
        stop) drains at the loop's pace rather than once a second."""
        self.next_purge = time.monotonic() + _PURGE_EVERY_S
        stores = self._partitions.ready()
        budget = max(1, self.purge_page // 10) + folded if folded else self.purge_page * len(stores)
        due, self.purge_more = self._due_in_turn(stores, now_ms(), budget)
        owed = [store for store in stores if store.owed_tombstones]
        if not due and not owed:
            return
        for store, runs in due:
            store.mark_purging(runs)  # a crash before its commit is written: the store redoes it
        self._txn.begin()
        try:
            for store in owed:  # of a page a store purged itself once restored (redo_interrupted_purge)
                for run_id in store.owed_tombstones:
                    self._txn.produce(
                        self._topics.run_state,
                        self._marker_of(run_id, store.purged_status(run_id)),
                        run_id.encode(),
                        partition=store.partition,
                    )
                self._txn.overlay(store.partition, store).owed_paid = True
            for store, runs in due:
                ov = self._txn.overlay(store.partition, store)
                for xkey, run_id, status in runs:
                    if status is not None:  # else a stale entry: only it goes
                        self._txn.produce(
                            self._topics.run_state,
                            self._marker_of(run_id, status),
                            run_id.encode(),
                            partition=store.partition,
                        )
                        self._txn.counters.purged += 1
                    ov.purge(xkey, run_id, status)
        except ProduceFailed as e:  # the next pass takes them again
            self._failures.produce_failed(e.err, "purge")
            return
        self._txn.commit()

    def _marker_of(self, run_id: str, status: str | None) -> bytes | None:
        """What replaces a purged run's snapshot: its marker (its id stays in run-state)."""
        if self._marker is None:
            return None
        return self._marker(run_id, status or "purged")

    def _due_in_turn(self, stores: list[PartitionStore], now: int, budget: int) -> tuple[_Due, bool]:
        """Up to `budget` due runs, at most a page from each partition, starting after the
        partition where the last pass ran out of budget; and whether one came back full (more
        are due)."""
        due: _Due = []
        full = False
        for i in range(len(stores)):
            k = (self._purge_turn + i) % len(stores)
            cap = min(self.purge_page, budget)
            if runs := stores[k].due_purges(now, cap):
                due.append((stores[k], runs))
                full = full or len(runs) >= cap
                budget -= len(runs)
                if budget <= 0:
                    self._purge_turn = k + 1
                    break
        return due, full

    def report_lag(self) -> None:
        self.next_lag = time.monotonic() + _LAG_EVERY_S
        consumer = self._membership.consumer
        assert consumer is not None
        tps = [
            TopicPartition(t, p)
            for p in self._partitions.owned()
            for t in (self._topics.commands, self._topics.receipts)
        ]
        if not tps:
            return
        try:
            for tp in consumer.position(tps):
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self._metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(
                        max(0, high - tp.offset)
                    )
        except KafkaException:
            pass
