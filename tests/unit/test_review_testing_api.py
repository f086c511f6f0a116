"""Review of docs/testing.md and docs/engine-api.md against processors.testing and the public
names of processors.engine: each test quotes the promise it holds the code to."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import processors.testing.environment as environment
from processors.engine import (
    DefinitionError,
    EventBeforeStart,
    decide,
    dump_state,
    effects,
    evolve,
    load_state,
    run_status,
    state_digest,
)
from processors.executors import ActionContext, RetryableError
from processors.testing import NO_ANSWER, WorkflowEnvironment
from processors.testing.environment import DEFAULT_START_MS

ENGINE_API = (Path(__file__).resolve().parents[2] / "docs" / "engine-api.md").read_text()
# the values docs/engine-api.md gives for run_status, read from its signature line
DOCUMENTED_STATUSES = set(
    re.search(r"run_status\(state\) -> str\s+# ([a-z|]+)", ENGINE_API).group(1).split("|")
)  # type: ignore[union-attr]
WEEK_MS = 7 * 24 * 3600 * 1000


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


# ---- definitions ---------------------------------------------------------------------------------
def test_a_file_that_is_not_yaml_raises_definition_error(tmp_path: Path) -> None:
    """docs/testing.md, "The environment": `definitions`: files (YAML/JSON), folders of them, or
    dicts, validated as `runfold defs register` does (`DefinitionError` with the path and the rule)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: [unclosed\n")
    with pytest.raises(DefinitionError) as raised:
        WorkflowEnvironment(bad)
    assert raised.value.errors[0].rule == "syntax"
    with pytest.raises(DefinitionError) as missing:
        WorkflowEnvironment(str(tmp_path / "missing.yaml"))
    assert missing.value.errors[0].rule == "io"


def test_a_folder_that_does_not_exist_is_named_as_such(tmp_path: Path) -> None:
    """docs/testing.md, "The environment": `definitions`: files (YAML/JSON), folders of them
    (`DefinitionError` with the path and the rule), not "a definition must be a mapping"."""
    folder = f"{tmp_path}/definitions/"
    with pytest.raises(DefinitionError) as raised:
        WorkflowEnvironment(folder)
    assert "definitions" in str(raised.value) and "mapping" not in str(raised.value)


@pytest.mark.parametrize(
    ("definition", "rule"),
    [
        (
            wf(
                {
                    "a": {
                        "kind": "action",
                        "action": "echo",
                        "input": {"x": {"from": "state", "pointer": "/nope"}},
                    }
                }
            ),
            "undeclared_state_key",
        ),
        (
            wf(
                {"a": {"kind": "action", "action": "echo"}, "b": {"kind": "action", "action": "echo"}},
                {"a": [{"to": "b", "when": "stat.x == 1"}]},
            ),
            "condition_scope",
        ),
    ],
)
def test_definitions_are_refused_as_defs_register_refuses_them(definition: dict[str, Any], rule: str) -> None:
    """docs/testing.md, "The environment": definitions are "validated as `runfold defs register`
    does (`DefinitionError` with the path and the rule)". `defs register` runs
    `registration_issues` (docs/engine-api.md) and refuses these; the harness registered them
    and the run failed at its first step instead."""
    with pytest.raises(DefinitionError) as raised:
        WorkflowEnvironment(definition)
    assert [issue.rule for issue in raised.value.errors] == [rule]


# ---- time -----------------------------------------------------------------------------------------
def test_settle_does_not_skip_to_the_wall_time_budget_while_a_child_waits() -> None:
    """docs/testing.md, "Running": settling skips time until the run is ... waiting for a signal
    without a timeout "(the wall-time budget, 7 days by default, is not skipped to: call
    `advance` past it to test it)". A parent whose child waits for a signal was skipped a week
    ahead and paused by its wall-time budget."""
    child = wf({"w": {"kind": "wait", "signal": "go"}}, id="child")
    parent = wf({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}}, id="parent")
    with WorkflowEnvironment(child, parent) as env:
        result = env.run("parent")
    assert result.now_ms == DEFAULT_START_MS
    assert result.status == "running" and result.child("sub").status == "waiting"
    result.assert_no_event("BudgetExhausted")


def test_max_inputs_counts_one_run_not_the_whole_environment() -> None:
    """docs/testing.md, "Running": "A run that would never settle ... stops the test with
    `Stuck` after `max_inputs` inputs." A one-step run takes a handful of inputs; the seventh
    such run in one environment raised Stuck ("the run has not settled")."""
    with WorkflowEnvironment(wf({"a": {"kind": "action", "action": "noop"}}), max_inputs=20) as env:
        for _ in range(10):
            env.run("wf").assert_succeeded()


