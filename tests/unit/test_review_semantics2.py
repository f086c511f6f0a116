"""Second adversarial review of the pure engine against docs/semantics.md, docs/definitions.md and
docs/engine-api.md: supersteps, map fan-out, agent loops, retries/timeouts/leases, stopping, wait
nodes and signals, child workflows, size limits and the run end.

Each test quotes the promise it checks. The first group are findings (each failed on the engine as
reviewed); the rest attack promises that held. Every scenario is driven through the shared harness
(decide, evolve, effects as the runtime does) and re-folded from its events: "the events folded
from nothing equal the live state byte for byte" (engine-api.md) is checked everywhere.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from engine_harness import RunHarness, definition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine import Ceilings, dump_state
from tests.agent_loop_definitions import triage_node

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def act(**extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": "do", **extra}


def wait(signal: str = "go", **extra: Any) -> dict[str, Any]:
    return {"kind": "wait", "signal": signal, **extra}


def refolds(h: RunHarness) -> None:
    """engine-api.md: "Folding `decide`'s events through `evolve` from `None` rebuilds the live
    state exactly (`dump_state` byte-equal)"; semantics.md: sequences are gap-free."""
    assert h.refold() == dump_state(h.state)
    assert [e["sequence"] for e in h.log] == list(range(1, len(h.log) + 1))


def size_of(value: Any) -> int:
    return len(orjson.dumps(value))


def padded(size: int) -> dict[str, str]:
    """A JSON object of exactly `size` orjson bytes (size >= 9)."""
    value = {"p": ""}
    value["p"] = "x" * (size - size_of(value))
    assert size_of(value) == size
    return value


# ============================================================================ findings


def test_a_skip_dependents_node_that_routes_to_itself_does_not_let_the_run_succeed() -> None:
    """semantics.md, Failure policies: `skip_dependents` — "when the frontier is empty the run
    **fails** with code `DependencySkipped`"; Shape (generative invariants): "no run succeeds over a
    failed `fail_fast`/`skip_dependents` step". A loop node `a -> a` under skip_dependents that
    fails: its dependent (itself) is skipped, the frontier empties, the run must fail."""
    h = RunHarness(definition({"a": act(on_failure="skip_dependents")}, routes={"a": ["a"]}))
    h.start({}).fail("a", message="a broke")
    assert h.status == "failed", h.types
    assert h.state["failure"]["code"] == "DependencySkipped"
    assert h.state["failure"]["message"] == "a broke (dependents skipped)"
    assert "RunSucceeded" not in [e["type"] for e in h.log]
    assert h.step("a")["status"] == "failed"  # the failure is not overwritten by a skip
    refolds(h)


def test_a_conditional_self_loop_under_skip_dependents_fails_the_run_too() -> None:
    """semantics.md, Failure policies (as above), with the loop shape of Supersteps: `[{to: end,
    when: c}, {to: loop}]`. The failed instance's record must stay `failed`."""
    d = definition(
        {"a": act(on_failure="skip_dependents")},
        routes={"a": [{"to": "end", "when": "state.n > 3"}, {"to": "a"}]},
        state={"n": 0},
    )
    h = RunHarness(d).start({}).complete("a", 1).fail("a")
    assert h.status == "failed" and h.state["failure"]["code"] == "DependencySkipped"
    refolds(h)


def test_the_lowest_skip_dependents_failure_names_the_run_failure() -> None:
    """semantics.md, Failure policies: "the run **fails** with code `DependencySkipped` and the
    lowest `(node, lineage)` skip_dependents failure's message followed by ` (dependents
    skipped)`". `a` and `c` both fail under skip_dependents in one superstep and `c` routes to
    `a`: `a` is the lowest, so its message must name the failure (its record must not be replaced
    by a StepSkipped of the node that already ran)."""
    d = definition(
        {"a": act(on_failure="skip_dependents"), "b": act(), "c": act(on_failure="skip_dependents")},
        routes={"a": ["b"], "c": ["a"]},
        entry=["a", "c"],
    )
    h = RunHarness(d).start({}).fail("a", message="A broke").fail("c", message="C broke")
    assert h.status == "failed"
    assert h.state["failure"]["message"] == "A broke (dependents skipped)"
    assert (h.state["failure"]["node"], h.state["failure"]["code"]) == ("a", "DependencySkipped")
    refolds(h)


def test_a_dependent_that_already_ran_in_the_superstep_keeps_its_outcome() -> None:
    """semantics.md, Supersteps: "Results stay in the step records until the barrier"; Failure
    policies: skip_dependents skips "the node's route targets" (what would run next). `b` ran and
    succeeded in the same superstep as the failed `a` that routes to it: its record is its
    outcome (succeeded, output 5), not `skipped`; exactly one StepSkipped per skipped node."""
    d = definition(
        {
            "a": act(on_failure="skip_dependents"),
            "b": act(),
            "c": act(),
            "x": act(on_failure="skip_dependents"),
        },
        routes={"a": ["b", "c"], "x": ["c"]},
        entry=["a", "b", "x"],
    )
    h = RunHarness(d).start({}).complete("b", 5).fail("x").fail("a")
    assert h.step("b")["status"] == "succeeded" and h.step("b")["output"] == 5
    skipped = [e["node"] for e in h.log if e["type"] == "StepSkipped"]
    assert skipped == ["c"]
    assert h.status == "failed" and h.state["failure"]["node"] == "a"
    refolds(h)


