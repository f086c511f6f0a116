"""The shipped test harness (processors.testing): time skipping, retries, child runs, signals,
cancel, canned and hanging actions and agents, and that what it folds is the engine's own
history (replaying its events with `evolve` gives the very record it holds)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from processors.client.errors import CommandRejected
from processors.engine import DefinitionError, dump_state, evolve
from processors.executors import ActionContext, NonRetryableError, RetryableError
from processors.testing import NO_ANSWER, RunResult, SignalsNotSent, Stuck, WorkflowEnvironment
from processors.testing.environment import DEFAULT_START_MS


def wf(nodes: dict[str, Any], routes: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": extra.pop("id", "wf"),
        "revision": 1,
        "entry": extra.pop("entry", [next(iter(nodes))]),
        "nodes": nodes,
        "routes": routes or {},
        **extra,
    }


def replayed(result: RunResult) -> bytes:
    """The run's record folded again from decoded copies of its events (what replay does)."""
    state = None
    for event in result.events:
        state = evolve(state, orjson.loads(orjson.dumps(event)))
    assert state is not None
    return dump_state(state)


def test_a_two_minute_wait_timeout_fires_in_milliseconds() -> None:
    definition = wf(
        {
            "review": {"kind": "wait", "signal": "approval", "timeout_ms": 120_000, "on_failure": "continue"},
            "after": {"kind": "action", "action": "echo", "input": {"x": 1}},
        },
        {"review": ["after"]},
    )
    with WorkflowEnvironment(definition) as env:
        started = time.perf_counter()
        result = env.run("wf")
        elapsed = time.perf_counter() - started
    assert elapsed < 1.0, elapsed  # 120 s of virtual time
    result.assert_succeeded()
    failed = result.assert_step_failed("review", code="Timeout")
    assert failed["finished_ms"] - DEFAULT_START_MS == 120_000
    assert result.now_ms - DEFAULT_START_MS == 120_000
    result.assert_step_succeeded("after")
    assert replayed(result) == dump_state(result.record)


def approval_wait() -> dict[str, Any]:
    """One wait for `approval` without a timeout; the signal's `ok` is the output."""
    return wf(
        {
            "review": {
                "kind": "wait",
                "signal": "approval",
                "writes": {"ok": {"from": "signal", "pointer": "/ok"}},
            }
        },
        state={"ok": None},
        output={"from": "state", "pointer": "/ok"},
    )


def test_a_signal_before_the_timeout_wins_and_settle_stops_at_a_wait_without_timeout() -> None:
    with WorkflowEnvironment(approval_wait()) as env:
        handle = env.start("wf")
        waiting = handle.settle()  # no timeout on the wait: it stops there, no week skipped
        assert waiting.status == "waiting" and waiting.now_ms == DEFAULT_START_MS
        handle.signal("approval", {"ok": True})
        result = handle.settle()
        result.assert_succeeded()
        assert result.output is True and result.state == {"ok": True}
        result.assert_event("SignalReceived", signal="approval")
        with pytest.raises(CommandRejected) as rejected:  # a finished run refuses it, as the client says
            handle.signal("approval", {"ok": False})
        assert rejected.value.code == "Conflict"
        # signals given to run() are sent when the run waits
        again = env.run("wf", signals=[("approval", {"ok": False})])
        assert again.output is False


def test_signals_the_run_never_waited_for_fail_the_settle_naming_them() -> None:
    """docs/testing.md, "Running": `signals` "are sent one by one, each when the run is waiting
    for a signal". One the run never waits for is not sent; before, `run()` returned as if it had
    been, so a test of a signal path passed without the signal ever reaching the engine."""
    with WorkflowEnvironment(approval_wait()) as env:
        with pytest.raises(SignalsNotSent) as unsent:
            env.run("wf", signals=[("approval", {"ok": True}), ("late", 1), ("later", 2)])
        assert unsent.value.names == ["late", "later"]
        assert unsent.value.result.status == "succeeded" and unsent.value.result.output is True
        message = str(unsent.value)
        assert "'late', 'later'" in message and "succeeded" in message and "SignalReceived" in message
        # every signal used: no error; none given: no error
        assert env.run("wf", signals={"approval": {"ok": False}}).output is False
        assert env.run("wf").status == "waiting"


