"""Executor metrics bookkeeping: tallies reach Prometheus only on flush/commit, and the settings."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from processors.executors.metrics import ChildBatchTally, ChildExecutorMetrics, WorkerMetrics
from processors.executors.settings import ChildExecutorSettings, WorkerSettings


def test_worker_tallies_apply_once_per_flush() -> None:
    m = WorkerMetrics()
    v = m.registry.get_sample_value
    m.count_activation("default", "charge")
    m.count_activation("default", "charge")
    m.count_activation("agents", "agent:planner")
    m.count_outcome("charge", "ActivationCompleted", None)
    m.count_outcome("charge", "ActivationFailed", "InvalidInput")
    m.count_outcome("charge", "ActivationFailed", "InvalidInput")
    m.count_outcome("agent:planner", "ActivationCancelled", None)
    m.observe_handler("charge", 0.003)
    m.observe_handler("charge", 2.0)
    for kind in ("ActivationAccepted", "ActivationAccepted", "ActivationHeartbeat", "ActivationCompleted"):
        m.count_receipt(kind)
    m.count("offsets_committed", n=3)
    m.count("offset_commits", "requested")
    m.count("cancel_signals", "deadline")
    m.count("receipt_errors", "lost")
    m.count("consumer_replacements")
    m.count("dead_letters")
    assert v("runfold_worker_activations_total", {"queue": "default", "action": "charge"}) is None  # not yet

    m.flush(in_flight=5, backlog=7, paused=True)
    m.flush(in_flight=4, backlog=0, paused=False)  # nothing pending: counters unchanged, gauges follow
    assert v("runfold_worker_activations_total", {"queue": "default", "action": "charge"}) == 2
    assert v("runfold_worker_activations_total", {"queue": "agents", "action": "agent:planner"}) == 1
    assert v("runfold_worker_outcomes_total", {"action": "charge", "outcome": "completed", "code": ""}) == 1
    assert (
        v("runfold_worker_outcomes_total", {"action": "charge", "outcome": "failed", "code": "InvalidInput"})
        == 2
    )
    assert (
        v("runfold_worker_outcomes_total", {"action": "agent:planner", "outcome": "cancelled", "code": ""})
        == 1
    )
    assert v("runfold_worker_handler_seconds_count", {"action": "charge"}) == 2
    assert v("runfold_worker_handler_seconds_bucket", {"action": "charge", "le": "0.005"}) == 1
    assert v("runfold_worker_handler_seconds_sum", {"action": "charge"}) == pytest.approx(2.003)
    assert v("runfold_worker_receipts_total", {"type": "ActivationAccepted"}) == 2
    assert v("runfold_worker_receipts_total", {"type": "ActivationHeartbeat"}) == 1
    assert v("runfold_worker_offsets_committed_total") == 3
    assert v("runfold_worker_offset_commits_total", {"outcome": "requested"}) == 1
    assert v("runfold_worker_cancel_signals_total", {"kind": "deadline"}) == 1
    assert v("runfold_worker_receipt_errors_total", {"outcome": "lost"}) == 1
    assert v("runfold_worker_consumer_replacements_total") == 1
    assert v("runfold_worker_dead_letters_total") == 1
    assert (v("runfold_worker_in_flight"), v("runfold_worker_backlog"), v("runfold_worker_paused")) == (
        4,
        0,
        0,
    )


def test_child_batch_counts_only_when_committed() -> None:
    m = ChildExecutorMetrics()
    v = m.registry.get_sample_value
    tally = ChildBatchTally(activations=3, cancels=1, dead_letters=1)
    tally.count_finished("succeeded")
    tally.count_finished("succeeded")
    tally.count_finished("failed")
    m.aborted()  # an aborted batch's tally is dropped by the executor; only the abort is counted
    m.committed(tally, records=9, commit_seconds=0.004, tracked=2)
    assert v("runfold_child_executor_activations_total") == 3
    assert v("runfold_child_executor_cancels_total") == 1
    assert v("runfold_child_executor_commands_total", {"type": "StartRun"}) == 3
    assert v("runfold_child_executor_commands_total", {"type": "CancelRun"}) == 1
    assert v("runfold_child_executor_receipts_total", {"status": "succeeded"}) == 2
    assert v("runfold_child_executor_receipts_total", {"status": "failed"}) == 1
    assert v("runfold_child_executor_receipts_total", {"status": "cancelled"}) is None
    assert v("runfold_child_executor_dead_letters_total") == 1
    assert v("runfold_child_executor_transactions_total", {"outcome": "committed"}) == 1
    assert v("runfold_child_executor_transactions_total", {"outcome": "aborted"}) == 1
    assert v("runfold_child_executor_batch_records_sum") == 9
    assert v("runfold_child_executor_children_tracked") == 2


def test_served_endpoint_has_own_registry_and_process_metrics() -> None:
    worker, child = WorkerMetrics(), ChildExecutorMetrics()
    worker.count("dead_letters")
    worker.flush(0, 0, False)
    port = worker.serve(0, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        worker.close()
    assert "runfold_worker_dead_letters_total 1.0" in text
    assert "process_cpu_seconds_total" in text and "python_gc_objects_collected_total" in text
    assert "runfold_child_executor" not in text
    assert child.registry.get_sample_value("runfold_worker_dead_letters_total") is None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_metrics_port_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().metrics_port is None and ChildExecutorSettings().metrics_port is None
    monkeypatch.setenv("RUNFOLD_WORKER_METRICS_PORT", "9464")
    monkeypatch.setenv("RUNFOLD_CHILD_EXECUTOR_METRICS_PORT", "0")
    monkeypatch.setenv("RUNFOLD_CHILD_EXECUTOR_INSTANCE_ID", "b")
    assert WorkerSettings().metrics_port == 9464
    child = ChildExecutorSettings()
    assert (child.metrics_port, child.instance_id) == (0, "b")
    with pytest.raises(ValidationError):
        WorkerSettings(metrics_port=70_000)
