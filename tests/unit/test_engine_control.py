"""Cancel, wait/signals, sleep, child workflows, budgets, pause and resume."""

from __future__ import annotations

from engine_harness import RunHarness, definition
from hypothesis import given
from hypothesis import strategies as st

from processors.engine import budgets


def act(**extra: object) -> dict:
    return {"kind": "action", "action": "do", **extra}


WAIT = {"kind": "wait", "signal": "approval", "writes": {"approved": {"from": "signal", "pointer": "/ok"}}}


def test_cancel_is_idempotent_and_cascades() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).accept("a").cancel("user asked")
    # both attempts may still run: the run is cancelling until each proved it stopped
    assert h.types == ["StepStopping", "StepStopping", "RunCancelling"]
    assert [m["type"] for m in h.messages[-2:]] == ["CancelActivation", "CancelActivation"]
    assert h.status == "cancelling"
    h.cancel()
    assert h.types == [] and h.last.dropped == "duplicate cancel"
    h.stopped("a")
    assert h.types == ["StepCancelled"] and h.status == "cancelling"
    h.complete("b", 1)  # it finished before it read the cancel: recorded, still cancelled
    assert h.types == ["StepCancelled", "RunCancelled"] and h.status == "cancelled"
    assert h.step("b")["status"] == "cancelled" and h.step("b")["stop"]["how"] == "completed"
    assert h.last.events[-1]["stops"] == [
        {"node": "a", "lineage": "", "attempt": 1, "stop": "confirmed"},
        {"node": "b", "lineage": "", "attempt": 1, "stop": "completed"},
    ]
    h.complete("a", 1)
    assert h.last.dropped == "run finished"


def test_a_cancel_with_nothing_in_flight_ends_the_run_at_once() -> None:
    d = definition({"nap": {"kind": "sleep", "duration_ms": 1000}, "a": act()}, entry=["nap", "a"])
    h = RunHarness(d).start({}).complete("a", 1).cancel()
    assert h.types == ["StepCancelled", "RunCancelled"] and "stops" not in h.last.events[-1]