def test_late_receipts_of_an_attempt_whose_lease_expired_are_dropped() -> None:
    """semantics.md, Stopping: "an attempt settled `lease_expired` was presumed dead, and a worker
    that was only frozen ... runs its handler on once it comes back ... beside a retry on another
    worker; its late receipts are dropped." Before the retry's backoff fired too (the attempt is
    still the step's current one), a late completion or failure of it is dropped — no
    ReceiptConflict event enters the run's log — and the retry goes on."""
    d = definition({"a": act(retry={"max_attempts": 3, "backoff_ms": 100})})
    h = RunHarness(d).start({}).accept("a").fire("lease_expiry", "a")
    assert h.types == ["StepFailed", "StepRetryScheduled"]
    assert h.last.events[0]["stop"] == "lease_expired"
    assert h.messages[-1]["type"] == "CancelActivation"
    logged = len(h.log)
    h.complete("a", {"late": True}, attempt=1)
    assert h.types == [] and h.last.dropped == "attempt already stopped"
    h.fail("a", attempt=1, retryable=True)
    assert h.types == [] and h.last.dropped == "attempt already stopped"
    assert len(h.log) == logged and h.step("a")["status"] == "retry_wait"
    h.fire("retry_backoff", "a").complete("a", {"v": 2})
    assert h.status == "succeeded" and h.state["output"] is not None
    h.complete("a", {"late": True}, attempt=1)
    assert h.last.dropped == "run finished"
    refolds(h)


