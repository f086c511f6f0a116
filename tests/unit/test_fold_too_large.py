"""What the processor folds in place of an input whose outputs the broker refuses."""

from __future__ import annotations

from pathlib import Path

from fold_rig import CODEC, TOPICS, TS, Rig, fire, start, state, timer_ids

from processors.runtime.fold import TxnCounters, _too_large_instead
from processors.runtime.overlay import PartitionOverlay

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


def test_a_command_becomes_its_limit_rejection() -> None:
    sub = _too_large_instead({"type": "SignalRun", "run_id": "r1", "ts_ms": 5, "record_id": "c1",
                              "signal": "go"}, "too large")  # fmt: skip
    assert sub is not None and sub["type"] == "RunRejected" and sub["code"] == "Limit"
    assert sub["command_type"] == "SignalRun" and sub["sequence"] == 0 and sub["run_id"] == "r1"


def test_any_other_input_fails_its_run_with_a_limit_failure_that_says_what_was_refused() -> None:
    timer = {"type": "TimerFired", "run_id": "r1", "ts_ms": 7, "record_id": "timer:t@7", "timer_id": "t"}
    sub = _too_large_instead(timer, "activations record refused")
    assert (sub["type"], sub["run_id"], sub["ts_ms"], sub["record_id"]) == ("FailRun", "r1", 7, "timer:t@7")
    assert sub["code"] == "Limit" and sub["message"].startswith("the outputs of this timer are larger than")
    assert "activations record refused" in sub["message"]
    accepted = _too_large_instead({**STEP, "type": "ActivationAccepted", "worker_id": "w", "lease_ms": 9}, "x")
    assert accepted["type"] == "FailRun" and "this ActivationAccepted receipt" in accepted["message"]


def test_a_fired_timer_whose_outputs_are_refused_fails_its_run_cancels_its_steps_and_is_done(
    tmp_path: Path,
) -> None:
    """Without a substitute a fired timer whose outputs are refused would leave its step waiting
    for good (a sleep whose successor is never dispatched, a retry never sent); here it is the
    run's wall-time timer, with an accepted step still open."""
    rig = Rig(tmp_path / "s")
    rig.transaction(start("r"))
    act = rig.activation("r")
    rig.transaction(("receipts", {"type": "ActivationAccepted", "run_id": "r", "ts_ms": TS + 1, "record_id": "acc",
                                  "node": "a", "lineage": "", "attempt": act["attempt"],
                                  "dispatch_id": act["dispatch_id"], "worker_id": "w", "lease_ms": 10_000}))  # fmt: skip
    [timer] = [t for t in fire(rig, TS + 3_600_000) if t["timer_kind"] == "wall_time"]
    before = len(rig.out)
    ov, counters = PartitionOverlay(rig.store), TxnCounters()
    rig.folder.park_too_large(ov, counters, TOPICS.receipts, 0, 9, b"r", CODEC.encode("receipts", timer),
                              "record too large", 0)  # fmt: skip
    rig.folder.snapshots(ov, 0, counters)
    ov.write(None)
    out = rig.out[before:]
    [dead] = [CODEC.decode("dead_letters", v) for t, v in out if t == TOPICS.dead_letters]
    assert (dead["source_offset"], dead["key"], dead["error"]) == (9, b"r", "output too large: record too large")
    events = [CODEC.decode("run_events", v) for t, v in out if t == TOPICS.run_events]
    assert [e["type"] for e in events] == ["StepCancelled", "RunFailed"]
    assert events[-1]["failure"]["code"] == "Limit" and "this timer" in events[-1]["failure"]["message"]
    [cancel] = [CODEC.decode("activations", v) for t, v in out if t == TOPICS.activations("default")]
    assert cancel["type"] == "CancelActivation" and cancel["dispatch_id"] == act["dispatch_id"]
    assert state(rig.store, "r")["status"] == "failed" and timer_ids(rig.store, "r") == []
    assert counters.dead == {"output_too_large": 1}