def test_a_flaky_action_retries_through_its_backoffs_in_virtual_time() -> None:
    def flaky(ctx: ActionContext, input: Any) -> dict[str, int]:
        if ctx.attempt < 3:
            raise RetryableError(f"attempt {ctx.attempt} failed")
        return {"attempt": ctx.attempt}

    node = {
        "kind": "action",
        "action": "flaky",
        "retry": {"max_attempts": 4, "backoff_ms": 60_000, "multiplier": 2.0},
        "writes": {"out": {"from": "output"}},
    }
    with WorkflowEnvironment(wf({"call": node}, state={"out": None}), actions={"flaky": flaky}) as env:
        started = time.perf_counter()
        result = env.run("wf")
        assert time.perf_counter() - started < 1.0
    result.assert_succeeded()
    assert result.attempts("call") == 3
    assert len(result.events_of("StepRetryScheduled")) == 2
    assert result.now_ms - DEFAULT_START_MS == 60_000 + 120_000  # the two backoffs, skipped
    assert result.state["out"] == {"attempt": 3}


def test_an_action_that_never_answers_times_out_and_exhausts_its_retries() -> None:
    node = {
        "kind": "action",
        "action": "hang",
        "timeout_ms": 5_000,
        "retry": {"max_attempts": 2, "backoff_ms": 1_000},
    }
    with WorkflowEnvironment(wf({"a": node}), actions={"hang": NO_ANSWER}) as env:
        result = env.run("wf")
    result.assert_failed("RetryExhausted")
    assert result.attempts("a") == 2
    # A timed-out attempt that never answers may still run (issue 27): its retry waits for its
    # stop, here the lease (30 s from its acceptance, no heartbeats) expiring. Attempt 1 times
    # out at 5 s and is stopped at 30 s; the backoff ends at 31 s; attempt 2 times out at 36 s
    # and is stopped at 61 s, when the step is exhausted.
    assert result.now_ms - DEFAULT_START_MS == 30_000 + 1_000 + 30_000
    assert [e["failure"]["code"] for e in result.events_of("StepFailed")] == ["Timeout", "RetryExhausted"]
    assert len(result.events_of("StepStopping")) == 2


def test_a_non_retryable_error_and_an_unknown_action_fail_at_once() -> None:
    def refuse(ctx: ActionContext, input: Any) -> Any:
        raise NonRetryableError("card declined", code="InvalidInput")

    nodes = {"a": {"kind": "action", "action": "refuse", "retry": {"max_attempts": 5, "backoff_ms": 10}}}
    with WorkflowEnvironment(
        wf(nodes),
        wf({"b": {"kind": "action", "action": "nope"}}, id="other"),
        actions={"refuse": refuse},
    ) as env:
        result = env.run("wf")
        result.assert_failed()
        assert result.attempts("a") == 1
        result.assert_step_failed("a", code="InvalidInput")
        unknown = env.run("other")
        unknown.assert_step_failed("b", code="UnknownReference")


def test_canned_results_and_exceptions() -> None:
    definition = wf(
        {"a": {"kind": "action", "action": "lookup", "writes": {"v": {"from": "output"}}}}, state={"v": None}
    )
    with WorkflowEnvironment(definition, actions={"lookup": {"price": 3}}) as env:
        assert env.run("wf").state["v"] == {"price": 3}
    with WorkflowEnvironment(definition, actions={"lookup": NonRetryableError("gone")}) as env:
        env.run("wf").assert_step_failed("a", code="ExecutionFailed")


def test_a_child_workflow_runs_and_its_output_returns_to_the_parent() -> None:
    child = wf(
        {
            "double": {
                "kind": "action",
                "action": "double",
                "input": {"n": {"from": "input", "pointer": "/n"}},
                "writes": {"n": {"from": "output"}},
            }
        },
        id="child",
        state={"n": 0},
        output={"from": "state", "pointer": "/n"},
    )
    parent = wf(
        {
            "sub": {
                "kind": "workflow",
                "workflow": "child",
                "revision": 1,
                "input": {"n": {"from": "input", "pointer": "/n"}},
                "writes": {"result": {"from": "output"}},
            }
        },
        id="parent",
        state={"result": None},
        output={"from": "state", "pointer": "/result"},
    )
    with WorkflowEnvironment(child, parent, actions={"double": lambda ctx, i: i["n"] * 2}) as env:
        result = env.run("parent", {"n": 21})
    result.assert_succeeded()
    assert result.output == 42
    sub = result.child("sub")
    sub.assert_succeeded()
    assert sub.output == 42 and sub.run_id.startswith(result.run_id + "/sub")
    assert sub.record["parent"]["parent_run_id"] == result.run_id