def test_a_late_receipt_of_a_lease_expired_attempt_under_continue_is_dropped() -> None:
    """semantics.md, Stopping (as above): with no retry the attempt's `continue` failure is final;
    its frozen worker's late completion must not reopen or conflict with it."""
    d = definition({"a": act(on_failure="continue"), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).accept("a").fire("lease_expiry", "a")
    assert h.step("a")["status"] == "failed"
    h.complete("a", 1)
    assert h.types == [] and h.last.dropped == "attempt already stopped"
    h.complete("b", 2)
    assert h.status == "succeeded"
    refolds(h)


# ===================================================================== promises that held
# ------------------------------------------------------------------------------ supersteps


def test_every_instance_reads_the_same_snapshot_and_writes_merge_in_node_order() -> None:
    """semantics.md, Supersteps: "every instance reads the same snapshot (`state` as committed by
    the previous barrier)"; "Writes ... merge through the reducers in `(node, lineage)` order ...
    then `state` node mutations apply in node order"."""
    d = definition(
        {
            "b": act(input={"from": "state", "pointer": "/log"}, writes={"log": {"from": "output"}}),
            "a": act(input={"from": "state", "pointer": "/log"}, writes={"log": {"from": "output"}}),
            "z": {"kind": "state", "mutations": [{"op": "append", "target": "log", "value": "z"}]},
            "c": {"kind": "state", "mutations": [{"op": "set", "target": "log", "value": ["c"]}]},
        },
        entry=["b", "a", "z", "c"],
        state={"log": ["s0"]},
        reducers={"log": "append"},
    )
    h = RunHarness(d).start({})
    assert h.step("a")["input"] == ["s0"] and h.step("b")["input"] == ["s0"]
    h.complete("b", "from-b").complete("a", "from-a")
    # writes: a then b (append), then mutations c (set) then z (append)
    assert h.state["state"]["log"] == ["c", "z"]
    h2 = RunHarness(copy.deepcopy(d) | {"entry": ["b", "a"]}).start({})
    h2.complete("b", "from-b").complete("a", "from-a")
    assert h2.state["state"]["log"] == ["s0", "from-a", "from-b"]
    refolds(h)
    refolds(h2)


def test_reject_concurrent_fails_naming_the_key_and_writers() -> None:
    """semantics.md, Supersteps: "A `reject_concurrent` key written by two instances -> the run
    fails, code `State`, naming the key and the writers"; one writer is fine."""
    d = definition(
        {"m": act(map={"from": "input", "pointer": "/items"}, writes={"k": {"from": "output"}})},
        state={"k": None},
        reducers={"k": "reject_concurrent"},
    )
    h = RunHarness(d).start({"items": [1]}).complete("m", 1, lineage="0")
    assert h.status == "succeeded" and h.state["state"]["k"] == 1
    h = RunHarness(d).start({"items": [1, 2]}).complete("m", 1, lineage="0").complete("m", 2, lineage="1")
    assert h.status == "failed" and h.state["failure"]["code"] == "State"
    message = h.state["failure"]["message"]
    assert "k" in message and "m[0]" in message and "m[1]" in message, message
    assert "SuperstepCommitted" not in [e["type"] for e in h.log]
    refolds(h)


@FAST
@given(c1=st.booleans(), c2=st.booleans())
def test_routes_fan_out_to_every_true_condition_and_else_only_when_none(c1: bool, c2: bool) -> None:
    """semantics.md, Supersteps / Routes: "**every** route whose `when` holds is followed ... a
    route without `when` is followed unless an earlier conditional route of the list was taken";
    Join: "a node routed to by several nodes of the same superstep runs once"."""
    d = definition(
        {"a": act(), "b": act(), "x": act(), "y": act(), "z": act()},
        routes={
            "a": [
                {"to": "x", "when": "output.c1"},
                {"to": "y", "when": "output.c2"},
                {"to": "z"},
            ],
            "b": ["x"],
        },
        entry=["a", "b"],
    )
    h = RunHarness(d).start({}).complete("a", {"c1": c1, "c2": c2}).complete("b", 0)
    expected = sorted({"x"} | ({"y"} if c2 else set()) | ({"z"} if not (c1 or c2) else set()))
    assert h.state["frontier"] == expected
    assert sum(1 for e in h.last.events if e["type"] == "StepScheduled" and e["node"] == "x") == 1
    refolds(h)


@FAST
@given(rounds=st.integers(1, 6), limit=st.integers(1, 12))
def test_a_counting_loop_leaves_when_its_condition_holds_within_max_steps(rounds: int, limit: int) -> None:
    """semantics.md, Supersteps: "`[{to: end, when: c}, {to: loop}]` leaves the loop when `c`
    holds"; "every node instance of a superstep takes a step ... so `max_steps` bounds every
    loop"; "a node re-activated by a loop gets attempt n+1 and a fresh dispatch id"."""
    d = definition(
        {"inc": {"kind": "state", "mutations": [{"op": "increment", "target": "n"}]}},
        routes={"inc": [{"to": "end", "when": f"state.n >= {rounds}"}, {"to": "inc"}]},
        state={"n": 0},
        budgets={"max_steps": limit},
    )
    h = RunHarness(d).start({})
    if rounds <= limit:
        assert h.status == "succeeded" and h.state["state"]["n"] == rounds
    else:
        assert h.status == "paused" and h.state["state"]["n"] == limit
    assert h.state["usage"]["steps"] == min(rounds, limit)
    assert h.step("inc")["attempt"] == min(rounds, limit)
    dispatch_ids = [e["dispatch_id"] for e in h.log if e["type"] == "StepScheduled"]
    assert len(set(dispatch_ids)) == len(dispatch_ids)
    refolds(h)


# ---------------------------------------------------------------------------- map fan-out


@FAST
@given(n=st.integers(0, 13), cap=st.integers(1, 4), data=st.data())
def test_map_results_are_in_index_order_and_max_concurrency_holds_back(
    n: int, cap: int, data: st.DataObject
) -> None:
    """semantics.md, Map fan-out: "One activation per item, lineage `"0".."n-1"` ... The node's
    value (for routes) is the array of outputs in index order"; Budgets: "`max_concurrency` caps
    the action ... activations in flight ... the rest ... dispatched in `(node, lineage)` order as
    slots free up"; "An empty array settles the node at once (`StepSucceeded` with output `[]`, no
    `StepScheduled`)". Items complete in a random order."""
    d = definition(
        {
            "m": act(map={"from": "input", "pointer": "/items"}),
            "after": act(input={"from": "literal", "value": 0}),
        },
        routes={"m": [{"to": "after", "when": f"output == {[i * 10 for i in range(n)]}"}]},
        budgets={"max_concurrency": cap},
    )
    h = RunHarness(d).start({"items": list(range(n))})
    dispatched: list[int] = []
    while True:
        open_items = sorted(
            int(s["lineage"])
            for s in h.state["steps"].values()
            if s["node"] == "m" and s["status"] == "scheduled"
        )
        if not open_items:
            break
        assert len(open_items) <= cap
        dispatched += [i for i in open_items if i not in dispatched]
        pick = data.draw(st.sampled_from(open_items))
        h.complete("m", pick * 10, lineage=str(pick))
    assert dispatched == list(range(n))
    if n == 0:
        assert [e["type"] for e in h.log if e.get("node") == "m"] == ["StepSucceeded"]
    assert h.state["frontier"] == ["after"] and h.status == "running"
    refolds(h)


@pytest.mark.parametrize("policy", ["fail_fast", "continue", "skip_dependents"])
def test_map_item_failures_under_each_policy(policy: str) -> None:
    """semantics.md, Map fan-out: "All items run even when one fails ... A failed map node's
    failure has the lowest failed item's code and a message listing every failed item ... Its
    code is the failed items' common code when they all agree, otherwise `ExecutionFailed`";
    Failure policies: `continue` — "a mapped node: its array has `{"error": ...}` for failed
    items ... no writes come from failed instances"; `skip_dependents` — targets skipped, the run
    fails `DependencySkipped`."""
    d = definition(
        {
            "m": act(
                map={"from": "input", "pointer": "/items"},
                on_failure=policy,
                writes={"ok": {"from": "output"}},
            ),
            "after": act(),
        },
        routes={"m": [{"to": "after", "when": "size(output) == 3"}]},
        state={"ok": []},
        reducers={"ok": "append"},
    )
    h = RunHarness(d).start({"items": ["a", "b", "c"]})
    h.fail("m", code="Timeout", message="t1", lineage="2")
    assert h.status == "running"  # the other items still run
    h.complete("m", "A", lineage="0").fail("m", code="InvalidInput", message="bad", lineage="1")
    if policy == "fail_fast":
        assert h.status == "failed"
        f = h.state["failure"]
        assert f["code"] == "ExecutionFailed" and f["node"] == "m"
        assert f["message"] == "2 of 3 map items of m failed: [1] InvalidInput: bad; [2] Timeout: t1"
    elif policy == "continue":
        assert h.state["state"]["ok"] == ["A"]
        assert h.state["frontier"] == ["after"]
        assert h.status == "running"
    else:
        assert h.status == "failed" and h.state["failure"]["code"] == "DependencySkipped"
        assert [e["node"] for e in h.log if e["type"] == "StepSkipped"] == ["after"]
    refolds(h)


def test_a_map_source_that_is_not_an_array_fails_invalid_input() -> None:
    """semantics.md, Map fan-out: "anything else fails the node `InvalidInput` "map source must be
    an array""; it takes one step and schedules nothing."""
    d = definition({"m": act(map={"from": "input", "pointer": "/items"})})
    h = RunHarness(d).start({"items": {"not": "a list"}})
    assert h.status == "failed" and h.state["failure"]["code"] == "InvalidInput"
    assert "map source must be an array" in h.state["failure"]["message"]
    assert "StepScheduled" not in [e["type"] for e in h.log]
    assert h.state["usage"]["steps"] == 1
    refolds(h)


def test_a_map_that_does_not_fit_the_step_budget_pauses_before_any_dispatch_and_resumes() -> None:
    """semantics.md, Map fan-out: "if they do not fit the run **pauses** (`BudgetExhausted` +
    `RunPaused`, reason "map cardinality exceeds remaining workflow step budget") and nothing is
    dispatched; `ResumeRun` with a larger `max_steps` activates them"."""
    d = definition({"m": act(map={"from": "input", "pointer": "/items"})}, budgets={"max_steps": 3})
    h = RunHarness(d).start({"items": [1, 2, 3]})
    assert h.state["frontier"] == ["m"] and h.status == "running"
    h = RunHarness(d).start({"items": [1, 2, 3, 4]})
    assert h.status == "paused" and "map cardinality exceeds" in h.state["pause"]["reason"]
    assert "StepScheduled" not in [e["type"] for e in h.log] and not h.messages
    h.resume({"max_steps": 4})
    assert [e["type"] for e in h.last.events].count("StepScheduled") == 4
    for i in range(4):
        h.complete("m", i, lineage=str(i))
    assert h.status == "succeeded"
    refolds(h)


# ------------------------------------------------------------------ retries, timeouts, leases


@FAST
@given(
    backoff=st.integers(0, 1000),
    multiplier=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    cap=st.none() | st.integers(0, 5000),
)
def test_retry_backoff_timers_follow_the_formula(backoff: int, multiplier: float, cap: int | None) -> None:
    """semantics.md, Retries: "`due = now + min(backoff_ms * multiplier^(attempts-1),
    max_backoff_ms)`; its `retry_backoff` `TimerFired` schedules the next attempt (same input ...;
    new dispatch id)"."""
    retry: dict[str, Any] = {"max_attempts": 4, "backoff_ms": backoff, "multiplier": multiplier}
    if cap is not None:
        retry["max_backoff_ms"] = cap
    h = RunHarness(definition({"a": act(input={"k": 1}, retry=retry)})).start({})
    ids = [h.step("a")["dispatch_id"]]
    for n in (1, 2, 3):
        h.fail("a", retryable=True)
        scheduled = h.last.events[1]
        expected = backoff * multiplier ** (n - 1)
        if cap is not None:
            expected = min(expected, cap)
        assert scheduled["type"] == "StepRetryScheduled"
        assert scheduled["due_ms"] - h.now == int(expected)
        h.fire("retry_backoff", "a")
        assert h.step("a")["input"] == {"k": 1} and h.step("a")["attempt"] == n + 1
        ids.append(h.step("a")["dispatch_id"])
    assert len(set(ids)) == 4
    refolds(h)


def test_a_completion_racing_the_node_timeout_after_it_fired_keeps_the_timeout() -> None:
    """semantics.md, Retries: a node timeout "puts the attempt in `stopping` ... it fails
    `Timeout` (retryable, `StepFailed.stop` saying how it stopped) and the retry's backoff starts
    only once it stopped"; Stopping table: `ActivationCompleted` -> `completed` "(recorded with its
    usage; the outcome stays)". A completion before the timer fired wins instead, and the
    timer then is stale."""
    d = definition({"a": act(timeout_ms=100, retry={"max_attempts": 2, "backoff_ms": 5})})
    h = RunHarness(d).start({}).accept("a").fire("node_timeout", "a")
    assert h.types == ["StepStopping"] and not any(
        t["timer_kind"] == "retry_backoff" for t in h.timers.values()
    )
    h.complete("a", {"v": 1}, usage={"cost_micros": 3})
    assert h.types == ["StepFailed", "StepRetryScheduled"]
    assert h.last.events[0]["failure"]["code"] == "Timeout" and h.last.events[0]["stop"] == "completed"
    assert h.state["usage"]["cost_micros"] == 3
    h.complete("a", {"v": 1}, usage={"cost_micros": 3}, attempt=1)
    assert h.last.dropped == "attempt already stopped"
    h.fire("retry_backoff", "a").complete("a", {"v": 2})
    assert h.status == "succeeded"
    refolds(h)

    h = RunHarness(d).start({}).accept("a")
    timer = next(t for t in h.timers.values() if t["timer_kind"] == "node_timeout")
    h.complete("a", {"v": 1})
    assert h.status == "succeeded"
    h.send(dict(timer), advance=0)
    assert h.types == [] and h.last.dropped in ("run finished", "stale timer")
    refolds(h)


def test_a_heartbeat_moves_the_lease_and_the_old_lease_timer_is_stale() -> None:
    """semantics.md, Action steps: "`ActivationHeartbeat` -> `StepLeaseExtended` and the timer
    moves (same id ...)"; Retries: "A timer whose due no longer matches is dropped ("stale
    timer")"."""
    h = RunHarness(definition({"a": act(retry={"max_attempts": 2})})).start({}).accept("a", lease_ms=100)
    old = next(t for t in h.timers.values() if t["timer_kind"] == "lease_expiry")
    h.heartbeat("a", lease_ms=100)
    new = next(t for t in h.timers.values() if t["timer_kind"] == "lease_expiry")
    assert new["timer_id"] == old["timer_id"] and new["due_ms"] > old["due_ms"]
    h.send(dict(old), advance=0)
    assert h.types == [] and h.last.dropped == "stale timer" and h.step("a")["status"] == "running"
    h.heartbeat("a", worker="w2")
    assert h.last.dropped == "heartbeat from a worker that does not hold the lease"
    refolds(h)


# ------------------------------------------------------------------------------- stopping


def test_cancel_while_attempts_run_stops_them_first_and_lists_how_each_stopped() -> None:
    """semantics.md, Cancel: "every open step that holds nothing in flight (a retry backoff, a
    wait, a sleep) -> `StepCancelled`; every action, agent or child step that may still run ->
    `StepStopping` (+ `CancelActivation` / `ChildRunCancel`); then `RunCancelled` once ... once
    each stopping attempt stopped"; Stopping: "keeps its lease (acceptances and heartbeats are
    still taken)"; the table (`confirmed`, `completed`, `lease_expired`, `stop_unconfirmed`);
    "Later receipts of a settled stopping attempt are dropped"."""
    child = definition({"c": act()}, id="child")
    parent = definition(
        {
            "a": act(),
            "b": act(),
            "c": act(),
            "d": act(stop_timeout_ms=50),
            "r": act(retry={"max_attempts": 2, "backoff_ms": 10_000}),
            "s": {"kind": "sleep", "duration_ms": 10_000},
            "sub": {"kind": "workflow", "workflow": "child", "revision": 1},
            "w": wait(),
        },
        entry=["a", "b", "c", "d", "r", "s", "sub", "w"],
    )
    h = RunHarness(child, parent, run_id="p-1")
    h.root_id = "wf"
    h.start({}).accept("b", lease_ms=100).accept("c").fail("r", retryable=True)
    h.cancel("stop it")
    stopping = sorted(e["node"] for e in h.last.events if e["type"] == "StepStopping")
    cancelled = sorted(e["node"] for e in h.last.events if e["type"] == "StepCancelled")
    assert stopping == ["a", "b", "c", "d", "sub"] and cancelled == ["r", "s", "w"]
    assert h.types[-1] == "RunCancelling" and h.status == "cancelling"
    kinds = sorted(m["type"] for m in h.messages if m["type"] in ("CancelActivation", "ChildRunCancel"))
    assert kinds == ["CancelActivation"] * 4 + ["ChildRunCancel"]
    h.accept("a")
    assert h.types == ["StepStarted"] and h.step("a")["status"] == "stopping"
    h.heartbeat("c", lease_ms=60_000)
    assert h.types == ["StepLeaseExtended"]
    h.signal("go", {"x": 1})  # answered as for a run that is not running: buffered, not taken
    assert h.step("w")["status"] == "cancelled"
    h.stopped("a").complete("c", {"v": 1}, usage={"prompt_tokens": 4}).fire("lease_expiry", "b")
    h.fire("stop_timeout", "d")
    assert h.status == "cancelling"
    h.complete("a", 1)
    # dropped; the reason is the cancelled step's (doc: "attempt already stopped")
    assert h.types == [] and h.last.dropped in ("attempt already stopped", "step already cancelled")
    h.child_finished("sub", status="cancelled", usage={"cost_micros": 9})
    assert h.status == "cancelled" and h.types[-1] == "RunCancelled"
    stops = {(s["node"], s["stop"]) for s in h.log[-1]["stops"]}
    assert stops == {
        ("a", "confirmed"),
        ("b", "lease_expired"),
        ("c", "completed"),
        ("d", "stop_unconfirmed"),
        ("sub", "confirmed"),
    }
    assert h.state["usage"]["prompt_tokens"] == 4 and h.state["usage"]["cost_micros"] == 9
    assert all(
        s["status"] not in ("scheduled", "running", "stopping", "waiting") for s in h.state["steps"].values()
    )
    refolds(h)


def test_a_failure_while_stopping_does_not_replace_the_cancel() -> None:
    """semantics.md, Cancel: "First terminal event wins"; "a run failing while its steps stop:
    `RunRejected` `Conflict` ("run already failing")"; Stopping: a completion or failure of a
    stopping attempt is recorded, "the outcome stays". A cancelled run whose stopping attempt then
    fails ends `cancelled`, not failed."""
    h = RunHarness(definition({"a": act(), "b": act()}, entry=["a", "b"])).start({}).cancel()
    h.fail("a", message="died while stopping").stopped("b")
    assert h.status == "cancelled" and h.state["failure"] is None
    stops = {(s["node"], s["stop"]) for s in h.log[-1]["stops"]}
    assert stops == {("a", "failed"), ("b", "confirmed")}
    refolds(h)

    h = RunHarness(definition({"a": act(), "b": act()}, entry=["a", "b"])).start({}).fail("a")
    assert h.status == "cancelling" and h.state["halting"]["outcome"] == "RunFailed"
    h.cancel()
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    h.stopped("b")
    assert h.status == "failed"
    refolds(h)


# ---------------------------------------------------------------------- wait nodes, signals


def test_buffered_signals_are_taken_first_in_first_out_by_the_lowest_wait() -> None:
    """semantics.md, Wait nodes: "A signal that arrives before its wait is reached ... is
    **buffered**: `SignalReceived{node: null}`, consumed first-in first-out when a wait on that
    name is reached"; "`SignalRun` with a waited-for name settles the lowest waiting instance";
    "the node's writes can read scope `signal`"."""
    d = definition(
        {
            "a": act(),
            "wb": wait(writes={"b": {"from": "signal"}}),
            "wa": wait(writes={"a": {"from": "signal"}}),
            "wc": wait(writes={"c": {"from": "signal"}}),
        },
        routes={"a": ["wb", "wa", "wc"]},
        state={"a": None, "b": None, "c": None},
    )
    h = RunHarness(d).start({}).signal("go", 1).signal("go", 2)
    assert [e["node"] for e in h.log if e["type"] == "SignalReceived"] == [None, None]
    h.complete("a", 0)
    assert h.state["signals"] == [] and h.step("wc")["status"] == "waiting"
    h.signal("go", 3)
    assert h.status == "succeeded"
    assert h.state["state"] == {"a": 1, "b": 2, "c": 3}
    refolds(h)


def test_two_waits_reached_together_settle_lowest_first() -> None:
    """semantics.md, Wait nodes: "`SignalRun` with a waited-for name settles the lowest waiting
    instance"; a wait's `timeout_ms` fails it `Timeout`, not retryable."""
    d = definition(
        {"y": wait(timeout_ms=100, on_failure="continue"), "x": wait(timeout_ms=100)},
        entry=["y", "x"],
    )
    h = RunHarness(d).start({}).signal("go", "first")
    assert h.step("x")["status"] == "succeeded" and h.step("x")["output"] == "first"
    assert h.step("y")["status"] == "waiting"
    h.fire("wait_timeout", "y")
    assert h.step("y")["failure"]["code"] == "Timeout" and h.step("y")["failure"]["retryable"] is False
    assert h.status == "succeeded"
    refolds(h)


def test_payload_schema_refuses_early_and_late_signals_and_accept_early_false_refuses_early() -> None:
    """semantics.md, Wait nodes: "a `SignalRun` whose payload fails it is rejected before it
    reaches the run — `RunRejected` `InvalidInput`, `dropped="signal payload refused"` ... and the
    run goes on waiting ... This holds for a signal sent early too"; "`accept_early: false` ... one
    sent before the wait is reached ... is rejected `Conflict` ... `dropped="early signal
    refused"`"; an unknown signal name is rejected `InvalidInput` ("unknown signal")."""
    schema = {"type": "object", "required": ["reviewer"], "properties": {"reviewer": {"type": "string"}}}
    d = definition(
        {"a": act(), "w": wait("approval", payload_schema=schema, accept_early=False)},
        routes={"a": ["w"]},
    )
    h = RunHarness(d).start({})
    before = dump_state(h.state)
    h.signal("approval", {"nope": 1})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "InvalidInput"
    assert h.last.dropped == "signal payload refused" and "nope" not in h.last.events[0]["reason"]
    h.signal("approval", {"reviewer": "r"})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert h.last.dropped == "early signal refused"
    h.signal("other", {})
    assert h.last.dropped == "unknown signal" and h.last.events[0]["code"] == "InvalidInput"
    assert dump_state(h.state) == before
    h.complete("a", 1).signal("approval", {"reviewer": 7})
    assert h.types == ["RunRejected"] and h.step("w")["status"] == "waiting"
    h.signal("approval", {"reviewer": "r"})
    assert h.status == "succeeded"
    refolds(h)


# -------------------------------------------------------------------------- child workflows


def test_a_child_run_activation_and_its_results() -> None:
    """semantics.md, Child workflows: "`StepScheduled` + `ChildRunActivation` ... `parent =
    {parent_run_id, parent_node, parent_lineage, parent_dispatch_id, root_run_id, depth + 1}`";
    "`ChildRunFinished` succeeded -> `StepSucceeded(output)`"; "its usage (tokens, cost) is added
    to the parent's ledger ... Steps, retries and agents of the child are not added"; a cancelled
    child -> `ChildFailed`, not retried."""
    child = definition({"c": act()}, id="child")
    parent = definition(
        {
            "sub": {
                "kind": "workflow",
                "workflow": "child",
                "revision": 1,
                "map": {"from": "input", "pointer": "/xs"},
                "on_failure": "continue",
                "retry": {"max_attempts": 3},
                "writes": {"out": {"from": "output"}},
            }
        },
        state={"out": []},
        reducers={"out": "append"},
    )
    h = RunHarness(child, parent, run_id="p-1")
    h.root_id = "wf"
    h.start({"xs": [1, 2]})
    acts = [m for m in h.messages if m["type"] == "ChildRunActivation"]
    assert len(acts) == 2
    ref = acts[1]["parent"]
    assert (ref["parent_run_id"], ref["parent_node"], ref["parent_lineage"], ref["depth"]) == (
        "p-1",
        "sub",
        "1",
        1,
    )
    assert ref["root_run_id"] == "p-1" and ref["parent_dispatch_id"] == h.step("sub", "1")["dispatch_id"]
    h.child_finished("sub", output={"r": 1}, lineage="0", usage={"prompt_tokens": 5, "cost_micros": 2})
    h.child_finished("sub", status="cancelled", lineage="1")
    assert h.step("sub", "1")["failure"]["code"] == "ChildFailed" and h.step("sub", "1")["attempt"] == 1
    assert h.status == "succeeded" and h.state["state"]["out"] == [{"r": 1}]
    assert h.state["usage"]["prompt_tokens"] == 5 and h.state["usage"]["steps"] == 2
    refolds(h)


@pytest.mark.parametrize(
    ("limit", "levels", "ok"), [(1, 1, False), (2, 1, True), (2, 2, False), (3, 2, True)]
)
def test_nesting_depth_counts_the_root(limit: int, levels: int, ok: bool) -> None:
    """semantics.md, Nesting depth: "counts the **levels of the whole run tree, the root
    included** ... `max_nesting_depth: 1` allows no child workflow"; at start "refused ...
    unless `d + h + 1 <= max_nesting_depth`" (a start override may lower it)."""
    defs = [definition({"leaf": act()}, id="l0")]
    for level in range(1, levels + 1):
        defs.append(
            definition(
                {"sub": {"kind": "workflow", "workflow": f"l{level - 1}", "revision": 1}}, id=f"l{level}"
            )
        )
    h = RunHarness(*defs)
    h.root_id = f"l{levels}"
    h.start({}, budgets={"max_nesting_depth": limit})
    if ok:
        assert h.types[:2] == ["RunAccepted", "RunStarted"]
    else:
        assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "BudgetExceeded"
        assert "maxDepth exceeded" in h.last.events[0]["reason"]


# ------------------------------------------------------------------------------ size limits

SMALL = Ceilings(max_input_bytes=300, max_payload_bytes=200, max_state_bytes=400, max_json_depth=8)


@pytest.mark.parametrize("over", [0, 1])
def test_each_size_limit_is_exact_at_the_limit_and_refuses_one_above(over: int) -> None:
    """semantics.md, Size limits: `max_input_bytes` (`StartRun.input` -> `RunRejected` `Limit`),
    `max_payload_bytes` (labels -> `Limit`; `SignalRun.payload` -> `Limit` "signal payload of N
    bytes exceeds max_payload_bytes M", `dropped="signal payload too large"`, the run unchanged;
    an action or child output -> `InvalidOutput` "output of N bytes exceeds max_payload_bytes M",
    not retryable), `max_state_bytes` (`RunFailed` `State` "state of N bytes after superstep S
    exceeds max_state_bytes M", no `SuperstepCommitted`). Sizes are orjson bytes: at the limit
    passes, one byte above is refused."""
    h = RunHarness(definition({"a": act()}), ceilings=SMALL).start(padded(300 + over))
    assert (h.types[0] == "RunRejected") == bool(over)
    if over:
        assert h.last.events[0]["code"] == "Limit"
    h = RunHarness(definition({"a": act()}), ceilings=SMALL).start({}, labels=padded(200 + over))
    assert (h.types[0] == "RunRejected") == bool(over)

    d = definition({"a": act(retry={"max_attempts": 3})})
    h = RunHarness(d, ceilings=SMALL).start({}).complete("a", padded(200 + over))
    assert h.status == ("failed" if over else "succeeded")
    if over:
        f = h.state["failure"]
        assert (f["code"], f["retryable"], f["message"]) == (
            "InvalidOutput",
            False,
            "output of 201 bytes exceeds max_payload_bytes 200",
        )
        assert h.step("a")["output"] is None and h.step("a")["attempt"] == 1
    refolds(h)

    h = RunHarness(definition({"w": wait()}), ceilings=SMALL).start({})
    before = dump_state(h.state)
    h.signal("go", padded(200 + over))
    if over:
        assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Limit"
        assert h.last.events[0]["reason"] == "signal payload of 201 bytes exceeds max_payload_bytes 200"
        assert h.last.dropped == "signal payload too large" and dump_state(h.state) == before
    else:
        assert h.status == "succeeded"

    child = definition({"c": act()}, id="child")
    parent = definition({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}})
    h = RunHarness(child, parent, run_id="p-1", ceilings=SMALL)
    h.root_id = "wf"
    h.start({}).child_finished("sub", output=padded(200 + over))
    assert h.status == ("failed" if over else "succeeded")

    grown = "x" * (400 + over - size_of({"s": ""}))
    d = definition({"a": act(writes={"s": {"from": "output"}})}, state={"s": None})
    h = RunHarness(d, ceilings=Ceilings(max_state_bytes=400)).start({}).complete("a", grown)
    if over:
        assert h.status == "failed" and h.state["failure"]["code"] == "State"
        assert (
            h.state["failure"]["message"]
            == "state of 401 bytes after superstep 1 exceeds max_state_bytes 400"
        )
        assert "SuperstepCommitted" not in [e["type"] for e in h.log] and h.state["state"] == {"s": None}
    else:
        assert h.status == "succeeded" and h.state["state"]["s"] == grown
    refolds(h)


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("over", [0, 1])
def test_json_depth_is_exact_at_the_limit(over: int) -> None:
    """semantics.md, Size limits, Nesting: "refused when it nests deeper than the ceiling
    `max_json_depth` (... a scalar is level 0, `[1]` level 1)": `StartRun.input` -> `RunRejected`
    `InvalidInput`; a signal payload -> `InvalidInput`, the run keeps waiting; an output -> the
    attempt fails `InvalidOutput` (not retried); a value a node writes into state -> `RunFailed`
    `State`."""
    deep = nested(8 + over)
    h = RunHarness(definition({"a": act()}), ceilings=SMALL).start({"v": nested(7 + over)})
    assert (h.types[0] == "RunRejected") == bool(over)
    h = RunHarness(definition({"a": act(retry={"max_attempts": 2})}), ceilings=SMALL).start({})
    h.complete("a", deep)
    assert h.status == ("failed" if over else "succeeded")
    if over:
        assert h.state["failure"]["code"] == "InvalidOutput" and h.step("a")["attempt"] == 1
    h = RunHarness(definition({"w": wait()}), ceilings=SMALL).start({}).signal("go", deep)
    if over:
        assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "InvalidInput"
        assert h.step("w")["status"] == "waiting"
    else:
        assert h.status == "succeeded"
    # the written value wraps the output (accepted at depth 7 + over) one level deeper
    d = definition({"a": act(writes={"s": {"wrap": {"from": "output"}}})}, state={"s": None})
    h = RunHarness(d, ceilings=SMALL).start({}).complete("a", nested(7 + over))
    assert h.status == ("failed" if over else "succeeded")
    if over:
        assert h.state["failure"]["code"] == "State"
    refolds(h)