def test_a_stop_that_cannot_be_proved_ends_at_its_bound_or_the_lease() -> None:
    d = definition({"a": act(lease_ms=8000, stop_timeout_ms=2000), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).accept("b", lease_ms=1000).cancel()
    assert h.status == "cancelling"
    h.fire("lease_expiry", "b")  # a dead worker: the one stop that is assumed
    assert h.types == ["StepCancelled"] and h.step("b")["stop"]["how"] == "lease_expired"
    h.fire("stop_timeout", "a")  # never accepted, never answered
    assert h.types == ["StepCancelled", "RunCancelled"]
    assert [s["stop"] for s in h.last.events[-1]["stops"]] == ["lease_expired", "stop_unconfirmed"]
    h.stopped("a")
    assert h.last.dropped == "run finished"


def test_an_executor_that_cannot_stop_its_handler_says_so() -> None:
    h = RunHarness(definition({"a": act()})).start({}).accept("a").cancel().stopped("a", confirmed=False)
    assert h.types == ["StepCancelled", "RunCancelled"]
    assert h.last.events[-1]["stops"][0]["stop"] == "stop_unconfirmed"


def test_a_cancel_while_a_budget_pause_waits_ends_the_run_cancelled() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"], budgets={"max_cost_micros": 10})
    h = RunHarness(d).start({}).accept("b").complete("a", 1, usage={"cost_micros": 11})
    assert h.types[-3:] == ["BudgetExhausted", "StepStopping", "RunCancelling"]
    h.cancel("enough")
    assert h.types == ["RunCancelling"] and h.state["halting"]["outcome"] == "RunCancelled"
    h.stopped("b")
    assert h.types == ["StepCancelled", "RunCancelled"] and h.state["cancel_reason"] == "enough"


def test_cancel_of_a_finished_run_answers_without_reopening() -> None:
    h = RunHarness(definition({"a": act()})).start({}).complete("a", 1).cancel()
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert h.last.dropped == "run already finished" and h.status == "succeeded"


def test_wait_and_signal() -> None:
    d = definition(
        {"review": dict(WAIT), "after": act()}, routes={"review": ["after"]}, state={"approved": False}
    )
    h = RunHarness(d).start({})
    assert h.types[-1] == "RunWaiting" and h.status == "waiting"
    h.signal("approval", {"ok": True})
    assert h.types[:3] == ["SignalReceived", "StepSucceeded", "SuperstepCommitted"]
    assert h.last.events[0]["node"] == "review" and h.state["state"]["approved"] is True


def test_early_signal_is_buffered_then_consumed() -> None:
    d = definition({"a": act(), "review": dict(WAIT)}, routes={"a": ["review"]}, state={"approved": False})
    h = RunHarness(d).start({}).signal("approval", {"ok": True})
    assert h.types == ["SignalReceived"] and h.last.events[0]["node"] is None and len(h.state["signals"]) == 1
    h.complete("a", 1)
    assert "RunWaiting" not in h.types and h.status == "succeeded"
    assert h.state["signals"] == [] and h.state["state"]["approved"] is True


def test_unknown_signal_is_rejected() -> None:
    h = RunHarness(definition({"review": dict(WAIT)}, state={"approved": False})).start({}).signal("nope", 1)
    assert h.types == ["RunRejected"] and h.last.dropped == "unknown signal"


def test_wait_timeout() -> None:
    h = RunHarness(definition({"review": {**WAIT, "timeout_ms": 1000}}, state={"approved": False})).start({})
    assert h.last.events[-1]["due_ms"] == h.now + 1000
    h.fire("wait_timeout", "review")
    assert h.state["failure"]["code"] == "Timeout"


def test_sleep_node() -> None:
    d = definition({"nap": {"kind": "sleep", "duration_ms": 5000}, "after": act()}, routes={"nap": ["after"]})
    h = RunHarness(d).start({})
    timer = next(t for t in h.timers.values() if t["timer_kind"] == "sleep")
    assert timer["due_ms"] == h.now + 5000
    h.fire("sleep", "nap")
    assert h.types[:2] == ["StepSucceeded", "SuperstepCommitted"] and h.state["frontier"] == ["after"]


CHILD = definition({"c": act()}, id="child")


def test_child_workflow_step() -> None:
    parent = definition(
        {
            "sub": {
                "kind": "workflow",
                "workflow": "child",
                "revision": 1,
                "writes": {"out": {"from": "output"}},
            }
        },
        state={"out": None},
    )
    h = RunHarness(CHILD, parent, run_id="p-1")
    h.root_id = "wf"
    h.start({"x": 1})
    activation = h.messages[-1]
    assert activation["type"] == "ChildRunActivation" and activation["child_run_id"] == "p-1/sub"
    assert activation["bundle"]["root"] == "child@1" and activation["parent"]["depth"] == 1
    assert activation["parent"]["root_run_id"] == "p-1"
    h.child_finished(
        "sub", output={"r": 1}, usage={"prompt_tokens": 3, "completion_tokens": 0, "cost_micros": 5}
    )
    assert h.status == "succeeded" and h.state["state"]["out"] == {"r": 1}
    assert h.state["usage"]["prompt_tokens"] == 3  # the child's usage joins the parent's ledger


def test_child_failure_is_child_failed_and_cancel_cascades() -> None:
    parent = definition({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}})
    h = RunHarness(CHILD, parent)
    h.root_id = "wf"
    h.start({}).child_finished("sub", status="failed")
    assert h.state["failure"]["code"] == "ChildFailed"
    h2 = RunHarness(CHILD, parent, run_id="p-2")
    h2.root_id = "wf"
    h2.start({}).cancel()
    assert h2.messages[-1]["type"] == "ChildRunCancel" and h2.messages[-1]["child_run_id"] == "p-2/sub"
    assert h2.status == "cancelling"  # until the child's own terminal event says it stopped
    h2.child_finished("sub", status="cancelled")
    assert h2.types == ["StepCancelled", "RunCancelled"]
    assert h2.last.events[-1]["stops"] == [{"node": "sub", "lineage": "", "attempt": 1, "stop": "confirmed"}]


def test_token_budget_warns_once_then_pauses_and_resume_continues() -> None:
    d = definition(
        {"a": act(), "b": act()}, routes={"a": ["b"]}, budgets={"max_tokens": 100, "warn_at_percent": 50}
    )
    h = RunHarness(d).start({}).complete("a", 1, usage={"prompt_tokens": 60})
    assert "BudgetWarning" in h.types and h.status == "running"
    h.complete("b", 1, usage={"prompt_tokens": 50})
    assert h.types[-2:] == ["BudgetExhausted", "RunPaused"] and h.status == "paused"
    assert h.types.count("BudgetWarning") == 0
    h.resume({"max_tokens": 1000})
    assert h.types[0] == "RunResumed" and h.status == "succeeded"


def test_pause_cancels_in_flight_and_resume_reactivates() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"], budgets={"max_cost_micros": 10})
    h = RunHarness(d).start({}).accept("b").complete("a", 1, usage={"cost_micros": 11})
    assert h.types[-3:] == ["BudgetExhausted", "StepStopping", "RunCancelling"]
    assert h.messages[-1]["type"] == "CancelActivation"
    h.resume({"max_cost_micros": 100})
    assert h.last.dropped == "nothing to resume"  # not before b stopped: no second attempt beside it
    h.stopped("b")
    assert h.types == ["StepCancelled", "RunPaused"]
    h.complete("b", 1)
    assert h.last.dropped == "step already cancelled"
    h.resume({"max_cost_micros": 100})
    assert h.types == ["RunResumed", "StepScheduled"] and h.step("b")["attempt"] == 2
    h.complete("b", 1)
    assert h.status == "succeeded"


