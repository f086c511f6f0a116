"""Prometheus metrics of the action worker and the child-run executor (own registry each).

Neither loop touches a metric per record. The worker tallies into plain dicts
(`WorkerMetrics.count_*`, a dict update each) and `flush` applies them at most every tick
(`runner.TICK_S`); the child executor tallies one transaction's work in a `ChildBatchTally`
and applies it only once the transaction has committed (an aborted batch is re-read, so
counting it would count its records twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from processors.metrics_endpoint import MetricsEndpoint

_HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OUTCOME_BY_RECEIPT = {
    "ActivationCompleted": "completed",
    "ActivationFailed": "failed",
    "ActivationCancelled": "cancelled",
}


def _bump(tally: dict[Any, int], key: Any, n: int = 1) -> None:
    tally[key] = tally.get(key, 0) + n


class WorkerMetrics(MetricsEndpoint):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = self._new_registry(registry)
        self.activations = Counter(
            "runfold_worker_activations",
            "Activations received (first delivery)",
            ["queue", "action"],
            registry=r,
        )
        self.outcomes = Counter(
            "runfold_worker_outcomes",
            "Terminal receipts sent: completed, failed (by code) or cancelled",
            ["action", "outcome", "code"],
            registry=r,
        )
        self.handler_seconds = Histogram(
            "runfold_worker_handler_seconds",
            "Handler run time (start to return)",
            ["action"],
            buckets=_HANDLER_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("runfold_worker_in_flight", "Handlers running now", registry=r)
        self.backlog = Gauge(
            "runfold_worker_backlog", "Activations read, waiting for a handler slot", registry=r
        )
        self.paused = Gauge(
            "runfold_worker_paused", "1 while the assigned partitions are paused (backpressure)", registry=r
        )
        self.receipts = Counter(
            "runfold_worker_receipts", "Receipts handed to the producer, by type", ["type"], registry=r
        )
        self.receipt_errors = Counter(
            "runfold_worker_receipt_errors",
            "Terminal receipts whose delivery failed: retried, or lost after 3 attempts",
            ["outcome"],
            registry=r,
        )
        self.redeliveries = Counter(
            "runfold_worker_redeliveries",
            "Activations delivered again while running/waiting or after settling",
            ["state"],
            registry=r,
        )
        self.cancel_signals = Counter(
            "runfold_worker_cancel_signals",
            "Handlers told to stop: cancel notice, deadline or worker shutdown",
            ["kind"],
            registry=r,
        )
        self.leases_abandoned = Counter(
            "runfold_worker_leases_abandoned",
            "Handlers still running past deadline + cancel grace: heartbeats stop, "
            "the processor's lease expires",
            registry=r,
        )
        self.dead_letters = Counter(
            "runfold_worker_dead_letters", "Undecodable activations sent to dead letters", registry=r
        )
        self.consumer_replacements = Counter(
            "runfold_worker_consumer_replacements", "Consumers replaced by the stall watchdog", registry=r
        )
        self.offset_commits = Counter(
            "runfold_worker_offset_commits",
            "Offset commits: requested (async during the loop), failed to request, "
            "and the coordinator's answer (committed, rejected)",
            ["outcome"],
            registry=r,
        )
        self.offsets_committed = Counter(
            "runfold_worker_offsets_committed", "Partition offsets in the commit requests", registry=r
        )
        self._activations: dict[tuple[str, str], int] = {}
        self._outcomes: dict[tuple[str, str, str], int] = {}
        self._durations: list[tuple[str, float]] = []
        self._receipts: dict[str, int] = {}
        self._simple: dict[tuple[str, str], int] = {}  # (metric, label or "") -> n

    # ---- tallies (the loop thread only; plain dict updates)

    def count_activation(self, queue: str, action: str) -> None:
        _bump(self._activations, (queue, action))

    def count_outcome(self, action: str, receipt_type: str, code: str | None) -> None:
        _bump(self._outcomes, (action, OUTCOME_BY_RECEIPT.get(receipt_type, "failed"), code or ""))

    def observe_handler(self, action: str, seconds: float) -> None:
        self._durations.append((action, seconds))

    def count_receipt(self, receipt_type: str) -> None:
        _bump(self._receipts, receipt_type)

    def count(self, metric: str, label: str = "", n: int = 1) -> None:
        """One of: receipt_errors(outcome), redeliveries(state), cancel_signals(kind),
        leases_abandoned, dead_letters, consumer_replacements, offset_commits(outcome), offsets_committed."""
        _bump(self._simple, (metric, label), n)

    # ---- applied at most once per tick

    def flush(self, in_flight: int, backlog: int, paused: bool) -> None:
        if self._activations:
            for (queue, action), n in self._activations.items():
                self.activations.labels(queue, action).inc(n)
            self._activations.clear()
        if self._outcomes:
            for (action, outcome, code), n in self._outcomes.items():
                self.outcomes.labels(action, outcome, code).inc(n)
            self._outcomes.clear()
        if self._durations:
            for action, seconds in self._durations:
                self.handler_seconds.labels(action).observe(seconds)
            self._durations.clear()
        if self._receipts:
            for kind, n in self._receipts.items():
                self.receipts.labels(kind).inc(n)
            self._receipts.clear()
        if self._simple:
            for (metric, label), n in self._simple.items():
                counter: Counter = getattr(self, metric)
                (counter.labels(label) if label else counter).inc(n)
            self._simple.clear()
        self.in_flight.set(in_flight)
        self.backlog.set(backlog)
        self.paused.set(1 if paused else 0)


@dataclass(slots=True)
class ChildBatchTally:
    """What one child-executor transaction did (applied only if it commits)."""

    activations: int = 0
    expired: int = 0  # activations past their deadline: no child started
    cancels: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # ChildRunFinished by status
    dead_letters: int = 0

    def count_finished(self, status: str) -> None:
        _bump(self.finished, status)


class ChildExecutorMetrics(MetricsEndpoint):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = self._new_registry(registry)
        self.activations = Counter(
            "runfold_child_executor_activations", "ChildRunActivation records handled", registry=r
        )
        self.expired = Counter(
            "runfold_child_executor_expired",
            "ChildRunActivation records past their deadline: the child was not started",
            registry=r,
        )
        self.cancels = Counter("runfold_child_executor_cancels", "ChildRunCancel records handled", registry=r)
        self.commands = Counter(
            "runfold_child_executor_commands", "Commands produced (committed), by type", ["type"], registry=r
        )
        self.receipts = Counter(
            "runfold_child_executor_receipts",
            "ChildRunFinished receipts produced (committed), by status",
            ["status"],
            registry=r,
        )
        self.dead_letters = Counter(
            "runfold_child_executor_dead_letters",
            "Undecodable child activations sent to dead letters",
            registry=r,
        )
        self.transactions = Counter(
            "runfold_child_executor_transactions", "Kafka transactions, by outcome", ["outcome"], registry=r
        )
        self.commit_seconds = Histogram(
            "runfold_child_executor_commit_seconds",
            "send_offsets + commit_transaction time",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.batch_records = Histogram(
            "runfold_child_executor_batch_records",
            "Input records per transaction",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
            registry=r,
        )
        self.children_tracked = Gauge(
            "runfold_child_executor_children_tracked",
            "Running children whose parent step is held in memory",
            registry=r,
        )

    def committed(self, tally: ChildBatchTally, records: int, commit_seconds: float, tracked: int) -> None:
        if tally.activations:
            self.activations.inc(tally.activations)
            self.commands.labels("StartRun").inc(tally.activations)
        if tally.expired:
            self.expired.inc(tally.expired)
        if tally.cancels:
            self.cancels.inc(tally.cancels)
            self.commands.labels("CancelRun").inc(tally.cancels)
        for status, n in tally.finished.items():
            self.receipts.labels(status).inc(n)
        if tally.dead_letters:
            self.dead_letters.inc(tally.dead_letters)
        self.transactions.labels("committed").inc()
        self.commit_seconds.observe(commit_seconds)
        self.batch_records.observe(records)
        self.children_tracked.set(tracked)

    def aborted(self) -> None:
        self.transactions.labels("aborted").inc()