def test_advancing_by_a_negative_time_says_so() -> None:
    """docs/testing.md, "Running": `run.advance(ms)` "(let that much virtual time pass ...)".
    Time cannot pass backwards: a negative `ms` must be one clear error, not a silent no-op."""
    with WorkflowEnvironment(wf({"s": {"kind": "sleep", "duration_ms": 1_000}})) as env:
        handle = env.start("wf")
        with pytest.raises(ValueError, match="-5000"):
            handle.advance(-5_000)


# ---- assertions -----------------------------------------------------------------------------------
def test_every_failed_assertion_lists_the_run_events() -> None:
    """docs/testing.md, "Results": "A failed assertion's message lists the run's events."
    `assert_failed(code)`, `assert_step_failed(node, code)` with the wrong code and `child(node)`
    of a node that started none said neither."""

    def refuse(ctx: ActionContext, input: Any) -> Any:
        raise RetryableError("down")

    with WorkflowEnvironment(
        wf({"a": {"kind": "action", "action": "refuse"}}), actions={"refuse": refuse}
    ) as env:
        result = env.run("wf")
    result.assert_failed()
    for check in (
        lambda: result.assert_failed("Timeout"),
        lambda: result.assert_step_failed("a", code="Timeout"),
        lambda: result.child("a"),
    ):
        with pytest.raises(AssertionError) as raised:
            check()
        assert "RunAccepted" in str(raised.value) and "RunFailed" in str(raised.value)


# ---- docs/engine-api.md ---------------------------------------------------------------------------
def test_run_status_values_are_the_documented_ones() -> None:
    """docs/engine-api.md: `run_status(state) -> str  # queued|running|waiting|cancelling|paused|
    ...` (a reviewer found `cancelling` missing). A cancel with an attempt still open leaves the
    run `cancelling`: a documented value."""
    assert "cancelling" in DOCUMENTED_STATUSES and "succeeded" in DOCUMENTED_STATUSES
    with WorkflowEnvironment(
        wf({"a": {"kind": "action", "action": "hang"}}), actions={"hang": NO_ANSWER}
    ) as env:
        handle = env.start("wf")
        handle.cancel("test over")
        assert run_status(env.runs[handle.run_id]) == "cancelling"


def test_fail_run_fails_a_running_run_at_once_or_once_its_attempts_stopped() -> None:
    """docs/engine-api.md, the runtime's `FailRun`: open steps get `StepCancelled` (an attempt
    that may still run, `StepStopping`) with reason `run failed: <code>`, then `RunFailed` with
    that failure, at once, or, while an attempt is still open, after `RunCancelling` once the
    attempts have stopped (the doc said RunFailed always came in the same decision)."""

    def fail_run(env: WorkflowEnvironment, run_id: str) -> list[dict[str, Any]]:
        msg = {
            "type": "FailRun",
            "run_id": run_id,
            "ts_ms": env.now_ms,
            "record_id": "fail-1",
            "code": "Limit",
            "message": "too big",
        }
        return decide(env.runs[run_id], msg, env.ctx).events

    definition = wf(
        {"a": {"kind": "action", "action": "hang"}, "w": {"kind": "wait", "signal": "go"}}, entry=["a", "w"]
    )
    with WorkflowEnvironment(definition, actions={"hang": NO_ANSWER}) as env:
        events = fail_run(env, env.start("wf").run_id)
    assert [e["type"] for e in events] == ["StepStopping", "StepCancelled", "RunCancelling"]
    assert all(e["reason"] == "run failed: Limit" for e in events[:2]), events
    assert events[-1]["outcome"] == "RunFailed" and events[-1]["failure"]["code"] == "Limit"
    with WorkflowEnvironment(wf({"w": {"kind": "wait", "signal": "go"}})) as env:
        events = fail_run(env, env.start("wf").run_id)
    assert [e["type"] for e in events] == ["StepCancelled", "RunFailed"]
    assert events[-1]["failure"]["code"] == "Limit"


# ---- what held (kept as regression checks) --------------------------------------------------------
def _recorded_decisions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any], Any, Any]]:
    """Every (state copy, msg copy, ctx, decision) the harness folds, checking no argument changes."""
    calls: list[tuple[Any, dict[str, Any], Any, Any]] = []
    real = environment.decide

    def recording(state: Any, msg: dict[str, Any], ctx: Any) -> Any:
        before_state, before_msg = copy.deepcopy(state), copy.deepcopy(msg)
        decision = real(state, msg, ctx)
        assert msg == before_msg, msg["type"]
        assert state is None or dump_state(state) == dump_state(before_state), msg["type"]
        calls.append((before_state, before_msg, ctx, decision))
        return decision

    monkeypatch.setattr(environment, "decide", recording)
    return calls


