"""Supersteps: snapshot reads, staged writes merged by reducers, routes, joins, maps, loops."""

from __future__ import annotations

from engine_harness import RunHarness, definition


def act(**extra: object) -> dict:
    return {"kind": "action", "action": "do", **extra}


def test_parallel_entry_nodes_read_the_same_snapshot_and_merge_in_order() -> None:
    d = definition(
        {"a": act(writes={"notes": {"from": "output"}}), "b": act(writes={"notes": {"from": "output"}})},
        entry=["a", "b"],
        state={"notes": []},
        reducers={"notes": "append"},
    )
    h = RunHarness(d).start({})
    assert [e["node"] for e in h.last.events if e["type"] == "StepScheduled"] == ["a", "b"]
    h.complete("b", "from-b")
    assert h.types == ["StepSucceeded"]  # staged: the barrier waits for a
    assert h.state["state"]["notes"] == []
    h.complete("a", "from-a")
    assert h.types == ["StepSucceeded", "SuperstepCommitted", "RunSucceeded"]
    assert h.state["state"]["notes"] == ["from-a", "from-b"]  # (node, lineage) order, not arrival


def test_reject_concurrent_conflict_fails_the_run_with_state_code() -> None:
    d = definition(
        {"a": act(writes={"x": {"from": "output"}}), "b": act(writes={"x": {"from": "output"}})},
        entry=["a", "b"],
        state={"x": None},
        reducers={"x": "reject_concurrent"},
    )
    h = RunHarness(d).start({}).complete("a", 1).complete("b", 2)
    assert h.types[-1] == "RunFailed"
    failure = h.state["failure"]
    assert (
        failure["code"] == "State"
        and "reject_concurrent" in failure["message"]
        and "a, b" in failure["message"]
    )


def test_all_matching_routes_are_followed_and_end_ends_a_branch() -> None:
    d = definition(
        {"a": act(), "b": act(), "c": act()},
        routes={"a": [{"to": "b", "when": "output.go"}, {"to": "c", "when": "output.go"}, {"to": "end"}]},
    )
    h = RunHarness(d).start({}).complete("a", {"go": True})
    assert h.state["frontier"] == ["b", "c"]
    h2 = RunHarness(d).start({}).complete("a", {"go": False})
    assert h2.types[-1] == "RunSucceeded"


def test_join_runs_a_node_once_when_several_route_to_it() -> None:
    d = definition(
        {"a": act(), "b": act(), "join": act()}, entry=["a", "b"], routes={"a": ["join"], "b": ["join"]}
    )
    h = RunHarness(d).start({}).complete("a", 1).complete("b", 2)
    scheduled = [e for e in h.last.events if e["type"] == "StepScheduled"]
    assert [e["node"] for e in scheduled] == ["join"]
    committed = next(e for e in h.last.events if e["type"] == "SuperstepCommitted")
    assert committed["next_frontier"] == ["join"]


def test_route_condition_error_fails_with_evaluation() -> None:
    d = definition(
        {"a": act(), "b": act()}, routes={"a": [{"to": "b", "when": "state.missing > 1"}]}, state={"x": 1}
    )
    h = RunHarness(d).start({}).complete("a", 1)
    assert h.types[-1] == "RunFailed" and h.state["failure"]["code"] == "Evaluation"


def test_routes_see_the_merged_state() -> None:
    d = definition(
        {"a": act(writes={"n": {"from": "output"}}), "b": act()},
        routes={"a": [{"to": "b", "when": "state.n > 1"}]},
        state={"n": 0},
    )
    assert RunHarness(d).start({}).complete("a", 2).state["frontier"] == ["b"]


def test_map_fan_out_collects_outputs_in_index_order_and_writes_per_item() -> None:
    d = definition(
        {
            "plan": act(writes={"queries": {"from": "output"}}),
            "search": act(
                map={"from": "state", "pointer": "/queries"},
                input={"q": {"from": "item"}},
                writes={"notes": {"from": "output"}},
            ),
            "write": act(input={"from": "state", "pointer": "/notes"}),
        },
        routes={"plan": ["search"], "search": ["write"]},
        state={"queries": [], "notes": []},
        reducers={"notes": "append"},
    )
    h = RunHarness(d).start({}).complete("plan", ["x", "y", "z"])
    scheduled = [e for e in h.last.events if e["type"] == "StepScheduled"]
    assert [(e["lineage"], e["input"]) for e in scheduled] == [
        ("0", {"q": "x"}),
        ("1", {"q": "y"}),
        ("2", {"q": "z"}),
    ]
    h.complete("search", "Z", lineage="2").complete("search", "X", lineage="0").complete(
        "search", "Y", lineage="1"
    )
    assert h.state["state"]["notes"] == ["X", "Y", "Z"]
    assert h.step("write")["input"] == ["X", "Y", "Z"]


def test_empty_map_settles_with_no_items() -> None:
    d = definition(
        {
            "search": act(map={"from": "input", "pointer": "/qs"}, writes={"n": {"from": "output"}}),
            "next": act(),
        },
        routes={"search": ["next"]},
        state={"n": None},
    )
    h = RunHarness(d).start({"qs": []})
    assert "SuperstepCommitted" in h.types and h.state["frontier"] == ["next"]


def test_map_source_not_an_array_fails_invalid_input() -> None:
    d = definition({"search": act(map={"from": "input", "pointer": "/qs"})})
    h = RunHarness(d).start({"qs": "nope"})
    assert h.types[-1] == "RunFailed"
    assert (
        h.state["failure"]["code"] == "InvalidInput"
        and "map source must be an array" in h.state["failure"]["message"]
    )


