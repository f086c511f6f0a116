"""Adversarial review of the pure engine against docs/semantics.md (and docs/engine-api.md).

Each test names the promise it checks in its docstring. The first group are findings (each
failed on the engine as reviewed); the rest attack promises that held, with concrete outcomes
so that they can fail. Every run is driven through the shared harness (decide, evolve, effects
as the runtime does) and re-folded from its events where that is part of the promise.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from engine_harness import RunHarness, definition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine import Ceilings, dump_state
from tests.agent_loop_definitions import triage_node

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def act(**extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": "do", **extra}


def _loop(**extra: Any) -> dict[str, Any]:
    """One action that routes back to itself: a run bounded only by its budgets."""
    return definition({"a": act()}, routes={"a": ["a"]}, **extra)


def _scheduled(h: RunHarness) -> int:
    return sum(1 for e in h.log if e["type"] == "StepScheduled")


# ============================================================================ findings


@pytest.mark.parametrize("dimension", ["max_steps", "max_concurrency"])
def test_a_start_override_of_zero_does_not_lift_the_definitions_limit(dimension: str) -> None:
    """semantics.md, Start: "budgets (`Limit`: ... an override above the definition's limit —
    overrides may only lower at start — or above a ceiling; exceeding rejects, never clamps)";
    Budgets: "Only positive limits count". An override of 0 counts as no limit, i.e. above both
    the definition's limit and the server ceiling: it must be refused, not accepted as unlimited."""
    h = RunHarness(_loop(budgets={"max_steps": 3, "max_concurrency": 2}), ceilings=Ceilings(max_steps=5))
    h.start({}, budgets={dimension: 0})
    if h.types == ["RunRejected"]:
        assert h.last.events[0]["code"] == "Limit"
        return
    # accepted: then the effective limit must still be a positive one, not "no limit"
    assert h.state is not None and h.state["budgets"][dimension] > 0, h.state["budgets"]


def test_a_start_override_of_zero_steps_cannot_run_past_the_server_ceiling() -> None:
    """semantics.md, Budgets / Start: limits never above a server ceiling ("exceeding rejects,
    never clamps"). A loop started with `max_steps: 0` must not schedule more than the ceiling."""
    h = RunHarness(_loop(), ceilings=Ceilings(max_steps=5)).start({}, budgets={"max_steps": 0})
    if h.types == ["RunRejected"]:
        return
    for _ in range(8):
        if h.status != "running":
            break
        h.complete("a", 1)
    assert _scheduled(h) <= 5 and h.status == "paused"


def test_a_resume_override_of_zero_cannot_lift_the_server_ceiling() -> None:
    """semantics.md, Resume: "new limits (`budgets` may raise the definition's, never above a
    ceiling)". `max_steps: 0` at resume means no limit at all: above the ceiling, so refused."""
    h = RunHarness(_loop(), ceilings=Ceilings(max_steps=3)).start({})
    for _ in range(3):
        h.complete("a", 1)
    assert h.status == "paused" and h.state["pause"]["code"] == "BudgetExceeded"
    h.resume({"max_steps": 0})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Limit"
    assert h.status == "paused"


def test_a_dimension_whose_limit_changed_at_resume_warns_again() -> None:
    """semantics.md, Resume: "Dimensions whose limit changed may warn again" (Budgets:
    "`BudgetWarning` once per dimension when usage reaches `warn_at_percent`"). After a resume that
    raises `max_tokens` 100 -> 1000, reaching 50 % of the new limit must warn again."""
    d = definition(
        {"a": act(), "b": act(), "c": act()},
        routes={"a": ["b"], "b": ["c"]},
        budgets={"max_tokens": 100, "warn_at_percent": 50},
    )
    h = RunHarness(d).start({}).complete("a", 1, usage={"prompt_tokens": 60})
    assert "BudgetWarning" in h.types
    h.complete("b", 1, usage={"prompt_tokens": 50})
    assert h.status == "paused"
    h.resume({"max_tokens": 1000})
    assert h.types[0] == "RunResumed"
    assert "tokens" not in h.state["warned"]  # its limit changed: the warning may be given again
    h.complete("c", 1, usage={"prompt_tokens": 800})  # 910 of 1000
    warnings = [e for e in h.last.events if e["type"] == "BudgetWarning"]
    assert [(w["dimension"], w["used"], w["limit"]) for w in warnings] == [("tokens", 910, 1000)]
    assert h.refold() == dump_state(h.state)


