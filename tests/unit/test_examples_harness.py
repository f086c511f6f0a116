"""The example definitions (examples/definitions/) run in the shipped test harness with the
demo's own actions (processors/demo/actions.py): every example's outcome, as the demo and the
README describe it, checked without a broker and without waiting for its timers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import processors.demo.actions  # registers demo.flaky and demo.search (@action)
from processors.client.errors import CommandRejected
from processors.executors import ActionContext
from processors.testing import WorkflowEnvironment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"


def fast_search(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """demo.search without its pause (an action's own sleep is real time, not the harness's)."""
    return processors.demo.actions.search(ctx, {**input, "delay_ms": 0})


@pytest.fixture
def env() -> Iterator[WorkflowEnvironment]:
    # research-brief's search runs on queue "tools": served here as the README says to add it
    with WorkflowEnvironment(
        EXAMPLES,
        actions={"demo.search": fast_search},
        queues=["default", "agents", "tools"],
    ) as environment:
        yield environment


def test_every_example_registers() -> None:
    with WorkflowEnvironment(EXAMPLES) as env:
        for name in sorted(EXAMPLES.glob("*.yaml")):
            definition = env.register(name)  # registering the same content again is a no-op
            assert env.catalog.get(definition.id, definition.revision) is not None


def test_one_step_echoes_its_input(env: WorkflowEnvironment) -> None:
    result = env.run("one-step", {"text": "hi"})
    result.assert_succeeded()
    assert result.output == {"text": "hi"}
    assert result.event_types == [
        "RunAccepted",
        "RunStarted",
        "StepScheduled",
        "StepStarted",
        "StepSucceeded",
        "SuperstepCommitted",
        "RunSucceeded",
    ]


def test_noop_3_runs_three_steps_in_order(env: WorkflowEnvironment) -> None:
    result = env.run("noop-3")
    result.assert_succeeded()
    assert [e["node"] for e in result.events_of("StepSucceeded")] == ["a", "b", "c"]


def test_demo_budget_warns_at_sixty_percent(env: WorkflowEnvironment) -> None:
    result = env.run("demo-budget")
    result.assert_succeeded()
    result.assert_event("BudgetWarning")


@pytest.mark.parametrize("fail_times", [0, 1, 3])
def test_flaky_retry_succeeds_after_its_failures(env: WorkflowEnvironment, fail_times: int) -> None:
    result = env.run("flaky-retry", {"fail_times": fail_times, "key": "k"})
    result.assert_succeeded()
    assert result.attempts("call") == fail_times + 1
    assert result.state["attempts_seen"] == fail_times + 1
    # backoff 100 ms, x2 each time: the virtual clock moved by exactly the backoffs
    assert result.now_ms - result.events[0]["ts_ms"] == sum(100 * 2**i for i in range(fail_times))


def test_flaky_retry_exhausts_four_attempts(env: WorkflowEnvironment) -> None:
    result = env.run("flaky-retry", {"fail_times": 9, "key": "k"})
    result.assert_failed("RetryExhausted")
    assert result.attempts("call") == 4


def test_await_approval_waits_then_ends_on_the_signal_or_a_cancel(env: WorkflowEnvironment) -> None:
    waiting = env.start("await-approval")
    assert waiting.settle().status == "waiting"
    waiting.signal("approval", {"approved": True})
    assert waiting.settle().output is True
    cancelled = env.start("await-approval")
    cancelled.cancel("not needed")
    assert cancelled.settle().status == "cancelled"


def test_demo_research_plans_searches_summarises_in_a_child_and_waits(env: WorkflowEnvironment) -> None:
    started = time.perf_counter()
    result = env.run("demo-research", {"topic": "kafka"}, signals=[("approval", {"approved": True})])
    assert time.perf_counter() - started < 5
    result.assert_succeeded()
    assert 3 <= len(result.events_of("StepSucceeded", "search")) <= 4
    # the planner is a tool-using agent: a turn that looks the topic up, the lookup, the answer
    plan = [(e["lineage"], e["kind"]) for e in result.events_of("StepScheduled", "plan")]
    assert plan == [("", "agent"), ("~1", "agent"), ("~1.0", "action"), ("~2", "agent")]
    assert result.events_of("StepSucceeded", "plan")[1]["output"]["query"]  # demo.search's answer
    child = result.child("write")
    child.assert_succeeded()
    assert result.output == child.output and set(result.output) >= {"title", "body"}


def test_demo_research_times_out_without_an_approval(env: WorkflowEnvironment) -> None:
    result = env.run("demo-research", {"topic": "kafka"})
    result.assert_failed()
    result.assert_step_failed("review", code="Timeout")


def test_research_brief_loops_back_when_rejected_then_ends_when_approved(env: WorkflowEnvironment) -> None:
    plan = {"queries": ["a", "b", "c", "d"]}
    with WorkflowEnvironment(
        EXAMPLES, agents={"planner": plan}, queues=["default", "agents", "tools"]
    ) as environment:
        result = environment.run(
            "research-brief",
            {"topic": "stream processing"},
            signals=[("approval", {"approved": False}), ("approval", {"approved": True})],
        )
    result.assert_succeeded()
    assert result.state["rounds"] == 1  # one rejection, one loop
    assert len(result.events_of("SignalReceived")) == 2
    assert len(result.children) == 2  # the summary was written twice


def test_research_brief_is_rejected_where_tools_is_not_served() -> None:
    with WorkflowEnvironment(EXAMPLES) as env, pytest.raises(CommandRejected) as rejected:
        env.run("research-brief", {"topic": "x"})
    assert "tools" in rejected.value.reason