def test_map_items_all_run_even_when_one_fails_and_errors_aggregate() -> None:
    d = definition({"m": act(map={"from": "input", "pointer": "/qs"})})
    h = RunHarness(d).start({"qs": [1, 2, 3]}).fail("m", lineage="1", message="bad one")
    assert h.status == "running"  # the other items still run
    h.complete("m", "a", lineage="0").fail("m", lineage="2", message="bad two")
    assert h.types[-1] == "RunFailed"
    message = h.state["failure"]["message"]
    assert "2 of 3 map items of m failed" in message and "[1]" in message and "[2]" in message


def test_map_cardinality_checked_against_step_budget_before_dispatch() -> None:
    d = definition(
        {"plan": act(writes={"qs": {"from": "output"}}), "m": act(map={"from": "state", "pointer": "/qs"})},
        routes={"plan": ["m"]},
        state={"qs": []},
        budgets={"max_steps": 3},
    )
    h = RunHarness(d).start({}).complete("plan", [1, 2, 3])
    assert "StepScheduled" not in h.types
    assert h.types[-2:] == ["BudgetExhausted", "RunPaused"]
    assert h.state["pause"]["reason"] == "map cardinality exceeds remaining workflow step budget"
    h.resume({"max_steps": 10})
    assert h.types[0] == "RunResumed" and h.types.count("StepScheduled") == 3


def test_loop_bounded_by_max_steps_and_attempts_accumulate() -> None:
    d = definition(
        {"count": {"kind": "state", "mutations": [{"op": "increment", "target": "n", "value": 1}]}},
        routes={"count": [{"to": "count", "when": "state.n < 100"}]},
        state={"n": 0},
        budgets={"max_steps": 5},
    )
    h = RunHarness(d).start({})
    assert h.state["state"]["n"] == 5 and h.status == "paused"
    assert h.step("count")["attempt"] == 5  # each loop iteration is a new attempt (fresh dispatch id)


def test_state_node_mutations_and_required_and_output() -> None:
    d = definition(
        {
            "count": {
                "kind": "state",
                "mutations": [
                    {"op": "increment", "target": "count", "value": 1},
                    {"op": "set", "target": "label", "value": {"from": "input", "pointer": "/l"}},
                ],
            }
        },
        state={"count": 0, "label": None},
        required=["count"],
        reducers={"count": "reject_concurrent"},
        output={"from": "state", "pointer": "/count"},
    )
    h = RunHarness(d).start({"l": "hi"})
    assert h.types[-1] == "RunSucceeded" and h.state["output"] == 1 and h.state["state"]["label"] == "hi"


def test_required_key_null_fails_and_output_schema_checked() -> None:
    d = definition({"a": act()}, state={"brief": None}, required=["brief"])
    h = RunHarness(d).start({}).complete("a", 1)
    assert h.state["failure"]["code"] == "State" and "brief" in h.state["failure"]["message"]
    d2 = definition(
        {"a": act(writes={"brief": {"from": "output"}})},
        state={"brief": None},
        output={"from": "state", "pointer": "/brief"},
        output_schema={"type": "string"},
    )
    h2 = RunHarness(d2).start({}).complete("a", 42)
    assert h2.state["failure"]["code"] == "InvalidOutput" and "42" not in h2.state["failure"]["message"]
    assert RunHarness(d2).start({}).complete("a", "ok").state["output"] == "ok"


def test_max_concurrency_holds_back_activations_until_slots_free() -> None:
    d = definition(
        {
            "m": act(map={"from": "input", "pointer": "/qs"}, writes={"n": {"from": "output"}}),
            "w": {"kind": "wait", "signal": "s"},
        },
        entry=["m", "w"],
        state={"n": []},
        reducers={"n": "append"},
        budgets={"max_concurrency": 2},
    )
    h = RunHarness(d).start({"qs": [0, 1, 2, 3, 4]})
    scheduled = [e["lineage"] for e in h.last.events if e["type"] == "StepScheduled" and e["node"] == "m"]
    assert scheduled == ["0", "1"]  # the wait node takes no slot
    assert h.state["usage"]["steps"] == 3
    h.complete("m", "a", lineage="1")
    assert [(e["type"], e["lineage"]) for e in h.last.events] == [
        ("StepSucceeded", "1"),
        ("StepScheduled", "2"),
    ]
    h.complete("m", "b", lineage="0").complete("m", "c", lineage="2").complete("m", "d", lineage="3")
    assert h.state["maps"]["m"] == 5 and h.state["frontier"] == ["m", "w"]
    h.complete("m", "e", lineage="4").signal("s", 1)
    assert h.status == "succeeded" and h.state["state"]["n"] == ["b", "a", "c", "d", "e"]


def test_unconditional_route_after_a_taken_condition_is_the_else() -> None:
    d = definition(
        {"review": act(), "count": act()},
        routes={"review": [{"to": "end", "when": "output.approved"}, {"to": "count"}]},
    )
    assert RunHarness(d).start({}).complete("review", {"approved": True}).status == "succeeded"
    h = RunHarness(d).start({}).complete("review", {"approved": False})
    assert h.state["frontier"] == ["count"]
    fan = definition({"a": act(), "b": act(), "c": act()}, routes={"a": ["b", "c"]})
    assert RunHarness(fan).start({}).complete("a", 1).state["frontier"] == ["b", "c"]
