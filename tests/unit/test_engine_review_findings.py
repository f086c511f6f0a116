"""Regressions for the outcomes an independent review found wrong (issue 18), one test or more each.

Every test here failed on the engine before its fix: they are written from the seeds' semantics
(seed 003 Map/FailFast, seed 004 receipt idempotency, seed 001/003 nesting depth, seed 003
skip_dependents and map aggregate codes) and docs/semantics.md, not from the code.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import RunHarness, definition

from processors.engine import Catalog, Ceilings, DefinitionError, dump_state
from processors.engine.ids import dispatch_id


def act(**extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": "do", **extra}


# ------------------------------------------------------------------ 1. fail_fast map


def _map_then_after(**map_extra: Any) -> dict[str, Any]:
    return definition(
        {
            "m": act(map={"from": "input", "pointer": "/items"}, input={"i": {"from": "item"}}, **map_extra),
            "after": act(),
        },
        entry=["m"],
        routes={"m": ["after"]},
    )


def test_fail_fast_map_whose_failed_item_is_not_the_last_to_settle_fails_the_run() -> None:
    h = RunHarness(_map_then_after()).start({"items": [0, 1]})
    h.fail("m", lineage="0", code="ExecutionFailed", message="item 0 broke")
    assert h.status == "running"  # item 1 still runs: every item of a map runs to completion
    h.complete("m", "ok", lineage="1")
    assert h.types[-1] == "RunFailed", h.types
    assert h.state["failure"]["node"] == "m"
    assert not any(e["type"] == "StepScheduled" and e["node"] == "after" for e in h.log)
    assert not any(e["type"] == "SuperstepCommitted" for e in h.log)


def test_fail_fast_map_settled_as_failed_cancels_siblings_still_in_flight() -> None:
    d = definition(
        {"m": act(map={"from": "input", "pointer": "/items"}), "other": act(), "after": act()},
        entry=["m", "other"],
        routes={"m": ["after"]},
    )
    h = RunHarness(d).start({"items": [0, 1]})
    h.fail("m", lineage="0").complete("m", "ok", lineage="1")
    assert h.types == ["StepSucceeded", "StepStopping", "RunCancelling"]  # `other` may still run
    h.stop_all()
    assert h.types == ["StepCancelled", "RunFailed"]
    assert h.step("other")["status"] == "cancelled"


def test_fail_fast_map_under_max_concurrency_runs_every_item_before_failing() -> None:
    d = _map_then_after()
    d["budgets"] = {"max_concurrency": 1}
    h = RunHarness(d).start({"items": [0, 1, 2]})
    h.fail("m", lineage="0")
    assert h.status == "running", h.types  # items 1 and 2 were held back, not yet run
    assert h.step("m", "1")["status"] == "scheduled"
    h.complete("m", "ok", lineage="1").complete("m", "ok", lineage="2")
    assert h.types[-1] == "RunFailed"


# ------------------------------------------------------------------ 2. redelivered final failure


def test_a_redelivered_final_retryable_failure_is_a_duplicate_not_a_conflict() -> None:
    d = definition({"a": act(retry={"max_attempts": 2}, on_failure="continue"), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({})
    h.fail("a", retryable=True, message="flaky").fire("retry_backoff", "a")
    h.fail("a", retryable=True, message="flaky")
    assert h.step("a")["failure"]["code"] == "RetryExhausted" and h.status == "running"
    before = dump_state(h.state)
    h.fail("a", retryable=True, message="flaky", attempt=2)
    assert h.last.events == [] and h.last.dropped == "duplicate receipt"
    assert dump_state(h.state) == before


def test_a_redelivered_failure_past_the_run_retry_budget_is_a_duplicate() -> None:
    d = definition(
        {"a": act(retry={"max_attempts": 5}, on_failure="continue"), "b": act()},
        entry=["a", "b"],
        budgets={"max_retries": 1},
    )
    h = RunHarness(d).start({}).fail("a", retryable=True, message="flaky").fire("retry_backoff", "a")
    h.fail("a", retryable=True, message="flaky")
    assert (
        h.step("a")["failure"]["code"] == "RetryExhausted" and "budget" in h.step("a")["failure"]["message"]
    )
    h.fail("a", retryable=True, message="flaky", attempt=2)
    assert h.last.events == [] and h.last.dropped == "duplicate receipt"


def test_redelivered_final_failure_on_a_continue_node_is_a_duplicate() -> None:
    d = definition({"a": act(retry={"max_attempts": 1}, on_failure="continue"), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).fail("a", retryable=True, message="flaky")
    assert h.step("a")["failure"]["code"] == "RetryExhausted" and h.status == "running"
    h.fail("a", retryable=True, message="flaky", attempt=1)
    assert h.last.events == [] and h.last.dropped == "duplicate receipt"


def test_a_different_receipt_for_a_retry_exhausted_attempt_is_still_a_conflict() -> None:
    d = definition({"a": act(retry={"max_attempts": 1}, on_failure="continue"), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).fail("a", retryable=True, message="flaky")
    h.fail("a", retryable=True, message="something else", attempt=1)
    assert h.types == ["ReceiptConflict"]


# ------------------------------------------------------------------ 3. nesting depth


def _nested(depth_limit: int | None, levels: int) -> list[dict[str, Any]]:
    """A chain root -> c1 -> ... -> c{levels}: `levels` nested levels below the root."""
    chain = []
    for level in range(levels, -1, -1):
        name = "root" if level == 0 else f"c{level}"
        if level == levels:
            nodes = {"a": act()}
        else:
            nodes = {"w": {"kind": "workflow", "workflow": f"c{level + 1}", "revision": 1}}
        extra: dict[str, Any] = {}
        if level == 0 and depth_limit is not None:
            extra["budgets"] = {"max_nesting_depth": depth_limit}
        chain.append(definition(nodes, id=name, **extra))
    return chain


@pytest.mark.parametrize(
    ("limit", "levels", "ok"),
    [
        (1, 0, True),
        (1, 1, False),
        (2, 1, True),
        (2, 2, False),
        (4, 3, True),
        (4, 4, False),
        (None, 3, True),
        (None, 4, False),
    ],
)
def test_preflight_counts_the_levels_of_the_whole_run_tree(limit: int | None, levels: int, ok: bool) -> None:
    catalog = Catalog()
    for raw in _nested(limit, levels):
        catalog.register(raw)
    if ok:
        catalog.pin_bundle("root", 1)
        return
    with pytest.raises(DefinitionError) as info:
        catalog.pin_bundle("root", 1)
    assert any(issue.rule == "nesting_depth" for issue in info.value.errors)


def _child_start(h: RunHarness, depth: int) -> dict[str, Any]:
    parent = {
        "parent_run_id": "p",
        "parent_node": "w",
        "parent_lineage": "",
        "parent_dispatch_id": "d",
        "root_run_id": "p",
        "depth": depth,
    }
    return {"type": "StartRun", "definition_id": h.root_id, "revision": 1, "input": {}, "parent": parent}


@pytest.mark.parametrize(("depth", "ok"), [(3, True), (4, False)])
def test_a_child_start_at_the_depth_limit_is_refused(depth: int, ok: bool) -> None:
    h = RunHarness(definition({"a": act()}, id="leaf", budgets={"max_nesting_depth": 4}))
    h.send(_child_start(h, depth))
    if ok:
        assert h.types[0] == "RunAccepted"
    else:
        assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "BudgetExceeded"
        assert "max_nesting_depth 4" in h.last.events[0]["reason"]


def test_a_child_start_whose_own_children_would_pass_the_limit_is_refused() -> None:
    defs = _nested(None, 1)  # c1 (a leaf) and root -> c1
    h = RunHarness(*defs[::-1])  # root first
    msg = _child_start(h, 3)  # root at depth 3 nests one level more: depth 4 reaches the limit 4
    h.send(msg)
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "BudgetExceeded"


def test_a_root_start_lowering_max_nesting_depth_below_its_tree_is_refused() -> None:
    defs = _nested(None, 2)
    h = RunHarness(*defs[::-1])
    h.start({}, budgets={"max_nesting_depth": 2})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "BudgetExceeded"
    h2 = RunHarness(*defs[::-1]).start({}, budgets={"max_nesting_depth": 3})
    assert h2.types[0] == "RunAccepted"


def test_preflight_and_start_agree_on_a_nested_definition_with_a_lower_limit_of_its_own() -> None:
    # c1 may nest nothing (its own limit 1) but nests c2: refused when the root pins the tree,
    # as the child's own start would refuse it.
    c2 = definition({"a": act()}, id="c2")
    c1 = definition(
        {"w": {"kind": "workflow", "workflow": "c2", "revision": 1}},
        id="c1",
        budgets={"max_nesting_depth": 1},
    )
    root = definition({"w": {"kind": "workflow", "workflow": "c1", "revision": 1}}, id="root")
    catalog = Catalog()
    for raw in (c2, c1, root):
        catalog.register(raw)
    with pytest.raises(DefinitionError) as info:
        catalog.pin_bundle("root", 1)
    assert any(issue.rule == "nesting_depth" for issue in info.value.errors)


# ------------------------------------------------------------------ 4. skip_dependents code


def test_skip_dependents_fails_the_run_dependency_skipped() -> None:
    d = definition({"a": act(on_failure="skip_dependents"), "b": act()}, routes={"a": ["b"]})
    h = RunHarness(d).start({}).fail("a", code="ExecutionFailed", message="a broke")
    assert h.types[-1] == "RunFailed"
    failure = h.state["failure"]
    assert failure["code"] == "DependencySkipped"
    assert failure["message"] == "a broke (dependents skipped)"
    assert failure["node"] == "a"


# ------------------------------------------------------------------ 5. map aggregate code


def test_map_aggregate_code_is_the_common_code_when_the_items_agree() -> None:
    h = RunHarness(_map_then_after()).start({"items": [0, 1, 2]})
    h.fail("m", lineage="0", code="PermissionDenied").complete("m", 1, lineage="1")
    h.fail("m", lineage="2", code="PermissionDenied")
    assert h.state["failure"]["code"] == "PermissionDenied"


def test_map_aggregate_code_is_execution_failed_when_the_items_differ() -> None:
    h = RunHarness(_map_then_after()).start({"items": [0, 1]})
    h.fail("m", lineage="0", code="PermissionDenied").fail("m", lineage="1", code="InvalidOutput")
    failure = h.state["failure"]
    assert failure["code"] == "ExecutionFailed"
    assert "[0] PermissionDenied" in failure["message"] and "[1] InvalidOutput" in failure["message"]


# ------------------------------------------------------------------ 6. JSON nesting ceiling


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for index in range(levels):
        value = {"k": value} if index % 2 else [value]
    return value


@pytest.mark.parametrize("levels", [65, 253, 300, 2000])
def test_a_deep_start_input_is_rejected_naming_the_path_and_the_limit(levels: int) -> None:
    h = RunHarness(definition({"a": act()})).start({"x": deep(levels)})
    assert h.types == ["RunRejected"]
    event = h.last.events[0]
    assert event["code"] == "InvalidInput"
    assert "max_json_depth 64" in event["reason"] and "input.x" in event["reason"]


def test_input_at_the_depth_limit_is_accepted() -> None:
    h = RunHarness(definition({"a": act()})).start(deep(63))  # the input object is level 1 of 64
    assert h.types[0] == "RunAccepted"
    dump_state(h.state)


def test_deep_labels_are_rejected() -> None:
    h = RunHarness(definition({"a": act()})).start({}, labels={"x": deep(80)})
    assert h.types == ["RunRejected"] and "labels" in h.last.events[0]["reason"]


@pytest.mark.parametrize("levels", [70, 260, 2000])
def test_a_deep_signal_payload_is_rejected_and_the_run_keeps_waiting(levels: int) -> None:
    d = definition({"w": {"kind": "wait", "signal": "go"}})
    h = RunHarness(d).start({})
    h.signal("go", {"p": deep(levels)})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "InvalidInput"
    assert "max_json_depth" in h.last.events[0]["reason"]
    assert h.status == "waiting"


@pytest.mark.parametrize("levels", [70, 260, 2000])
def test_a_deep_action_output_fails_the_attempt_invalid_output(levels: int) -> None:
    h = RunHarness(definition({"a": act()})).start({}).complete("a", deep(levels))
    assert h.step("a")["failure"]["code"] == "InvalidOutput"
    assert "max_json_depth" in h.step("a")["failure"]["message"]
    dump_state(h.state)


def test_a_deep_child_output_fails_the_attempt_invalid_output() -> None:
    child = definition({"a": act()}, id="child")
    parent = definition({"w": {"kind": "workflow", "workflow": "child", "revision": 1}}, id="parent")
    h = RunHarness(parent, child).start({}).child_finished("w", output=deep(300))
    assert h.step("w")["failure"]["code"] == "InvalidOutput"


def test_deep_usage_does_not_raise() -> None:
    h = RunHarness(definition({"a": act()})).start({})
    h.send(
        {
            "type": "ActivationCompleted",
            **h.ident("a"),
            "worker_id": "w1",
            "output": 1,
            "usage": {"prompt_tokens": deep(3000)},
        }
    )
    assert h.types[-1] == "RunSucceeded"


def test_a_definition_nested_deeper_than_the_limit_is_refused_at_registration() -> None:
    with pytest.raises(DefinitionError) as info:
        Catalog().register(definition({"a": act()}, state={"x": deep(100)}))
    assert any(issue.rule == "json_depth" for issue in info.value.errors)


def test_the_json_depth_ceiling_is_a_server_setting() -> None:
    ceilings = Ceilings(max_json_depth=8)
    h = RunHarness(definition({"a": act()}), ceilings=ceilings).start({"x": deep(8)})
    assert h.types == ["RunRejected"] and "max_json_depth 8" in h.last.events[0]["reason"]
    with pytest.raises(ValueError):
        Ceilings(max_json_depth=250)  # orjson refuses to serialize past 254 levels: states nest inputs


def test_decide_never_raises_on_deep_json_anywhere() -> None:
    d = definition({"w": {"kind": "wait", "signal": "go"}, "a": act()}, routes={"w": ["a"]})
    h = RunHarness(d)
    very = deep(5000)
    h.start({"x": very})
    h.start({})
    h.signal("go", very)
    h.send({"type": "CancelRun", "reason": "x"})
    h2 = RunHarness(d).start({})
    h2.send({"type": "ResumeRun", "budgets": {"max_steps": very}})
    h2.send({"type": "StartRun", "definition_id": "wf", "revision": None, "input": {}, "labels": very})
    h2.send({"type": "StartRun", "definition_id": "wf", "revision": None, "input": {}, "parent": very})
    h2.send({"type": "StartRun", "definition_id": "wf", "revision": None, "input": {}, "bundle": very})
    h2.send(
        {
            "type": "ActivationFailed",
            "node": "a",
            "lineage": "",
            "attempt": 1,
            "dispatch_id": dispatch_id("r-1", "a", "", 1),
            "worker_id": "w",
            "code": "X",
            "message": "m",
            "usage": very,
        }
    )


# ------------------------------------------------------------------ found by the generative test


def test_a_loop_through_an_empty_map_is_bounded_by_max_steps() -> None:
    # An empty map settles at once: without a step for it, a loop through it never ended inside
    # one decision (found by tests/unit/test_engine_generative.py: the process ran out of memory).
    d = definition(
        {"m": act(map={"from": "input", "pointer": "/items"})}, routes={"m": ["m"]}, budgets={"max_steps": 5}
    )
    h = RunHarness(d).start({"items": []})
    assert h.status == "paused" and h.state["usage"]["steps"] == 5
    assert h.types[-2:] == ["BudgetExhausted", "RunPaused"]
    assert h.step("m")["status"] == "succeeded" and h.step("m")["output"] == []
    assert h.refold() == dump_state(h.state)


def test_a_loop_through_a_failing_map_source_under_continue_is_bounded_by_max_steps() -> None:
    d = definition(
        {"m": act(map={"from": "input", "pointer": "/nope"}, on_failure="continue")},
        routes={"m": ["m"]},
        budgets={"max_steps": 3},
    )
    h = RunHarness(d).start({})
    assert h.status == "paused" and h.state["usage"]["steps"] == 3


def test_an_empty_map_is_one_step_and_its_value_is_the_empty_list() -> None:
    d = definition(
        {
            "m": act(map={"from": "input", "pointer": "/items"}, writes={"out": {"from": "output"}}),
            "b": act(),
        },
        routes={"m": [{"to": "b", "when": "size(output) == 0"}]},
        state={"out": None},
    )
    h = RunHarness(d).start({"items": []})
    assert h.state["frontier"] == ["b"] and h.state["usage"]["steps"] == 2