def test_a_dimension_whose_limit_did_not_change_does_not_warn_again() -> None:
    """semantics.md, Budgets: "`BudgetWarning` once per dimension"; Resume: only dimensions whose
    limit changed may warn again. A resume raising `max_tokens` keeps the cost warning given."""
    d = definition(
        {"a": act(), "b": act(), "c": act()},
        routes={"a": ["b"], "b": ["c"]},
        budgets={"max_tokens": 100, "max_cost_micros": 100, "warn_at_percent": 50},
    )
    h = RunHarness(d).start({}).complete("a", 1, usage={"prompt_tokens": 60, "cost_micros": 60})
    h.complete("b", 1, usage={"prompt_tokens": 50})
    h.resume({"max_tokens": 1000})
    assert h.state["warned"] == ["cost_micros"]
    h.complete("c", 1, usage={"cost_micros": 1})
    assert not any(e["type"] == "BudgetWarning" and e["dimension"] == "cost_micros" for e in h.last.events)


def test_a_recovered_tool_call_failure_does_not_fail_a_skip_dependents_agent() -> None:
    """semantics.md, Agent loops: "a call whose tool fails ... is an error result"; Failure
    policies: `skip_dependents` fails the run with `DependencySkipped` only for the node's own
    failure ("the lowest (node, lineage) skip_dependents failure"). An agent step that recovered
    from a failed tool call and answered succeeded: the run must succeed, as under `continue`."""
    tools = {"kb_search": {"action": "kb.search", "queue": "tools"}}
    for policy in ("continue", "skip_dependents", "fail_fast"):
        node = triage_node(copy.deepcopy(tools), on_failure=policy)
        h = RunHarness(definition({"triage": node}, state={"triage": None})).start({"ticket": "t"})
        h.accept("triage", "~1").complete(
            "triage",
            {"content": "", "tool_calls": [{"id": "c0", "name": "kb_search", "arguments": {}}]},
            lineage="~1",
        )
        h.accept("triage", "~1.0").fail("triage", message="index offline", lineage="~1.0")
        h.accept("triage", "~2").complete("triage", {"content": "ok", "answer": "fine"}, lineage="~2")
        assert h.step("triage")["status"] == "succeeded"
        assert (h.status, h.state["failure"]) == ("succeeded", None), policy
        assert h.state["state"]["triage"] == "fine"


def _barrier_failure_after_a_failed_instance(policy: str) -> RunHarness:
    """`a` fails under `policy`, `b` succeeds; b's route condition then fails the barrier."""
    d = definition(
        {"a": act(on_failure=policy), "b": act(), "x": act()},
        entry=["a", "b"],
        routes={"b": [{"to": "x", "when": "state.nope.deeper == 1"}]},
    )
    h = RunHarness(d).start({}).fail("a").complete("b", 1)
    assert h.status == "failed" and h.state["failure"]["code"] == "Evaluation"
    return h


@pytest.mark.parametrize("policy", ["continue", "skip_dependents"])
def test_a_run_that_failed_at_a_barrier_is_not_resumed(policy: str) -> None:
    """semantics.md, Resume: "A run that failed at a barrier (`State`, `Evaluation`) or at its end
    ... is rejected (`Conflict`): resuming would fail the same way." That holds also when the
    superstep has a failed instance under `continue` / `skip_dependents` (which did not fail the
    run: the barrier did)."""
    h = _barrier_failure_after_a_failed_instance(policy)
    h.resume()
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert h.status == "failed"


