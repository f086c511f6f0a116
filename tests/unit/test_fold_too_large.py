"""What the processor folds in place of an input whose outputs the broker refuses."""

from __future__ import annotations

from processors.runtime.fold import _too_large_instead

STEP = {"run_id": "r1", "ts_ms": 5, "record_id": "x", "node": "a", "lineage": "", "attempt": 2, "dispatch_id": "d"}


def test_a_completed_receipt_becomes_a_non_retryable_invalid_output_failure_of_the_same_attempt() -> None:
    msg = {**STEP, "type": "ActivationCompleted", "worker_id": "w", "output": {"big": "x"}, "usage": None}
    sub = _too_large_instead(msg, "run-events record of 2000000 bytes refused")
    assert sub is not None and sub["type"] == "ActivationFailed" and sub["code"] == "InvalidOutput"
    assert sub["retryable"] is False and sub["output"] is None
    assert (sub["attempt"], sub["dispatch_id"], sub["worker_id"]) == (2, "d", "w")
    assert "larger than the broker accepts" in sub["message"] and "2000000 bytes" in sub["message"]


def test_a_child_result_becomes_a_failed_child() -> None:
    msg = {**STEP, "type": "ChildRunFinished", "child_run_id": "r1/a", "status": "succeeded", "output": [1]}
    sub = _too_large_instead(msg, "too large")
    assert sub is not None and sub["status"] == "failed" and sub["output"] is None
    assert sub["failure"]["code"] == "InvalidOutput" and sub["child_run_id"] == "r1/a"


def test_a_command_becomes_its_limit_rejection_and_other_receipts_have_no_substitute() -> None:
    sub = _too_large_instead({"type": "SignalRun", "run_id": "r1", "ts_ms": 5, "record_id": "c1",
                              "signal": "go"}, "too large")  # fmt: skip
    assert sub is not None and sub["type"] == "RunRejected" and sub["code"] == "Limit"
    assert sub["command_type"] == "SignalRun" and sub["sequence"] == 0 and sub["run_id"] == "r1"
    assert _too_large_instead({**STEP, "type": "ActivationAccepted", "worker_id": "w", "lease_ms": 9}, "x") is None
    assert _too_large_instead({"type": "TimerFired", "run_id": "r1", "ts_ms": 1, "timer_id": "t"}, "x") is None