def test_wall_time_budget_pauses() -> None:
    h = RunHarness(definition({"a": act()}, budgets={"wall_time_ms": 1000})).start({})
    h.fire("wall_time")
    assert h.types[-1] == "RunCancelling" and h.status == "cancelling"
    h.stopped("a")
    assert h.types[-1] == "RunPaused" and h.state["pause"]["reason"] == "workflow wall-time budget exceeded"
    h.resume({"wall_time_ms": 100_000})
    assert h.status == "running" and any(t["timer_kind"] == "wall_time" for t in h.timers.values())


def test_resume_of_a_failed_run_reactivates_the_failed_node() -> None:
    h = (
        RunHarness(definition({"a": act(), "b": act()}, routes={"a": ["b"]}))
        .start({})
        .complete("a", 1)
        .fail("b")
    )
    assert h.status == "failed"
    h.resume()
    assert h.types == ["RunResumed", "StepScheduled"] and h.step("b")["attempt"] == 2
    h.complete("b", 2)
    assert h.status == "succeeded"


def test_resume_of_a_succeeded_or_running_run_is_rejected() -> None:
    h = RunHarness(definition({"a": act()})).start({})
    h.resume()
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    h.complete("a", 1).resume()
    assert h.types == ["RunRejected"]


def test_research_brief_example_end_to_end() -> None:
    from pathlib import Path

    from processors.engine.definition import read_source

    examples = Path(__file__).resolve().parents[2] / "examples" / "definitions"
    summarize, brief = read_source(examples / "summarize.yaml"), read_source(examples / "research-brief.yaml")
    h = RunHarness(summarize, brief, run_id="rb-1")
    h.root_id = "research-brief"
    h.start({"topic": "kafka"})
    assert h.messages[-1]["agent"]["prompt"]["user"] == "kafka"
    h.complete("plan", {"queries": ["a", "b", "c", "d"]}, usage={"prompt_tokens": 100})
    for i in range(4):
        h.accept("search", lineage=str(i)).complete("search", f"note {i}", lineage=str(i))
    assert (
        h.messages[-1]["type"] == "ChildRunActivation" and h.messages[-1]["bundle"]["root"] == "summarize@3"
    )
    h.child_finished("write", output={"text": "brief"})
    assert h.status == "waiting"
    h.signal("approval", {"approved": True})
    assert h.status == "succeeded" and h.state["output"] == {"text": "brief"}
    assert h.refold() == __import__("processors.engine", fromlist=["dump_state"]).dump_state(h.state)


def test_fail_run_from_the_runtime_fails_the_run_cancels_open_steps_and_leaves_finished_runs() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).accept("a")
    h.send({"type": "FailRun", "code": "Limit", "message": "outputs too large " + "x" * 2000})
    assert h.types == ["StepStopping", "StepStopping", "RunCancelling"] and h.status == "cancelling"
    assert [m["type"] for m in h.messages[-2:]] == ["CancelActivation", "CancelActivation"]
    h.send({"type": "FailRun", "code": "Limit", "message": "again"})
    assert h.types == [] and h.last.dropped == "run already stopping"
    h.stopped("a").stopped("b")
    assert h.types == ["StepCancelled", "RunFailed"] and h.status == "failed"
    failure = h.last.events[-1]["failure"]
    assert failure["code"] == "Limit" and len(failure["message"]) == 1000 and not failure["retryable"]
    h.send({"type": "FailRun", "code": "Limit", "message": "again"})
    assert h.types == [] and h.last.dropped == "run already finished"
    h.send({"type": "FailRun", "code": "NoSuchCode", "message": "m"})
    assert h.last.dropped == "run already finished"
    fresh = RunHarness(d).start({}).send({"type": "FailRun", "code": "NoSuchCode", "message": "m"})
    assert fresh.last.events[-1]["failure"]["code"] == "ExecutionFailed"
    assert (
        RunHarness(d).send({"type": "FailRun", "code": "Limit", "message": "m"}).last.dropped == "unknown run"
    )
    assert (
        RunHarness(d).start({}).send({"type": "FailRun", "code": "Limit"}).last.dropped
        == "FailRun.message must be str"
    )


@given(
    ledger=st.fixed_dictionaries(
        {
            name: st.integers(0, 2**40)
            for name in ("steps", "retries", "agents", "prompt_tokens", "completion_tokens", "cost_micros")
        }
    ),
    used_ms=st.integers(0, 2**40),
    since_ms=st.none() | st.integers(0, 2**40),
    now=st.none() | st.integers(0, 2**41),
)
def test_one_budget_dimension_reads_as_in_the_whole_usage(
    ledger: dict[str, int], used_ms: int, since_ms: int | None, now: int | None
) -> None:
    """`budgets.used` reads the ledger's own dimensions directly: the same number as `usage`."""
    state = {"usage": ledger, "wall": {"used_ms": used_ms, "since_ms": since_ms}}
    whole = budgets.usage(state, now)
    for i, dimension in enumerate(budgets.DIMENSIONS):
        assert budgets.used(state, dimension, now) == whole[i], dimension