# -------------------------------------------------------------------------------- run end


def test_run_end_output_required_keys_and_output_schema() -> None:
    """semantics.md, Run end: "a `required` state key that is null fails it (`State`); the output
    is `definition.output` (a reference over `state`/`input`; absent = the whole state), checked
    against `output_schema` (`InvalidOutput`) -> `RunSucceeded{output, usage}`"."""
    base = {"a": act(writes={"k": {"from": "output"}})}
    h = RunHarness(definition(base, state={"k": None, "j": 1}, required=["k"])).start({}).complete("a", None)
    assert (
        h.status == "failed"
        and h.state["failure"]["code"] == "State"
        and "'k'" in h.state["failure"]["message"]
    )
    h = RunHarness(definition(base, state={"k": None, "j": 1}, required=["k"])).start({}).complete("a", 0)
    assert h.status == "succeeded" and h.state["output"] == {"k": 0, "j": 1}
    d = definition(
        base,
        state={"k": None},
        output={"from": "state", "pointer": "/k"},
        output_schema={"type": "integer"},
    )
    h = RunHarness(d).start({}).complete("a", "text")
    assert h.status == "failed" and h.state["failure"]["code"] == "InvalidOutput"
    h = RunHarness(d).start({}).complete("a", 3, usage={"cost_micros": 4})
    assert h.status == "succeeded" and h.state["output"] == 3
    assert h.log[-1]["type"] == "RunSucceeded" and h.log[-1]["usage"]["cost_micros"] == 4
    h.resume()
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    refolds(h)