# ===================================================================== promises that held


@FAST
@given(limit=st.integers(1, 6))
def test_max_steps_is_exact_at_the_boundary(limit: int) -> None:
    """semantics.md, Budgets: steps are "reserved before dispatch"; exhaustion (steps that do not
    fit) -> `BudgetExhausted`, `RunPaused{code BudgetExceeded}`. A self-loop under `max_steps: N`
    schedules exactly N steps, then pauses; the fold from scratch equals the live state."""
    h = RunHarness(_loop(budgets={"max_steps": limit})).start({})
    for _ in range(limit + 2):
        if h.status != "running":
            break
        h.complete("a", 1)
    assert _scheduled(h) == limit and h.state["usage"]["steps"] == limit
    assert h.status == "paused" and h.state["pause"]["code"] == "BudgetExceeded"
    exhausted = next(e for e in h.log if e["type"] == "BudgetExhausted")
    assert (exhausted["dimension"], exhausted["limit"]) == ("steps", limit)
    assert h.refold() == dump_state(h.state)


@FAST
@given(max_attempts=st.integers(1, 4), max_retries=st.integers(1, 4))
def test_retries_end_exactly_at_the_node_policy_or_the_run_budget(
    max_attempts: int, max_retries: int
) -> None:
    """semantics.md, Retries: retry "while `attempt - first_attempt + 1 < retry.max_attempts` and
    the run's `max_retries` budget has room ... Out of attempts or retry budget -> `RetryExhausted`
    (non-retryable)"; a fail_fast node's failure fails the run, never lets it succeed."""
    d = definition(
        {"a": act(retry={"max_attempts": max_attempts, "backoff_ms": 10})},
        budgets={"max_retries": max_retries},
    )
    h = RunHarness(d).start({})
    for _ in range(10):
        if h.status != "running":
            break
        h.fail("a", retryable=True)
        if "StepRetryScheduled" in h.types:
            h.fire("retry_backoff", "a")
    expected = min(max_attempts, max_retries + 1)
    assert h.step("a")["attempt"] == expected
    assert h.state["usage"]["retries"] == expected - 1
    assert h.status == "failed"
    assert h.state["failure"]["code"] == "RetryExhausted"  # a retryable failure under a policy
    assert h.state["failure"]["retryable"] is False
    assert h.refold() == dump_state(h.state)