def test_cancel_cascades_to_the_child_run() -> None:
    child = wf({"w": {"kind": "wait", "signal": "go"}}, id="child")
    parent = wf({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}}, id="parent")
    with WorkflowEnvironment(child, parent) as env:
        handle = env.start("parent")
        assert handle.status == "running"
        handle.cancel("test over")
        result = handle.settle()
    assert result.status == "cancelled"
    assert result.child("sub").status == "cancelled"


def test_agents_canned_or_functions_checked_against_the_output_schema() -> None:
    node = {
        "kind": "agent",
        "agent": "planner",
        "model": "small",
        "prompt": {"user": {"from": "input", "pointer": "/topic"}},
        "output_schema": {"type": "object", "required": ["queries"]},
        "structured_output_attempts": 2,
        "writes": {"plan": {"from": "output"}},
    }
    definition = wf({"plan": node}, state={"plan": None})
    with WorkflowEnvironment(definition, agents={"planner": {"queries": ["a", "b"]}}) as env:
        assert env.run("wf", {"topic": "x"}).state["plan"] == {"queries": ["a", "b"]}
    seen: list[str] = []

    def planner(request: Any) -> Any:
        seen.append(request.messages[-1]["content"])
        return {"wrong": 1}

    with WorkflowEnvironment(definition, agents={"planner": planner}) as env:
        result = env.run("wf", {"topic": "kafka"})
    result.assert_step_failed("plan", code="InvalidOutput")
    assert len(seen) == 2 and "kafka" in seen[0]  # both structured-output attempts asked
    with WorkflowEnvironment(definition) as env:  # the local provider by default
        env.run("wf", {"topic": "x"}).assert_succeeded()


def test_rejections_raise_as_the_client_does() -> None:
    definition = wf(
        {"a": {"kind": "action", "action": "echo", "queue": "tools"}},
        input_schema={"type": "object", "required": ["q"]},
    )
    with WorkflowEnvironment(definition) as env:  # the processor's default queues: no "tools"
        with pytest.raises(CommandRejected) as rejected:
            env.run("wf", {"q": 1})
        assert "tools" in rejected.value.reason
    with WorkflowEnvironment(definition, queues=["default", "tools"]) as env:
        with pytest.raises(CommandRejected) as bad_input:
            env.run("wf", {})
        assert bad_input.value.code == "InvalidInput"
        env.run("wf", {"q": 1}).assert_succeeded()
    with pytest.raises(DefinitionError):
        WorkflowEnvironment(wf({"a": {"kind": "action"}}))


def test_a_loop_without_an_end_stops_at_the_step_budget_not_in_the_harness() -> None:
    definition = wf(
        {"a": {"kind": "action", "action": "noop"}, "b": {"kind": "action", "action": "noop"}},
        {"a": ["b"], "b": ["a"]},
        budgets={"max_steps": 50},
    )
    with WorkflowEnvironment(definition) as env:
        result = env.run("wf")
    assert result.status == "paused"
    with WorkflowEnvironment(definition, max_inputs=20) as env, pytest.raises(Stuck):
        env.run("wf")


def test_advance_fires_a_sleep_only_when_its_time_comes() -> None:
    definition = wf(
        {"s": {"kind": "sleep", "duration_ms": 10_000}, "b": {"kind": "action", "action": "noop"}},
        {"s": ["b"]},
    )
    with WorkflowEnvironment(definition) as env:
        handle = env.start("wf")
        handle.advance(9_999)
        assert handle.status == "running" and "b" not in handle.result().record["steps"]
        handle.advance(1)
        handle.result().assert_succeeded()