# ------------------------------------------------------------------- decide never raises

JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
FIELDS = [
    "node", "lineage", "attempt", "dispatch_id", "worker_id", "lease_ms", "output", "usage", "code",
    "message", "retryable", "confirmed", "reason", "status", "failure", "child_run_id", "signal",
    "payload", "budgets", "timer_id", "timer_kind", "due_ms", "revision", "input", "labels", "parent",
    "bundle",
]  # fmt: skip
TYPES = [
    "StartRun", "CancelRun", "SignalRun", "ResumeRun", "ActivationAccepted", "ActivationHeartbeat",
    "ActivationCompleted", "ActivationFailed", "ActivationCancelled", "ChildRunFinished", "TimerFired",
    "FailRun",
]  # fmt: skip


def _world() -> RunHarness:
    """A run with a map of actions, an agent loop in a tool call, a child, a wait and retries."""
    tools = {"kb": {"action": "kb.search", "queue": "tools", "retry": {"max_attempts": 2}}}
    child = definition({"c": act()}, id="child")
    parent = definition(
        {
            "m": act(map={"from": "input", "pointer": "/xs"}, retry={"max_attempts": 2}, timeout_ms=50),
            "t": triage_node(copy.deepcopy(tools)),
            "sub": {"kind": "workflow", "workflow": "child", "revision": 1},
            "w": wait(timeout_ms=100),
        },
        entry=["m", "t", "sub", "w"],
        state={"triage": None},
        budgets={"max_concurrency": 4},
    )
    h = RunHarness(child, parent, run_id="p-1")
    h.root_id = "wf"
    h.start({"xs": [1, 2], "ticket": "x"})
    h.complete("t", {"content": "", "tool_calls": [{"id": "c", "name": "kb", "arguments": {}}]}, lineage="~1")
    return h


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decide_never_raises_whatever_the_message(data: st.DataObject) -> None:
    """semantics.md, Shape: "`decide` never raises, whatever the message. Unknown `type`, a
    missing or mistyped field -> no events, `dropped` says what"; engine-api.md: the events folded
    from `None` equal the live state. Messages aimed at the run's real steps and timers (their
    identity kept or perturbed) with hostile values in every field, in any order."""
    h = _world()
    for _ in range(data.draw(st.integers(1, 8))):
        steps = list(h.state["steps"].values())
        msg: dict[str, Any] = {"type": data.draw(st.sampled_from(TYPES))}
        if steps and data.draw(st.booleans()):
            step = data.draw(st.sampled_from(steps))
            msg.update(h.ident(step["node"], step["lineage"]))
            msg.update(worker_id="w1", lease_ms=100, code="ExecutionFailed", message="m", status="failed")
            msg.update(child_run_id="c", signal="go")
        if h.timers and data.draw(st.booleans()):
            msg.update(data.draw(st.sampled_from(sorted(h.timers.values(), key=lambda t: t["timer_id"]))))
            msg["type"] = data.draw(st.sampled_from(["TimerFired", msg["type"]]))
        for name in data.draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
            msg[name] = data.draw(JSONISH)
        if data.draw(st.booleans()):
            msg["type"] = data.draw(st.sampled_from(TYPES))
        h.send(msg)  # must not raise
        assert h.state is not None
        if h.last.dropped is not None and not h.last.events:
            continue
        assert h.status in ("running", "waiting", "cancelling", "paused", "succeeded", "failed", "cancelled")
    refolds(h)
    if h.status == "succeeded":
        assert not any(s["status"] == "failed" and s["node"] == "m" for s in h.state["steps"].values())


