"""Prometheus metrics of one processor (its own registry, served on its own port).

The hot loop never touches a metric per record: it counts into plain dicts and
`ProcessorMetrics.flush_batch` applies them once per transaction.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from processors.engine.vocabulary import RUN_STATUSES
from processors.metrics_endpoint import MetricsEndpoint
from processors.runtime.drop_reasons import dropped_reason

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


class ProcessorMetrics(MetricsEndpoint):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = self._new_registry(registry)
        self.records_in = Counter(
            "runfold_processor_records_in", "Input records consumed", ["topic"], registry=r
        )
        self.records_out = Counter("runfold_processor_records_out", "Records produced", ["topic"], registry=r)
        self.transactions = Counter(
            "runfold_processor_transactions", "Kafka transactions", ["outcome"], registry=r
        )
        self.commit_latency = Histogram(
            "runfold_processor_commit_seconds",
            "send_offsets + commit_transaction time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "runfold_processor_batch_records",
            "Input records per transaction",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
            registry=r,
        )
        self.loop_stalls = Counter(
            "runfold_processor_loop_stalls",
            "Times the loop began no iteration for stall_timeout_ms (watchdog)",
            registry=r,
        )
        self.producers_replaced = Counter(
            "runfold_processor_producers_replaced",
            "Transactional producers replaced, by reason: fatal, cluster_unreachable, abort_timed_out, "
            "call_abandoned, coordinator_moved",
            ["reason"],
            registry=r,
        )
        self.runs_purged = Counter(
            "runfold_processor_runs_purged",
            "Finished runs purged from the local store after finished_retention_ms",
            registry=r,
        )
        self.runs_by_status = Gauge(
            "runfold_processor_runs", "Runs in the owned partitions, by status", ["status"], registry=r
        )
        self.consumer_lag = Gauge(
            "runfold_processor_consumer_lag", "High watermark - position", ["topic", "partition"], registry=r
        )
        self.dead_letters = Counter(
            "runfold_processor_dead_letters", "Records sent to the dead-letter topic", ["reason"], registry=r
        )
        self.dropped = Counter(
            "runfold_processor_dropped_inputs",
            "Inputs that changed nothing, by reason",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "runfold_processor_rejected_commands", "RunRejected events, by code", ["code"], registry=r
        )
        self.misrouted = Counter(
            "runfold_processor_misrouted_inputs",
            "Inputs that arrived on a partition that does not own their run id (the producer's partitioner "
            "is not murmur2), forwarded to the owning partition",
            ["topic"],
            registry=r,
        )
        self.retimed = Counter(
            "runfold_processor_retimed_inputs",
            "Receipts whose ts_ms was implausible against their Kafka record timestamp, folded at the record "
            "timestamp instead",
            ["topic"],
            registry=r,
        )
        self.runs_seeded = Counter(
            "runfold_processor_runs_seeded",
            "Runs a restore took from their run-state snapshot instead of folding their events",
            registry=r,
        )
        self.events_restored = Counter(
            "runfold_processor_events_restored", "Run events folded while restoring", registry=r
        )
        self.events_before_start = Counter(
            "runfold_processor_restore_events_before_start",
            "Run events skipped while restoring: their run's RunAccepted is no longer in the log "
            "(run-events retention shorter than the run)",
            registry=r,
        )
        self.partitions_restoring = Gauge(
            "runfold_processor_partitions_restoring", "Partitions restoring their store", registry=r
        )
        self.partitions_assigned = Gauge(
            "runfold_processor_partitions_assigned", "Input partitions owned", registry=r
        )
        self.timers_fired = Counter(
            "runfold_processor_timers_fired", "TimerFired receipts produced", registry=r
        )
        self.timer_lateness = Histogram(
            "runfold_processor_timer_lateness_seconds",
            "Fire time minus due time",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.timer_check = Histogram(
            "runfold_processor_timer_check_seconds",
            "Due-timer scan time",
            buckets=(0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05),
            registry=r,
        )
        self.definitions = Gauge("runfold_processor_definitions", "Definitions in the catalogue", registry=r)
        self.queue_unconsumed = Gauge(
            "runfold_processor_queue_unconsumed",
            "1 when activations were dispatched to the queue and no live consumer is assigned its topic",
            ["queue"],
            registry=r,
        )
        self.definition_errors = Counter(
            "runfold_processor_definition_errors", "Definition records that failed validation", registry=r
        )
        self._status_counts: dict[str, int] = {}

    def flush_batch(
        self,
        records_in: dict[str, int],
        records_out: dict[str, int],
        dead: dict[str, int],
        dropped: dict[str, int],
        rejected: dict[str, int],
        batch_records: int,
        misrouted: dict[str, int] | None = None,
        retimed: dict[str, int] | None = None,
    ) -> None:
        for topic, n in records_in.items():
            self.records_in.labels(topic).inc(n)
        for topic, n in records_out.items():
            self.records_out.labels(topic).inc(n)
        for reason, n in dead.items():
            self.dead_letters.labels(reason).inc(n)
        for reason, n in dropped.items():
            self.dropped.labels(dropped_reason(reason)).inc(n)  # a fixed set of labels
        for code, n in rejected.items():
            self.rejected.labels(code).inc(n)
        for topic, n in (misrouted or {}).items():
            self.misrouted.labels(topic).inc(n)
        for topic, n in (retimed or {}).items():
            self.retimed.labels(topic).inc(n)
        self.batch_size.observe(batch_records)

    def set_run_statuses(self, stats: list[dict[str, int]]) -> None:
        """Runs per status summed over the owned partitions' store stats."""
        totals: dict[str, int] = {}
        for st in stats:
            for name, value in st.items():
                if name.startswith("status."):
                    totals[name[7:]] = totals.get(name[7:], 0) + value
        for status in RUN_STATUSES:
            self.runs_by_status.labels(status).set(totals.get(status, 0))
