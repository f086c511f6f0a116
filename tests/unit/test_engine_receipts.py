"""Receipts, retries, node timeouts, leases and failure policies."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from engine_harness import RunHarness, definition

from processors.engine import Ceilings
from processors.engine.ids import dispatch_id


def act(**extra: object) -> dict:
    return {"kind": "action", "action": "do", **extra}


RETRY = {"max_attempts": 3, "backoff_ms": 100, "multiplier": 2, "max_backoff_ms": 150}


def test_accept_heartbeat_and_lease_timer() -> None:
    h = RunHarness(definition({"a": act()})).start({}).accept("a", lease_ms=1000)
    assert h.types == ["StepStarted"] and h.step("a")["lease_expires_ms"] == h.now + 1000
    lease = next(t for t in h.timers.values() if t["timer_kind"] == "lease_expiry")
    h.heartbeat("a", lease_ms=1000)
    assert h.types == ["StepLeaseExtended"]
    moved = next(t for t in h.timers.values() if t["timer_kind"] == "lease_expiry")
    assert moved["timer_id"] == lease["timer_id"] and moved["due_ms"] > lease["due_ms"]
    h.send(dict(lease), advance=0)  # the old due: stale
    assert h.last.dropped == "stale timer"


def test_lease_expiry_fails_the_attempt_retryably_and_cancels_it() -> None:
    h = RunHarness(definition({"a": act(retry=RETRY)})).start({}).accept("a", lease_ms=1000)
    h.fire("lease_expiry", "a")
    assert h.types == ["StepFailed", "StepRetryScheduled"]
    assert "lease expired" in h.last.events[0]["failure"]["message"]
    assert h.messages[-1]["type"] == "CancelActivation"
    h.fire("retry_backoff", "a")
    assert h.types == ["StepScheduled"] and h.last.events[0]["attempt"] == 2
    assert h.last.events[0]["dispatch_id"] == dispatch_id("r-1", "a", "", 2)


def test_a_retry_clears_the_backoff_timer_that_led_to_it() -> None:
    # the runtime drops a timer when it fires; a store rebuilt from events learns it here
    from processors.engine import effects
    from processors.engine.ids import step_timer_id

    h = RunHarness(definition({"a": act(retry=RETRY)})).start({})
    h.fail("a", retryable=True)
    backoff = h.last.events[1]["timer_id"]
    assert backoff == step_timer_id("retry_backoff", dispatch_id("r-1", "a", "", 1))
    h.fire("retry_backoff", "a")
    [scheduled] = h.last.events
    assert scheduled["attempt"] == 2 and backoff in effects(h.state, scheduled).clear_timers
    first = RunHarness(definition({"b": act(retry=RETRY)})).start({})
    [first_scheduled] = [e for e in first.last.events if e["type"] == "StepScheduled"]
    assert list(effects(first.state, first_scheduled).clear_timers) == []  # a first attempt clears none


def test_retry_backoff_and_exhaustion() -> None:
    h = RunHarness(definition({"a": act(retry=RETRY)})).start({})
    h.fail("a", retryable=True)
    retry = h.last.events[1]
    assert retry["next_attempt"] == 2 and retry["due_ms"] == h.now + 100
    h.fire("retry_backoff", "a").fail("a", retryable=True)
    assert h.last.events[1]["due_ms"] == h.now + 150  # 100 * 2 capped at 150
    h.fire("retry_backoff", "a").fail("a", retryable=True)
    assert h.types == ["StepFailed", "RunFailed"] and h.state["failure"]["code"] == "RetryExhausted"
    assert h.state["usage"]["retries"] == 2


def test_non_retryable_failure_is_not_retried() -> None:
    h = RunHarness(definition({"a": act(retry=RETRY)})).start({}).fail("a", retryable=False)
    assert h.types == ["StepFailed", "RunFailed"] and h.state["failure"]["code"] == "ExecutionFailed"


def test_run_retry_budget_is_reserved_before_retrying() -> None:
    h = RunHarness(definition({"a": act(retry=RETRY)}, budgets={"max_retries": 1})).start({})
    h.fail("a", retryable=True).fire("retry_backoff", "a").fail("a", retryable=True)
    assert h.state["failure"]["code"] == "RetryExhausted" and "retry budget" in h.state["failure"]["message"]


def test_node_timeout_fails_retryably() -> None:
    h = RunHarness(definition({"a": act(timeout_ms=500, retry=RETRY)})).start({})
    assert h.messages[-1]["deadline_ms"] == h.now + 500
    h.fire("node_timeout", "a")
    # the attempt may still run: asked to stop, and retried only once it stopped
    assert h.types == ["StepStopping"] and h.messages[-1]["type"] == "CancelActivation"
    assert not any(t["timer_kind"] == "retry_backoff" for t in h.timers.values())
    h.accept("a").heartbeat("a", lease_ms=60_000)  # it still runs, and keeps its lease
    assert h.types == ["StepLeaseExtended"] and h.step("a")["status"] == "stopping"
    h.stopped("a")
    assert (
        h.types == ["StepFailed", "StepRetryScheduled"] and h.last.events[0]["failure"]["code"] == "Timeout"
    )
    assert h.last.events[0]["stop"] == "confirmed" and not any(
        t["timer_kind"] in ("stop_timeout", "lease_expiry") and t["attempt"] == 1 for t in h.timers.values()
    )
    h.stopped("a")  # redelivered
    assert h.last.dropped == "attempt already stopped"
    h.fire("retry_backoff", "a")
    assert h.types == ["StepScheduled"] and h.step("a")["attempt"] == 2


def test_a_timed_out_attempt_that_completes_anyway_stays_timed_out() -> None:
    h = RunHarness(definition({"a": act(timeout_ms=500)})).start({}).accept("a").fire("node_timeout", "a")
    h.complete("a", {"late": True}, usage={"prompt_tokens": 7})
    assert h.types[0] == "StepFailed" and h.last.events[0]["stop"] == "completed"
    assert h.state["failure"]["code"] == "Timeout" and h.state["usage"]["prompt_tokens"] == 7
    h.complete("a", {"late": True}, usage={"prompt_tokens": 7})
    assert h.last.dropped == "run finished"


def test_a_timed_out_attempt_never_answering_ends_at_stop_timeout() -> None:
    h = RunHarness(definition({"a": act(timeout_ms=500, stop_timeout_ms=3000, retry=RETRY)})).start({})
    h.fire("node_timeout", "a").fire("stop_timeout", "a")
    assert h.types == ["StepFailed", "StepRetryScheduled"]
    assert h.last.events[0]["stop"] == "stop_unconfirmed"


def test_output_schema_violation_is_invalid_output() -> None:
    h = RunHarness(definition({"a": act(output_schema={"type": "object", "required": ["k"]})})).start({})
    h.complete("a", {"nope": 1})
    assert h.state["failure"]["code"] == "InvalidOutput"


def test_usage_is_recorded() -> None:
    h = (
        RunHarness(definition({"a": act()}))
        .start({})
        .complete("a", 1, usage={"prompt_tokens": 5, "completion_tokens": 7, "cost_micros": 9})
    )
    assert h.state["output"] is not None or h.status == "succeeded"
    assert h.last.events[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "cost_micros": 9}


def test_first_receipt_wins_duplicates_and_conflicts() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).complete("a", {"v": 1})
    h.complete("a", {"v": 1})
    assert h.types == [] and h.last.dropped == "duplicate receipt"
    h.complete("a", {"v": 2})
    assert h.types == ["ReceiptConflict"] and h.step("a")["output"] == {"v": 1}
    h.fail("a")
    assert h.types == ["ReceiptConflict"]
    h.accept("b").accept("b")
    assert h.last.dropped == "duplicate receipt"
    h.accept("b", worker="w2")
    assert h.types == ["ReceiptConflict"]


def test_stale_unknown_and_finished_receipts_are_dropped() -> None:
    h = (
        RunHarness(definition({"a": act(retry=RETRY)}))
        .start({})
        .fail("a", retryable=True)
        .fire("retry_backoff", "a")
    )
    h.complete("a", 1, attempt=1)
    assert h.last.dropped == "stale attempt"
    h.send(
        {
            "type": "ActivationCompleted",
            "node": "zzz",
            "lineage": "",
            "attempt": 1,
            "dispatch_id": "x",
            "worker_id": "w",
            "output": 1,
            "usage": {},
        }
    )
    assert h.last.dropped == "unknown dispatch id"
    h.complete("a", 1)
    assert h.status == "succeeded"
    h.complete("a", 1)
    assert h.last.dropped == "run finished"


def test_fail_fast_cancels_siblings_in_flight() -> None:
    d = definition({"a": act(), "b": act(), "c": act()}, entry=["a", "b", "c"])
    h = RunHarness(d).start({}).accept("c").complete("a", 1).fail("b", message="b broke")
    assert h.types == ["StepFailed", "StepStopping", "RunCancelling"] and h.status == "cancelling"
    assert h.messages[-1]["type"] == "CancelActivation" and h.messages[-1]["node"] == "c"
    h.complete("c", 1)  # c finished before the cancel reached it: recorded, the run fails
    assert h.types == ["StepCancelled", "RunFailed"]
    assert h.state["failure"]["node"] == "b" and h.step("c")["status"] == "cancelled"
    h.complete("c", 1)
    assert h.last.dropped == "run finished"


def test_continue_policy_keeps_going_with_error_value() -> None:
    d = definition(
        {"a": act(on_failure="continue", writes={"x": {"from": "output"}}), "b": act()},
        routes={"a": [{"to": "b", "when": "has(output.error)"}]},
        state={"x": None},
    )
    h = RunHarness(d).start({}).fail("a")
    assert (
        h.state["frontier"] == ["b"] and h.step("a")["status"] == "failed" and h.state["state"]["x"] is None
    )
    h.complete("b", 1)
    assert h.status == "succeeded"


def test_skip_dependents_skips_downstream_and_still_fails_at_the_end() -> None:
    d = definition(
        {"a": act(on_failure="skip_dependents"), "b": act(), "other": act(), "after": act()},
        entry=["a", "other"],
        routes={"a": ["b"], "other": ["after"]},
    )
    h = RunHarness(d).start({}).fail("a", message="a broke").complete("other", 1)
    assert "StepSkipped" in h.types and h.step("b")["status"] == "skipped"
    assert h.state["frontier"] == ["after"]
    h.complete("after", 1)
    assert h.types[-1] == "RunFailed" and h.state["failure"]["node"] == "a"


def test_deterministic_failure_selection_lowest_node() -> None:
    d = definition(
        {"b": act(on_failure="skip_dependents"), "a": act(on_failure="skip_dependents")}, entry=["a", "b"]
    )
    h1 = RunHarness(d).start({}).fail("b").fail("a")
    h2 = RunHarness(d).start({}).fail("a").fail("b")
    assert h1.state["failure"]["node"] == h2.state["failure"]["node"] == "a"


def test_activation_cancelled_by_executor_is_a_retryable_failure() -> None:
    h = RunHarness(definition({"a": act(retry=RETRY)})).start({})
    h.send({"type": "ActivationCancelled", **h.ident("a"), "worker_id": "w1", "reason": "shutdown"})
    assert h.types == ["StepFailed", "StepRetryScheduled"]


def test_agent_activation_carries_spec_and_reserves_agent_budget() -> None:
    d = definition(
        {
            "plan": {
                "kind": "agent",
                "agent": "planner",
                "model": "small",
                "prompt": {"topic": {"from": "input", "pointer": "/topic"}},
            }
        }
    )
    h = RunHarness(d).start({"topic": "kafka"})
    message = h.messages[-1]
    assert message["kind"] == "agent" and message["queue"] == "agents"
    assert message["agent"]["prompt"] == {"topic": "kafka"} and message["agent"]["model"] == "small"
    assert h.state["usage"]["agents"] == 1
    over = RunHarness(definition({"plan": d["nodes"]["plan"]}, budgets={"max_agents": 1}), run_id="r-2")
    over.ctx = h.ctx.__class__(catalog=over.catalog, ceilings=over.ctx.ceilings, queues=over.ctx.queues)
    assert over.start({"topic": "x"}).status == "running"


def test_unresolvable_input_or_prompt_fails_unknown_reference() -> None:
    d = definition({"a": act(input={"x": {"from": "input", "pointer": "/missing"}})})
    h = RunHarness(d).start({})
    assert h.types[-2:] == ["StepFailed", "RunFailed"] and h.state["failure"]["code"] == "UnknownReference"
    d2 = definition(
        {"p": {"kind": "agent", "agent": "a", "model": "m", "prompt": {"from": "state", "pointer": "/nope"}}}
    )
    h2 = RunHarness(d2).start({})
    assert h2.state["failure"]["code"] == "UnknownReference" and h2.messages == []


# A recursive schema that spends many interpreted frames per level of the value it checks.
_FRAME_HUNGRY_SCHEMA = {
    "$defs": {
        "t": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/u"}]}}]},
        "u": {"oneOf": [{"allOf": [{"anyOf": [{"$ref": "#/$defs/t"}]}]}]},
    },
    "$ref": "#/$defs/t",
}


def _nested_list(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def _complete_at_stack_depth(levels: int, extra_frames: int) -> RunHarness:
    h = RunHarness(
        definition({"a": act(output_schema=_FRAME_HUNGRY_SCHEMA)}), ceilings=Ceilings(max_json_depth=100)
    ).start({})

    def down(n: int) -> RunHarness:
        return h.complete("a", _nested_list(levels)) if n == 0 else down(n - 1)

    return down(extra_frames)


@pytest.mark.parametrize("levels", [20, 58, 64, 90])
def test_a_schema_check_answers_the_same_whatever_the_callers_stack_depth(levels: int) -> None:
    """jsonschema recurses in Python: a frame-hungry schema on a value within max_json_depth can
    exhaust the stack, and how much stack is left depends on the caller (and on whether the
    engine is compiled: its functions take no frame). The check gets a fixed budget of frames,
    so `decide` answers alike at every depth of its caller, and never raises."""
    outcomes = set()
    for extra_frames in (0, 50, 200, 600):
        h = _complete_at_stack_depth(levels, extra_frames)
        outcomes.add((tuple(h.types), orjson.dumps(h.last.events[0].get("failure"))))
    assert len(outcomes) == 1, outcomes
    [(types, failure)] = outcomes
    if levels <= 58:
        assert types[0] == "StepSucceeded"
    else:  # 16 frames a level: past the budget of SCHEMA_CHECK_FRAMES, the output fails its check
        assert types[0] == "StepFailed"
        assert b"InvalidOutput" in failure and b"cannot be checked" in failure