# ------------------------------------------------------------------------------ agent loops

TOOLS = {"kb": {"action": "kb.search", "queue": "tools"}}


def _calls(n: int, turn: int = 1) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [{"id": f"c{turn}{i}", "name": "kb", "arguments": {}} for i in range(n)],
    }


def _loop_run(**node: Any) -> RunHarness:
    d = definition({"triage": triage_node(copy.deepcopy(TOOLS), **node)}, state={"triage": None})
    return RunHarness(d).start({"ticket": "t"})


@pytest.mark.parametrize("asked", [2, 3])
def test_max_tool_calls_is_exact(asked: int) -> None:
    """semantics.md, Agent loops: "if they would take the loop past `max_tool_calls` (all turns
    counted), the step fails `Limit`; otherwise every call starts at once". With a limit of 3, one
    call in turn 1 then `asked` in turn 2: 1 + 2 fits, 1 + 3 does not."""
    h = _loop_run(max_tool_calls=3).complete("triage", _calls(1), lineage="~1")
    h.complete("triage", {"r": 1}, lineage="~1.0").complete("triage", _calls(asked, 2), lineage="~2")
    if asked == 2:
        assert h.types.count("StepScheduled") == 2 and h.status == "running"
    else:
        assert h.status == "failed" and h.state["failure"]["code"] == "Limit"
        assert "StepScheduled" not in h.types
    refolds(h)


