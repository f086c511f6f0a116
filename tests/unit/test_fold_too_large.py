"""What the processor folds in place of an input whose outputs the broker refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from fold_rig import CODEC, TOPICS, TS, Rig, contents, restore, start, state, timer_ids

from processors.runtime.fold import TxnCounters, _too_large_instead
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.timers import TimerFirer

STEP = {
    "run_id": "r1",
    "ts_ms": 5,
    "record_id": "x",
    "node": "a",
    "lineage": "",
    "attempt": 2,
    "dispatch_id": "d",
}


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
    sub = _too_large_instead(
        {"type": "SignalRun", "run_id": "r1", "ts_ms": 5, "record_id": "c1", "signal": "go"}, "too large"
    )
    assert sub is not None and sub["type"] == "RunRejected" and sub["code"] == "Limit"
    assert sub["command_type"] == "SignalRun" and sub["sequence"] == 0 and sub["run_id"] == "r1"


def test_any_other_input_fails_its_run_with_a_limit_failure_that_says_what_was_refused() -> None:
    timer = {"type": "TimerFired", "run_id": "r1", "ts_ms": 7, "record_id": "timer:t@7", "timer_id": "t"}
    sub = _too_large_instead(timer, "activations record refused")
    assert (sub["type"], sub["run_id"], sub["ts_ms"], sub["record_id"]) == ("FailRun", "r1", 7, "timer:t@7")
    assert sub["code"] == "Limit" and sub["message"].startswith("the outputs of this timer are larger than")
    assert "activations record refused" in sub["message"]
    accepted = _too_large_instead(
        {**STEP, "type": "ActivationAccepted", "worker_id": "w", "lease_ms": 9}, "x"
    )
    assert accepted["type"] == "FailRun" and "this ActivationAccepted receipt" in accepted["message"]


METRICS = ProcessorMetrics()
SLEEP_THEN_ACT = {
    "schema": "runfold.workflow/v1",
    "id": "sleepy",
    "revision": 1,
    "entry": ["s"],
    "state": {"b": None},
    "routes": {"s": ["b"]},
    "nodes": {
        "s": {"kind": "sleep", "duration_ms": 500},
        "b": {"kind": "action", "action": "b", "writes": {"b": {"from": "output"}}},
    },
}


@pytest.mark.parametrize("level", [0, 2])
def test_a_sleep_whose_wake_up_is_refused_fails_its_run_and_the_store_restores_the_same(
    tmp_path: Path, level: int
) -> None:
    """Without a substitute the sleep's successor would never be dispatched and the run would wait
    for good (the timer was cleared when it fired). At level 2 (the substitute refused too) only
    the dead letter goes, and the fired timer is still done."""
    rig = Rig(tmp_path / "s")
    rig.folder.ctx.catalog.register(SLEEP_THEN_ACT)
    rig.transaction(("commands", {**start("r")[1], "definition_id": "sleepy"}))
    # Fired, but the firing's store write never happened (a crash after its commit): the store
    # still holds the timer, which the parked TimerFired must end as folding it would.
    fired: list[bytes] = []
    firer = TimerFirer(
        CODEC, TOPICS.receipts, lambda topic, value, key, **kw: fired.append(value), METRICS, 100
    )
    firer.fire_due(rig.store, PartitionOverlay(rig.store), TS + 500)
    [timer] = [t for t in (CODEC.decode("receipts", raw) for raw in fired) if t["timer_kind"] == "sleep"]
    assert any(t.startswith("sleep") for t in timer_ids(rig.store, "r"))
    before = len(rig.out)
    ov, counters = PartitionOverlay(rig.store), TxnCounters()
    rig.folder.park_too_large(
        ov, counters, TOPICS.receipts, 0, 9, b"r", CODEC.encode("receipts", timer), "record too large", level
    )
    rig.folder.snapshots(ov, 0, counters)
    ov.write(None)
    out = rig.out[before:]
    [dead] = [CODEC.decode("dead_letters", v) for t, v in out if t == TOPICS.dead_letters]
    assert (dead["source_offset"], dead["key"], dead["error"]) == (
        9,
        b"r",
        "output too large: record too large",
    )
    assert bool(dead["original"]) is (level == 0) and counters.dead == {"output_too_large": 1}
    events = [CODEC.decode("run_events", v) for t, v in out if t == TOPICS.run_events]
    assert not [t for t, _ in out if t == TOPICS.activations("default")]  # b is never dispatched
    assert not [t for t in timer_ids(rig.store, "r") if t.startswith("sleep")]
    if level == 2:
        assert events == [] and state(rig.store, "r")["status"] == "running"
        return
    assert timer_ids(rig.store, "r") == []  # the wall-time timer went with the run
    assert [e["type"] for e in events] == ["StepCancelled", "RunFailed"]  # no StepSucceeded for the sleep
    assert events[0]["node"] == "s" and events[0]["reason"] == "run failed: Limit"
    failure = events[-1]["failure"]
    assert failure["code"] == "Limit" and failure["message"].startswith(
        "the outputs of this timer are larger than"
    )
    assert state(rig.store, "r")["status"] == "failed"
    restored = restore(rig, tmp_path / "restored")
    assert contents(restored) == contents(rig.store)
    restored.close()