@FAST
@given(tokens=st.integers(0, 250))
def test_tokens_pause_only_above_the_limit(tokens: int) -> None:
    """semantics.md, Budgets: "tokens (prompt + completion) and `cost_micros` (recorded after each
    receipt ...)", exhaustion when "tokens or cost above the limit". Exactly at the limit the run
    goes on; one above, it pauses after recording the usage."""
    d = definition({"a": act(), "b": act()}, routes={"a": ["b"]}, budgets={"max_tokens": 100})
    h = (
        RunHarness(d)
        .start({})
        .complete("a", 1, usage={"prompt_tokens": tokens // 2, "completion_tokens": tokens - tokens // 2})
    )
    assert h.state["usage"]["prompt_tokens"] + h.state["usage"]["completion_tokens"] == tokens
    if tokens > 100:
        assert h.status == "paused" and h.types[-2:] == ["BudgetExhausted", "RunPaused"]
    else:
        assert h.status == "running" and h.step("b")["status"] == "scheduled"
    assert ("tokens" in h.state["warned"]) == (80 <= tokens <= 100) or tokens > 100


@FAST
@given(n=st.integers(1, 5), failing=st.data())
def test_a_failed_map_item_never_lets_the_run_succeed(n: int, failing: st.DataObject) -> None:
    """semantics.md, Failure policies: `fail_fast` (default) — "once the node is settled as failed
    (a mapped node when all its items settled) ... `RunFailed`"; any receipt order."""
    bad = failing.draw(st.integers(0, n - 1))
    order = failing.draw(st.permutations(list(range(n))))
    d = definition(
        {"m": act(map={"from": "input", "pointer": "/items"}), "after": act()}, routes={"m": ["after"]}
    )
    h = RunHarness(d).start({"items": list(range(n))})
    for index in order:
        if index == bad:
            h.fail("m", lineage=str(index))
        else:
            h.complete("m", index, lineage=str(index))
    assert h.status == "failed" and h.state["failure"]["node"] == "m"
    assert not any(e["type"] in ("RunSucceeded", "SuperstepCommitted") for e in h.log)
    assert h.refold() == dump_state(h.state)


def test_a_failed_child_run_and_a_timed_out_step_fail_the_run() -> None:
    """semantics.md, Child workflows: "failed/cancelled -> `StepFailed` code `ChildFailed`
    (non-retryable)"; Retries: a node timeout "fails `Timeout` (retryable ...)" and, out of
    attempts, the fail_fast node fails the run."""
    child = definition({"c": act()}, id="child")
    parent = definition(
        {"sub": {"kind": "workflow", "workflow": "child", "revision": 1, "retry": {"max_attempts": 3}}}
    )
    h = RunHarness(child, parent, run_id="p-1")
    h.root_id = "wf"
    h.start({}).child_finished("sub", status="failed")
    assert h.status == "failed" and h.state["failure"]["code"] == "ChildFailed"
    assert h.step("sub")["attempt"] == 1  # not retried: the child had its own retries

    h = RunHarness(definition({"a": act(timeout_ms=100)})).start({}).accept("a")
    h.fire("node_timeout", "a")
    assert h.types == ["StepStopping"] and h.status == "running"
    h.stopped("a")
    assert h.status == "failed" and h.state["failure"]["code"] == "Timeout"
    assert h.step("a")["stop"]["how"] == "confirmed"


def _in_status(status: str) -> RunHarness:
    """A run in `status` (run_status names), reached through the ordinary rules."""
    wait = {"kind": "wait", "signal": "go"}
    if status == "waiting":
        return RunHarness(definition({"w": wait})).start({})
    if status == "running":
        return RunHarness(definition({"a": act()})).start({}).accept("a")
    if status == "cancelling":
        return RunHarness(definition({"a": act()})).start({}).accept("a").cancel()
    if status == "paused":
        return RunHarness(_loop(budgets={"max_steps": 1})).start({}).complete("a", 1)
    if status == "succeeded":
        return RunHarness(definition({"a": act()})).start({}).complete("a", 1)
    if status == "failed":
        return RunHarness(definition({"a": act()})).start({}).fail("a")
    assert status == "cancelled"
    return RunHarness(definition({"a": act()})).start({}).cancel().stop_all()


STATUSES = ["running", "waiting", "cancelling", "paused", "succeeded", "failed", "cancelled"]


# a signal only to runs whose definition waits on it (otherwise the unknown-signal rule answers)
COMMAND_CASES = [
    (status, command)
    for status in STATUSES
    for command in ("cancel", "resume", "signal")
    if command != "signal" or status not in ("running", "paused", "cancelling")
]


@pytest.mark.parametrize(("status", "command"), COMMAND_CASES)
def test_a_command_sent_twice_changes_nothing_the_second_time(status: str, command: str) -> None:
    """semantics.md, Cancel: "`CancelRun` is idempotent ... the run is not reopened"; Resume: "A
    running, succeeded or cancelled run -> `RunRejected` `Conflict`"; engine-api.md: `decide`
    never raises. The second of two identical commands (a redelivery) never emits a run event
    (sequence > 0) beyond what the first one did, except a signal, which is a new signal while a
    run that buffers signals takes it (Wait nodes); a finished run is never reopened."""
    h = _in_status(status)
    assert h.status == status
    send = {
        "cancel": lambda: h.cancel("again"),
        "resume": lambda: h.resume({"max_steps": 50}),
        "signal": lambda: h.signal("go", {"n": 1}),
    }[command]
    send()
    after_first = dump_state(h.state)
    first_status = h.status
    send()
    if command == "signal" and h.types and h.types[0] == "SignalReceived":
        return  # a second signal is a second signal (buffered or taken)
    assert [e for e in h.last.events if e["sequence"]] == [], (status, command, h.types)
    assert dump_state(h.state) == after_first and h.status == first_status
    if status in ("succeeded", "failed", "cancelled") and command != "resume":
        assert h.status == status
    assert h.refold() == dump_state(h.state)


RECEIPTS = ["complete", "fail", "accept", "heartbeat", "stopped"]


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
@pytest.mark.parametrize("receipt", RECEIPTS)
def test_receipts_after_a_terminal_event_are_dropped(status: str, receipt: str) -> None:
    """semantics.md, Cancel: "First terminal event wins: after any terminal event, receipts are
    dropped (`run finished`)"."""
    h = _in_status(status)
    before = dump_state(h.state)
    getattr(h, receipt)("a")
    assert h.types == [] and h.last.dropped == "run finished"
    assert dump_state(h.state) == before


@FAST
@given(attempt=st.integers(-3, 6), lineage=st.sampled_from(["", "0", "x", "~1"]), same_id=st.booleans())
def test_a_receipt_of_another_attempt_or_lineage_changes_nothing(
    attempt: int, lineage: str, same_id: bool
) -> None:
    """semantics.md, Receipts: dropped with a reason — `stale attempt` (older attempt), `unknown
    dispatch id` ...; only the current attempt's dispatch id settles a step."""
    d = definition({"a": act(retry={"max_attempts": 3, "backoff_ms": 1})})
    h = RunHarness(d).start({}).fail("a", retryable=True).fire("retry_backoff", "a")
    assert h.step("a")["attempt"] == 2
    if attempt == 2 and lineage == "" and same_id:
        return  # the current attempt itself
    ident = h.ident("a", "", 2)
    msg = {
        "type": "ActivationCompleted",
        "node": "a",
        "lineage": lineage,
        "attempt": attempt,
        "dispatch_id": ident["dispatch_id"] if same_id else "not-a-dispatch-id",
        "worker_id": "w1",
        "output": 1,
        "usage": {},
    }
    before = dump_state(h.state)
    h.send(msg)
    if attempt == 2 and not same_id:
        assert h.last.dropped == "unknown dispatch id"
    if attempt < 2 and lineage == "":
        assert h.last.dropped == "stale attempt"
    assert h.types == [] and h.last.dropped in ("stale attempt", "unknown dispatch id")
    assert dump_state(h.state) == before and h.step("a")["status"] == "scheduled"


@FAST
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    condition=st.sampled_from(
        [
            "output.x > 1",
            "output.x + 1 > 0",
            "size(output.x) > 0",
            "output.x.exists(v, v == 1)",
            "output.x / 0 == 1",
            "output.x.matches('a+')",
            "has(output.x.y) && output.x.y",
            "output.x == state.k",
        ]
    ),
)
def test_a_condition_over_a_hostile_output_routes_or_fails_evaluation(value: Any, condition: str) -> None:
    """semantics.md, Shape: "`decide` never raises, whatever the message ... CEL errors become run
    failures (code `Evaluation`)"; engine-api.md: the events folded from `None` equal the live
    state (`dump_state` byte-equal)."""
    d = definition(
        {"a": act(), "b": act()},
        routes={"a": [{"to": "b", "when": condition}, {"to": "end"}]},
        state={"k": 0},
    )
    h = RunHarness(d).start({}).complete("a", {"x": value})
    if h.status == "failed":
        assert h.state["failure"]["code"] == "Evaluation"
    else:
        assert h.status in ("running", "succeeded")
        assert (h.status == "running") == (h.state["frontier"] == ["b"])
    assert h.refold() == dump_state(h.state)


def test_a_signal_during_a_pause_is_buffered_and_taken_after_the_resume() -> None:
    """semantics.md, Wait nodes: "A signal that arrives before its wait is reached (or while the
    run is paused) is **buffered** ... consumed first-in first-out when a wait on that name is
    reached"; Budgets: the pause cancels open steps, the resume re-activates them."""
    d = definition(
        {"a": act(), "w": {"kind": "wait", "signal": "go"}},
        entry=["a", "w"],
        budgets={"max_cost_micros": 10},
    )
    h = RunHarness(d).start({})
    assert h.state["waits"]
    h.complete("a", 1, usage={"cost_micros": 11})
    assert h.status == "paused" and h.step("w")["status"] == "cancelled"
    h.signal("go", {"n": 1}).signal("go", {"n": 2})
    assert [s["payload"] for s in h.state["signals"]] == [{"n": 1}, {"n": 2}]
    h.resume({"max_cost_micros": 1000})
    assert h.step("w")["status"] == "succeeded" and h.step("w")["output"] == {"n": 1}
    assert h.status == "succeeded" and [s["payload"] for s in h.state["signals"]] == [{"n": 2}]
    assert h.refold() == dump_state(h.state)


# Python values a caller in process can pass that have no JSON form (off the wire every value
# is decoded JSON, so only an in-process caller of `decide` can send them)
NOT_JSON = [2**70, -(2**64), b"raw bytes", {1, 2}, {1: "an int key"}, {"nested": [{"deep": b"x"}]}]


@pytest.mark.parametrize("bad", NOT_JSON, ids=repr)
def test_decide_refuses_a_value_with_no_json_form_at_every_ingress_without_raising(bad: Any) -> None:
    """semantics.md, Shape: "`decide` never raises, whatever the message". A start input or
    labels, a signal payload and an action's output that orjson cannot write were a TypeError
    out of `decide`; each is now refused like any bad value: RunRejected InvalidInput, a
    rejected signal, StepFailed InvalidOutput."""
    flow = definition({"w": {"kind": "wait", "signal": "go"}, "a": act()}, entry=["w"], routes={"w": ["a"]})
    h = RunHarness(flow).start({"x": bad} if not isinstance(bad, dict) else bad)
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "InvalidInput"
    assert "is not a JSON value" in h.last.events[0]["reason"]
    h = RunHarness(flow).start({}, labels={"k": bad})
    assert h.types == ["RunRejected"] and "labels is not a JSON value" in h.last.events[0]["reason"]

    h = RunHarness(flow).start({})
    h.signal("go", {"v": bad})
    assert [e["type"] for e in h.last.events] == ["RunRejected"]
    assert h.last.events[0]["code"] == "InvalidInput" and h.state is not None
    assert h.step("w")["status"] == "waiting"  # the wait still waits for a good signal
    h.signal("go", {"v": 1})
    h.complete("a", {"v": bad})
    failed = [e for e in h.last.events if e["type"] == "StepFailed"]
    assert failed and failed[0]["failure"]["code"] == "InvalidOutput"
    assert "is not a JSON value" in failed[0]["failure"]["message"]
    dump_state(h.state)  # the run's state stays serializable


def test_a_secret_literal_in_the_labels_is_refused_like_one_in_the_input() -> None:
    """docs/semantics.md, Start: secret literals are refused (`InvalidInput`, the reason names
    paths only). Labels are shown by `runs list`, the index and the UI (a reviewer found an
    `api_key` label shown raw there), so they are checked as the input is."""
    secret = "sk-" + "a1b2c3d4e5f6g7h8i9j0k1l2"
    h = RunHarness(definition({"a": act()})).start({}, labels={"team": "x", "api_key": secret})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "InvalidInput"
    reason = h.last.events[0]["reason"]
    assert "secret material in labels at labels.api_key" in reason and secret not in reason
    assert RunHarness(definition({"a": act()})).start({}, labels={"team": "x"}).types[0] == "RunAccepted"