def test_max_turns_fails_after_the_last_turn_without_an_answer_and_receipts_are_fenced() -> None:
    """semantics.md, Agent loops: "After `max_turns` turns without an answer the step fails
    `Limit`"; Receipts: an exact duplicate of an applied receipt -> "duplicate receipt", a
    different one -> `ReceiptConflict` (the recorded outcome stays): a turn is never asked twice."""
    h = _loop_run(max_turns=2).complete("triage", _calls(1), lineage="~1")
    h.complete("triage", {"r": 1}, lineage="~1.0")
    h.complete("triage", {"r": 1}, lineage="~1.0")
    assert h.last.dropped == "duplicate receipt"
    h.complete("triage", {"r": 2}, lineage="~1.0")
    assert h.types == ["ReceiptConflict"] and h.step("triage", "~1.0")["output"] == {"r": 1}
    h.complete("triage", _calls(2), lineage="~1")  # turn 1 redelivered with other content
    assert h.types == ["ReceiptConflict"] and "triage[~1.1]" not in h.state["steps"]
    h.complete("triage", _calls(1, 2), lineage="~2").complete("triage", {"r": 3}, lineage="~2.0")
    assert h.status == "failed" and h.state["failure"]["code"] == "Limit"
    assert "triage[~3]" not in h.state["steps"]
    refolds(h)


