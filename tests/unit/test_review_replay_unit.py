"""Adversarial review (no broker): the Faust record's `.status` and replay's pure parts."""

from __future__ import annotations

from typing import Any

import orjson
from engine_harness import RunHarness, definition

from processors.downstream.faust_codec import CODEC_NAME, RunEvent
from processors.engine import evolve, run_status
from schemas import Codec


def _statuses(h: RunHarness) -> list[tuple[str, str | None, str]]:
    """(event type, RunEvent.status, run status after the event) for every event of the run,
    each event through the real codec and the Faust record."""
    codec = Codec.default()
    state: Any = None
    out = []
    for event in h.log:
        raw = codec.encode("run_events", orjson.loads(orjson.dumps(event)))
        rec = RunEvent.loads(raw, serializer=CODEC_NAME)
        state = evolve(state, codec.decode("run_events", raw))
        out.append((event["type"], rec.status, run_status(state)))
    return out


def test_faust_record_status_is_the_run_status_after_a_cancel_that_waits_for_a_stop() -> None:
    """docs/client.md, "Faust (faust-streaming)": the `RunEvent` record's "`.status` is the run's
    status after the event".

    A cancel of a run whose action is running emits `RunCancelling` (the run is `cancelling`
    until the attempt stops). The record must say so, not `None` ("unchanged": still running).
    """
    h = RunHarness(definition({"a": {"kind": "action", "action": "x"}}))
    h.start().accept("a").cancel("stop").stop_all()
    rows = _statuses(h)
    assert "RunCancelling" in [t for t, _, _ in rows], rows
    for etype, said, actual in rows:
        if etype == "RunCancelling":
            assert said == actual == "cancelling", (etype, said, actual)
    assert rows[-1][:2] == ("RunCancelled", "cancelled")


def test_faust_record_status_is_exact_for_a_run_waiting_on_one_node_at_a_time() -> None:
    """docs/client.md, "Faust (faust-streaming)": `.status` is what the event's type implies,
    exact while a run waits on one node at a time with nothing else running (after each event
    that sets one, it equals `run_status` of the folded state)."""
    h = RunHarness(
        definition(
            {
                "a": {"kind": "action", "action": "x"},
                "w": {"kind": "wait", "signal": "go"},
                "b": {"kind": "action", "action": "y"},
            },
            routes={"a": ["w"], "w": ["b"]},
        )
    )
    h.start().complete("a", {}).signal("go", {}).complete("b", {})
    rows = _statuses(h)
    assert {"RunWaiting", "SignalReceived", "RunSucceeded"} <= {t for t, _, _ in rows}, rows
    for i, (etype, said, actual) in enumerate(rows):
        if etype == "SignalReceived":  # the status once its wait's StepSucceeded, next, is folded
            assert rows[i + 1][0] == "StepSucceeded" and said == rows[i + 1][2] == "running", rows[i : i + 2]
        elif said is not None:
            assert said == actual, (etype, said, actual)


def test_faust_record_status_with_two_waits_open_is_the_documented_approximation() -> None:
    """docs/client.md, "Faust (faust-streaming)": with several waits open at once the exact
    status is derived from the whole state; a SignalReceived that leaves another wait waiting
    says `running` while `run_status` says `waiting` (a reviewer's finding, now documented)."""
    h = RunHarness(
        definition(
            {"w1": {"kind": "wait", "signal": "one"}, "w2": {"kind": "wait", "signal": "two"}},
            entry=["w1", "w2"],
        )
    )
    h.start().signal("one", {})
    [(said, actual)] = [(said, actual) for etype, said, actual in _statuses(h) if etype == "SignalReceived"]
    assert (said, actual) == ("running", "waiting")


def _workflow_tool_with_approval() -> RunHarness:
    from test_engine_agent_loop import ESCALATION, agent_node, calls, turn

    node = agent_node()
    node["tools"]["escalate"] = {
        "workflow": "escalation",
        "revision": 1,
        "description": "Hand to a human team",
        "approval": {"signal": "escalation-approval"},
    }
    h = RunHarness(ESCALATION, definition({"triage": node}, state={"triage": None}))
    h.root_id = "wf"
    h.start({"ticket": "t"})
    turn(h, 1, calls(("escalate", {"priority": "high"})))
    h.signal("escalation-approval", {"approved": True})  # approved: the call runs as its next attempt
    return h


def _as_executor_sees(h: RunHarness, known_parent: bool) -> list[dict[str, Any]]:
    """What the child executor sends back for the child's RunSucceeded: from its RunAccepted's
    ParentRef (`known_parent`), or from the child run id alone (after a restart or a rebalance)."""
    from processors.executors.child_executor import (
        finished_receipt,
        parent_step_from_id,
        parent_step_from_ref,
    )

    [act] = [m for m in h.messages if m["type"] == "ChildRunActivation"]
    child = act["child_run_id"]
    step = parent_step_from_ref(child, act["parent"]) if known_parent else parent_step_from_id(child)
    if step is None:
        return []
    done = {"type": "RunSucceeded", "run_id": child, "sequence": 7, "output": {"ticket": "T-9"}}
    receipt = finished_receipt(step, child, done, h.now + 5)
    return [{k: v for k, v in receipt.items() if k not in ("run_id", "ts_ms")}]


def test_a_child_of_an_approved_agent_tool_call_is_answered_to_its_own_attempt() -> None:
    """docs/semantics.md, "Child workflows" / agent tools: a workflow tool runs "like a workflow
    node's child", and "Approved, the call runs as its next attempt". docs/executors.md (child
    executor): a child's terminal event becomes the parent step's `ChildRunFinished`.

    The child of attempt 2 of the call `~1.0` has the id `r-1/triage[~1.0]#2`. The executor's
    receipt must name that attempt (its dispatch id does), or the parent drops it as stale and
    the call never gets its result.
    """
    h = _workflow_tool_with_approval()
    [act] = [m for m in h.messages if m["type"] == "ChildRunActivation"]
    assert act["child_run_id"] == "r-1/triage[~1.0]#2" and act["attempt"] == 2
    [receipt] = _as_executor_sees(h, known_parent=True)
    assert (receipt["attempt"], receipt["dispatch_id"]) == (act["attempt"], act["dispatch_id"])
    h.send(receipt)
    assert h.step("triage", "~1.0")["status"] == "succeeded", h.last.dropped


def test_a_child_of_an_agent_tool_call_is_answered_after_an_executor_restart() -> None:
    """child_executor.py's own contract (module docstring): "For a run it has no entry for, it
    derives the parent step from the child run id itself, whose format is fixed by the contract
    (`{parent}/{node}[{lineage}]#{attempt}`) ... So a restart needs no rebuild." docs/messages.md:
    an agent's tool call lineage is `"{lineage}~{t}.{i}"`.

    An executor that restarted (or took the partition over) between the child's RunAccepted and
    its end must still answer the parent's tool call.
    """
    h = _workflow_tool_with_approval()
    receipts = _as_executor_sees(h, known_parent=False)
    assert len(receipts) == 1, "no ChildRunFinished: the parent's tool call waits for good"
    h.send(receipts[0])
    assert h.step("triage", "~1.0")["status"] == "succeeded", h.last.dropped