def _canon(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def test_decide_evolve_effects_are_pure_and_do_not_mutate(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/engine-api.md: "`processors/engine/` is pure: no I/O, no clock, no randomness";
    `evolve` "pure; never mutates its argument"; decide's `states` are what evolve gives;
    `load_state(dump_state(s)) == s`; `state_digest` is the sha256 hex of dump_state."""
    calls = _recorded_decisions(monkeypatch)
    attempts = {"n": 0}

    def flaky(ctx: ActionContext, input: Any) -> Any:
        attempts["n"] += 1
        if ctx.attempt < 2:
            raise RetryableError("once")
        return {"n": ctx.attempt}

    child = wf(
        {"w": {"kind": "wait", "signal": "go", "timeout_ms": 5_000, "on_failure": "continue"}}, id="child"
    )
    parent = wf(
        {
            "f": {"kind": "action", "action": "flaky", "retry": {"max_attempts": 3, "backoff_ms": 1_000}},
            "sub": {"kind": "workflow", "workflow": "child", "revision": 1},
            "w": {"kind": "wait", "signal": "ok", "timeout_ms": 60_000},
            "h": {"kind": "action", "action": "hang", "timeout_ms": 1_000},
        },
        {"f": ["sub"], "sub": ["w"], "w": ["h"]},
        id="parent",
    )
    with WorkflowEnvironment(child, parent, actions={"flaky": flaky, "hang": NO_ANSWER}) as env:
        env.run("parent", signals=[("ok", {"y": 1})])
        cancelled = env.start("parent")
        cancelled.cancel("stop")
        cancelled.settle()
    assert len(calls) > 12 and sum(len(d.events) for *_, d in calls) > 30
    for state, msg, ctx, decision in calls:
        again = decide(copy.deepcopy(state), copy.deepcopy(msg), ctx)
        assert _canon(again.events) == _canon(decision.events) and again.dropped == decision.dropped
        folded = copy.deepcopy(state)
        for event, live in zip(again.events, again.states, strict=True):
            before = None if folded is None else dump_state(folded)
            event_copy = copy.deepcopy(event)
            after = evolve(folded, event)
            assert event == event_copy and (folded is None or dump_state(folded) == before)
            assert (after is None) == (live is None)
            if after is None:
                continue
            assert dump_state(after) == dump_state(live)
            snapshot = dump_state(after)
            fx = effects(after, event)
            fx2 = effects(copy.deepcopy(after), copy.deepcopy(event))
            assert dump_state(after) == snapshot and event == event_copy
            assert _canon([fx.messages, fx.set_timers, fx.clear_timers]) == _canon(
                [fx2.messages, fx2.set_timers, fx2.clear_timers]
            )
            assert all(t["type"] == "TimerFired" and "timer_id" in t and "due_ms" in t for t in fx.set_timers)
            assert all("queue" in m for m in fx.messages if m["type"] == "ActionActivation")
            assert load_state(dump_state(after)) == after
            assert state_digest(after) == hashlib.sha256(dump_state(after)).hexdigest()
            folded = after


def test_evolve_before_start_and_of_a_rejected_new_run() -> None:
    """docs/engine-api.md: evolve "returns None only for an event that leaves no run (a
    RunRejected of a new run); raises EventBeforeStart (a ValueError, .run_id) for an event of a
    run with no state yet"; FailRun: "a finished or unknown run drops it"."""
    with WorkflowEnvironment(wf({"a": {"kind": "action", "action": "noop"}})) as env:
        result = env.run("wf", run_id="r1")
        with pytest.raises(Exception):  # noqa: B017 - CommandRejected, checked in test_testing_harness
            env.run("nope", run_id="r2")
        rejected = env.events["r2"][0]
        assert rejected["type"] == "RunRejected" and evolve(None, rejected) is None
        with pytest.raises(EventBeforeStart) as raised:
            evolve(None, result.events[2])
        assert isinstance(raised.value, ValueError) and raised.value.run_id == "r1"
        for state in (result.record, None):
            fail = {
                "type": "FailRun",
                "run_id": "r1",
                "ts_ms": 1,
                "record_id": "f",
                "code": "Limit",
                "message": "m",
            }
            decision = decide(state, fail, env.ctx)
            assert decision.events == [] and decision.dropped