def test_approvals_are_refused_unless_a_call_waits_and_a_pause_asks_again() -> None:
    """semantics.md, Agent loops: "payload `{approved: true|false, reason?}` (anything else is
    refused `Conflict`, and the call keeps waiting) ... denied, it is a `PermissionDenied` error
    result ...; no answer within `timeout_ms`, a `Timeout` one. The lowest waiting call ... takes a
    signal; one sent while no call waits is refused"."""
    tools = {"kb": {"action": "kb.search", "queue": "tools", "approval": {"signal": "ok", "timeout_ms": 500}}}
    d = definition(
        {"triage": triage_node(tools), "w": wait("other")},
        entry=["triage", "w"],
        state={"triage": None},
    )
    h = RunHarness(d).start({"ticket": "t"}).signal("ok", {"approved": True})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    h.complete("triage", _calls(2), lineage="~1", usage={"cost_micros": 5})
    assert h.status == "waiting"
    h.signal("ok", {"approved": "yes"})
    assert h.types == ["RunRejected"] and h.step("triage", "~1.0")["status"] == "waiting"
    h.signal("ok", {"approved": False, "reason": "no"})
    assert h.step("triage", "~1.0")["failure"]["code"] == "PermissionDenied"
    assert h.step("triage", "~1.1")["status"] == "waiting"
    h.complete("triage", None, lineage="~1")  # turn 1 redelivered differently: a conflict only
    assert h.types == ["ReceiptConflict"]
    h.signal("other", 1)  # lets the parallel wait settle; the loop still waits
    assert h.step("triage", "~1.1")["status"] == "waiting"
    h.fire("wait_timeout", "triage", "~1.1")
    assert h.step("triage", "~1.1")["failure"]["code"] == "Timeout"
    assert h.step("triage", "~2")["status"] == "scheduled"
    h.complete("triage", {"content": "", "answer": "done"}, lineage="~2")
    assert h.status == "succeeded" and h.state["state"]["triage"] == "done"
    refolds(h)
