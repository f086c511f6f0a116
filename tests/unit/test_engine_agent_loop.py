"""The agent loop in the pure engine: model turns and tool calls as node instances of their own.

Each test drives a run through the harness (decide, evolve, effects as the runtime does) and
checks what was dispatched, what the model is sent, and how the step ends; every run is also
re-folded from its events to the same state bytes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from processors.engine import dump_state
from processors.engine.definition import Ceilings
from tests.agent_loop_definitions import SEARCH_SCHEMA, triage_node
from tests.unit.engine_harness import RunHarness, definition

TOOLS: dict[str, Any] = {
    "kb_search": {
        "action": "kb.search",
        "queue": "tools",
        "description": "Search the knowledge base",
        "input_schema": SEARCH_SCHEMA,
    },
    "refund": {"action": "billing.refund", "queue": "default", "capabilities": ["billing"]},
}


def agent_node(**extra: Any) -> dict[str, Any]:
    return triage_node(copy.deepcopy(TOOLS), **extra)


def harness(node: dict[str, Any] | None = None, **extra: Any) -> RunHarness:
    raw = definition({"triage": node or agent_node()}, state={"triage": None}, **extra)
    return RunHarness(raw)


def turn(h: RunHarness, number: int, output: Any, usage: dict[str, int] | None = None) -> RunHarness:
    lineage = f"~{number}"
    h.accept("triage", lineage)
    return h.complete("triage", output, lineage=lineage, usage=usage)


def calls(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [
            {"id": f"c{i}", "name": name, "arguments": args} for i, (name, args) in enumerate(pairs)
        ],
    }


def activations(h: RunHarness) -> list[dict[str, Any]]:
    return [m for m in h.messages if m["type"] == "ActionActivation"]


def test_three_turns_with_two_parallel_calls_then_an_answer() -> None:
    h = harness().start({"ticket": "my order is late"})
    first = activations(h)
    assert [(a["lineage"], a["kind"], a["queue"]) for a in first] == [("~1", "agent", "agents")]
    spec = first[0]["agent"]
    assert [t["name"] for t in spec["tools"]] == ["kb_search", "refund"]
    assert spec["messages"] == []
    assert h.step("triage")["status"] == "scheduled" and "loop" in h.step("triage")

    turn(h, 1, calls(("kb_search", {"query": "late order"}), ("refund", {"order": 7})))
    dispatched = activations(h)[1:]
    assert [(a["lineage"], a["action"], a["queue"], a["input"]) for a in dispatched] == [
        ("~1.0", "kb.search", "tools", {"query": "late order"}),
        ("~1.1", "billing.refund", "default", {"order": 7}),
    ]
    assert dispatched[1]["capabilities"] == ["billing"]
    assert dispatched[0]["dispatch_id"] != dispatched[1]["dispatch_id"]
    h.accept("triage", "~1.1").complete("triage", {"refunded": True}, lineage="~1.1")
    assert len(activations(h)) == 3  # the next turn waits for every call of this one
    h.accept("triage", "~1.0").complete("triage", ["kb article 12"], lineage="~1.0")
    second = activations(h)[3]
    assert second["lineage"] == "~2"
    assert second["agent"]["messages"] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": calls(("kb_search", {"query": "late order"}), ("refund", {"order": 7}))[
                "tool_calls"
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c0",
            "name": "kb_search",
            "content": '["kb article 12"]',
            "is_error": False,
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "refund",
            "content": '{"refunded":true}',
            "is_error": False,
        },
    ]
    turn(h, 2, calls(("kb_search", {"query": "refund policy"})))
    h.accept("triage", "~2.0").complete("triage", "policy text", lineage="~2.0")
    turn(
        h,
        3,
        {"content": "done", "answer": {"category": "billing"}},
        usage={"prompt_tokens": 5, "completion_tokens": 2},
    )
    assert h.status == "succeeded"
    assert h.state["state"]["triage"] == {"category": "billing"}
    assert h.state["usage"]["agents"] == 3  # three model turns
    assert h.state["usage"]["steps"] == 4  # the step and its three tool calls
    assert h.state["usage"]["prompt_tokens"] == 5
    assert h.refold() == dump_state(h.state)


def test_a_failed_tool_goes_back_to_the_model_as_an_error_result() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "x"})))
    h.accept("triage", "~1.0").fail("triage", code="ExecutionFailed", message="index offline", lineage="~1.0")
    assert h.status == "running"
    messages = activations(h)[-1]["agent"]["messages"]
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "kb_search",
        "content": "error ExecutionFailed: index offline",
        "is_error": True,
    }
    turn(h, 2, {"content": "recovered", "answer": "fine"})
    assert h.status == "succeeded" and h.state["state"]["triage"] == "fine"


@pytest.mark.parametrize(
    ("call", "code", "words"),
    [
        (("shell", {"cmd": "rm"}), "UnknownReference", "there is no tool 'shell'"),
        (("kb_search", {"q": 1}), "InvalidInput", "missing 'query'"),
        (("kb_search", "not an object"), "InvalidInput", "must be a JSON object"),
        (("kb_search", {"query": 3}), "InvalidInput", "expected string"),
    ],
)
def test_calls_that_cannot_run_are_error_results_without_an_activation(
    call: tuple[str, Any], code: str, words: str
) -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(call))
    assert [a["lineage"] for a in activations(h)] == ["~1", "~2"]  # no tool activation, the next turn
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert result["is_error"] is True and result["content"].startswith(f"error {code}:")
    assert words in result["content"]
    assert h.step("triage", "~1.0")["status"] == "failed"


def test_max_turns_exhausted_fails_the_step_with_limit() -> None:
    h = harness(agent_node(max_turns=2)).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", 1, lineage="~1.0")
    turn(h, 2, calls(("kb_search", {"query": "b"})))
    h.accept("triage", "~2.0").complete("triage", 2, lineage="~2.0")
    assert h.status == "failed"
    assert h.state["failure"]["code"] == "Limit"
    assert "max_turns" in h.step("triage")["failure"]["message"]
    assert not [a for a in activations(h) if a["lineage"] == "~3"]


def test_max_tool_calls_counts_across_turns() -> None:
    h = harness(agent_node(max_tool_calls=2)).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", 1, lineage="~1.0")
    turn(h, 2, calls(("kb_search", {"query": "b"}), ("kb_search", {"query": "c"})))
    assert h.status == "failed"
    assert "max_tool_calls 2 leaves 1" in h.step("triage")["failure"]["message"]


def test_a_turn_that_fails_after_its_retries_fails_the_step() -> None:
    h = harness(agent_node(retry={"max_attempts": 2})).start({"ticket": "t"})
    h.accept("triage", "~1").fail(
        "triage", code="ExecutionFailed", message="429", retryable=True, lineage="~1"
    )
    assert h.step("triage", "~1")["status"] == "retry_wait"
    h.fire("retry_backoff", "triage", "~1")
    assert activations(h)[-1]["lineage"] == "~1" and activations(h)[-1]["attempt"] == 2
    h.accept("triage", "~1").fail(
        "triage", code="ExecutionFailed", message="429", retryable=True, lineage="~1"
    )
    assert h.status == "failed"
    assert h.step("triage")["failure"]["code"] == "RetryExhausted"


def test_a_tool_retries_by_its_own_policy_then_returns_the_error() -> None:
    node = agent_node()
    node["tools"]["kb_search"]["retry"] = {"max_attempts": 2}
    h = harness(node).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").fail("triage", message="flaky", retryable=True, lineage="~1.0")
    h.fire("retry_backoff", "triage", "~1.0")
    again = activations(h)[-1]
    assert (again["lineage"], again["attempt"], again["action"], again["queue"]) == (
        "~1.0",
        2,
        "kb.search",
        "tools",
    )
    h.accept("triage", "~1.0").fail("triage", message="flaky", retryable=True, lineage="~1.0")
    last = activations(h)[-1]["agent"]["messages"][-1]
    assert last["is_error"] and "RetryExhausted" in last["content"]


def test_the_answer_is_checked_against_the_output_schema() -> None:
    schema = {
        "type": "object",
        "required": ["category"],
        "properties": {"category": {"enum": ["billing", "bug"]}},
    }
    h = harness(agent_node(output_schema=schema)).start({"ticket": "t"})
    turn(h, 1, {"content": "", "answer": {"category": "weather"}})
    assert h.status == "failed"
    assert h.step("triage")["failure"]["code"] == "InvalidOutput"


def test_a_malformed_turn_output_fails_the_step() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, {"tool_calls": [{"name": 3}]})
    assert h.status == "failed" and "tool_calls[0]" in h.step("triage")["failure"]["message"]


def test_a_token_budget_pauses_before_the_next_turn_and_resume_continues_the_loop() -> None:
    h = harness(budgets={"max_tokens": 100}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})), usage={"prompt_tokens": 80, "completion_tokens": 30})
    assert h.status == "paused"
    assert h.state["pause"]["code"] == "BudgetExceeded"
    assert not [a for a in activations(h) if a["lineage"] == "~1.0"]  # the calls wait for the resume
    h.resume(budgets={"max_tokens": 1000})
    assert activations(h)[-1]["lineage"] == "~1.0"  # the same loop goes on: turn 1 is not paid again
    h.accept("triage", "~1.0").complete("triage", "hit", lineage="~1.0")
    assert activations(h)[-1]["lineage"] == "~2"
    turn(h, 2, {"content": "", "answer": "ok"}, usage={"prompt_tokens": 10})
    assert h.status == "succeeded"
    turns = [a for a in activations(h) if a["lineage"] == "~1"]
    assert len(turns) == 1


def test_an_agent_budget_pauses_before_a_turn() -> None:
    h = harness(budgets={"max_agents": 1}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", "hit", lineage="~1.0")
    assert h.status == "paused"
    h.resume(budgets={"max_agents": 5})
    assert activations(h)[-1]["lineage"] == "~2"


def test_a_pause_while_calls_run_stops_them_and_resume_dispatches_them_again() -> None:
    h = harness(budgets={"max_tokens": 100}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"}), ("refund", {})))
    h.accept("triage", "~1.0").complete("triage", "one", lineage="~1.0", usage={"prompt_tokens": 500})
    assert h.status == "cancelling"  # the other call is asked to stop first
    h.stop_all()
    assert h.status == "paused"
    h.resume(budgets={"max_tokens": 10_000})
    again = activations(h)[-1]
    assert (again["lineage"], again["attempt"]) == ("~1.1", 2)
    assert len([a for a in activations(h) if a["lineage"] == "~1.0"]) == 1  # the settled call is not re-run
    h.accept("triage", "~1.1").complete("triage", "two", lineage="~1.1")
    assert activations(h)[-1]["lineage"] == "~2"


def test_cancel_mid_loop_stops_the_tools_in_flight() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"}), ("refund", {})))
    h.accept("triage", "~1.0")
    h.cancel("user asked")
    assert h.status == "cancelling"
    cancels = sorted(m["lineage"] for m in h.messages if m["type"] == "CancelActivation")
    assert cancels == ["~1.0", "~1.1"]  # the tool calls, not the loop's step (never dispatched)
    h.stop_all()
    assert h.status == "cancelled"
    stops = h.log[-1]["stops"]
    assert sorted(s["lineage"] for s in stops) == ["~1.0", "~1.1"]
    # a late result of a stopped call changes nothing
    h.complete("triage", "late", lineage="~1.0")
    assert h.status == "cancelled" and h.last.events == []


def test_a_late_duplicate_receipt_of_a_turn_dispatches_nothing_twice() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    before = len(activations(h))
    h.complete("triage", calls(("kb_search", {"query": "a"})), lineage="~1")
    assert len(activations(h)) == before and h.last.dropped == "duplicate receipt"


def test_a_mapped_agent_runs_one_loop_per_item() -> None:
    node = agent_node(
        map={"from": "input", "pointer": "/tickets"},
        prompt={"from": "item"},
        writes={"triage": {"from": "output"}},
    )
    h = RunHarness(definition({"triage": node}, state={"triage": []}, reducers={"triage": "append"}))
    h.start({"tickets": ["a", "b"]})
    assert sorted(a["lineage"] for a in activations(h)) == ["0~1", "1~1"]
    assert [a["agent"]["prompt"] for a in activations(h)] == ["a", "b"]
    for item in ("0", "1"):
        h.accept("triage", f"{item}~1").complete(
            "triage", calls(("kb_search", {"query": item})), lineage=f"{item}~1"
        )
    assert sorted(a["lineage"] for a in activations(h)[2:]) == ["0~1.0", "1~1.0"]
    for item in ("0", "1"):
        h.accept("triage", f"{item}~1.0").complete("triage", "hit", lineage=f"{item}~1.0")
        h.accept("triage", f"{item}~2").complete("triage", {"answer": item}, lineage=f"{item}~2")
    assert h.status == "succeeded"
    assert h.state["state"]["triage"] == ["0", "1"]


def test_a_huge_tool_result_is_cut_in_the_transcript() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", "x" * 100_000, lineage="~1.0")
    content = activations(h)[-1]["agent"]["messages"][-1]["content"]
    assert len(content) < 8_100 and content.endswith("(cut: 100000 characters in all)")


def test_a_transcript_over_the_state_bound_fails_the_step() -> None:
    ceilings = Ceilings(max_state_bytes=30_000)
    h = RunHarness(definition({"triage": agent_node()}, state={"triage": None}), ceilings=ceilings)
    h.start({"ticket": "t"})
    for number in range(1, 6):
        turn(h, number, calls(("kb_search", {"query": "a"})))
        if h.status != "running":
            break
        h.accept("triage", f"~{number}.0").complete("triage", "y" * 9_000, lineage=f"~{number}.0")
        if h.status != "running":
            break
    assert h.status == "failed"
    assert "transcript" in h.step("triage")["failure"]["message"]


def test_a_graph_loop_back_to_the_agent_gets_fresh_dispatch_identities() -> None:
    raw = definition(
        {
            "triage": agent_node(writes={"count": {"from": "literal", "value": 1}}),
            "again": {"kind": "state", "mutations": [{"op": "increment", "target": "rounds", "value": 1}]},
        },
        routes={"triage": [{"to": "again"}], "again": [{"to": "triage", "when": "state.rounds < 2"}]},
        state={"count": 0, "rounds": 0},
    )
    h = RunHarness(raw).start({"ticket": "t"})
    turn(h, 1, {"answer": 1})
    second = activations(h)[-1]
    assert second["lineage"] == "~1" and second["attempt"] == 2  # a new superstep, a new attempt
    assert second["agent"]["messages"] == []  # a fresh loop, not the last one's transcript
    h.accept("triage", "~1").complete("triage", {"answer": 2}, lineage="~1")
    assert h.status == "succeeded"


def approval_harness(timeout_ms: int | None = 60_000) -> RunHarness:
    node = agent_node()
    node["tools"]["refund"]["approval"] = {
        "signal": "refund-approval",
        **({"timeout_ms": timeout_ms} if timeout_ms else {}),
    }
    return harness(node)


def test_a_tool_with_approval_waits_for_the_signal_then_runs() -> None:
    h = approval_harness().start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7}), ("kb_search", {"query": "a"})))
    assert [a["lineage"] for a in activations(h)] == ["~1", "~1.1"]  # the refund waits, the search runs
    h.accept("triage", "~1.1").complete("triage", "hit", lineage="~1.1")
    assert h.status == "waiting" and h.step("triage", "~1.0")["status"] == "waiting"
    assert "wait_timeout" in {t["timer_kind"] for t in h.timers.values()}
    h.signal("refund-approval", {"approved": True})
    refund = activations(h)[-1]
    assert (refund["lineage"], refund["attempt"], refund["action"]) == ("~1.0", 2, "billing.refund")
    assert "wait_timeout" not in {t["timer_kind"] for t in h.timers.values()}
    h.accept("triage", "~1.0").complete("triage", {"refunded": True}, lineage="~1.0")
    assert activations(h)[-1]["lineage"] == "~2"
    turn(h, 2, {"answer": "done"})
    assert h.status == "succeeded"
    assert h.refold() == dump_state(h.state)


def test_a_denied_call_goes_back_to_the_model_as_a_refusal() -> None:
    h = approval_harness().start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7})))
    h.signal("refund-approval", {"approved": False, "reason": "over the limit"})
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert (
        result["is_error"]
        and result["content"] == "error PermissionDenied: the call was denied: over the limit"
    )
    assert not [a for a in activations(h) if a["action"] == "billing.refund"]


def test_an_unanswered_approval_times_out_as_an_error_result() -> None:
    h = approval_harness(timeout_ms=5_000).start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7})))
    h.fire("wait_timeout", "triage", "~1.0")
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert result["is_error"] and "Timeout" in result["content"] and "refund-approval" in result["content"]


@pytest.mark.parametrize("payload", [None, {"approved": "yes"}, {"ok": True}, [True]])
def test_an_approval_must_say_approved_true_or_false(payload: Any) -> None:
    h = approval_harness().start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7})))
    h.signal("refund-approval", payload)
    assert h.types == ["RunRejected"] and "approved" in h.last.events[0]["reason"]
    assert h.step("triage", "~1.0")["status"] == "waiting"


def test_an_approval_before_any_call_waits_is_refused_not_kept() -> None:
    h = approval_harness().start({"ticket": "t"})
    h.signal("refund-approval", {"approved": True})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    turn(h, 1, calls(("refund", {"order": 7})))
    assert h.step("triage", "~1.0")["status"] == "waiting"  # the early approval did not approve it


def test_a_cancel_while_a_call_waits_for_approval_cancels_at_once() -> None:
    h = approval_harness().start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7})))
    h.cancel("no")
    assert h.status == "cancelled"


def test_an_approval_signal_may_not_be_a_wait_nodes_signal() -> None:
    from processors.engine import DefinitionError

    node = agent_node()
    node["tools"]["refund"]["approval"] = {"signal": "go"}
    raw = definition(
        {"triage": node, "hold": {"kind": "wait", "signal": "go"}},
        state={"triage": None},
        entry=["triage", "hold"],
    )
    with pytest.raises(DefinitionError, match="approval signal must be a name of its own"):
        RunHarness(raw)


def test_a_pause_while_a_call_waits_for_approval_asks_again_after_the_resume() -> None:
    node = agent_node()
    node["tools"]["refund"]["approval"] = {"signal": "refund-approval"}
    h = harness(node, budgets={"max_tokens": 100}).start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 7}), ("kb_search", {"query": "a"})))
    h.accept("triage", "~1.1").complete("triage", "hit", lineage="~1.1", usage={"prompt_tokens": 500})
    assert h.status == "paused" and h.step("triage", "~1.0")["status"] == "cancelled"
    h.resume(budgets={"max_tokens": 10_000})
    assert h.status == "waiting" and h.step("triage", "~1.0")["attempt"] == 2
    h.signal("refund-approval", {"approved": True})
    assert activations(h)[-1]["lineage"] == "~1.0" and activations(h)[-1]["attempt"] == 3


ESCALATION = definition(
    {"hand_over": {"kind": "action", "action": "escalate", "writes": {"ticket": {"from": "output"}}}},
    id="escalation",
    state={"ticket": None},
)


def workflow_tool_harness() -> RunHarness:
    node = agent_node()
    node["tools"]["escalate"] = {
        "workflow": "escalation",
        "revision": 1,
        "description": "Hand to a human team",
    }
    return RunHarness(ESCALATION, definition({"triage": node}, state={"triage": None}))


def test_a_workflow_tool_runs_a_child_run_and_its_output_goes_back_to_the_model() -> None:
    h = workflow_tool_harness()
    h.root_id = "wf"
    h.start({"ticket": "t"})
    turn(h, 1, calls(("escalate", {"priority": "high"})))
    child = [m for m in h.messages if m["type"] == "ChildRunActivation"]
    assert len(child) == 1
    assert (child[0]["child_run_id"], child[0]["definition_id"], child[0]["input"]) == (
        "r-1/triage[~1.0]",
        "escalation",
        {"priority": "high"},
    )
    assert child[0]["parent"]["parent_lineage"] == "~1.0"
    h.child_finished("triage", output={"ticket": "T-9"}, lineage="~1.0")
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert result == {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "escalate",
        "content": '{"ticket":"T-9"}',
        "is_error": False,
    }


def test_a_failed_child_run_is_an_error_result_and_a_cancel_stops_a_running_child() -> None:
    h = workflow_tool_harness()
    h.root_id = "wf"
    h.start({"ticket": "t"})
    turn(h, 1, calls(("escalate", {})))
    h.child_finished("triage", status="failed", lineage="~1.0")
    assert activations(h)[-1]["agent"]["messages"][-1]["content"].startswith("error ChildFailed:")
    turn(h, 2, calls(("escalate", {})))
    h.cancel("stop")
    assert h.status == "cancelling"
    assert [m["child_run_id"] for m in h.messages if m["type"] == "ChildRunCancel"] == ["r-1/triage[~2.0]"]
    h.child_finished("triage", status="cancelled", lineage="~2.0")
    assert h.status == "cancelled"


def test_a_workflow_tool_must_name_a_registered_child_and_only_one_kind() -> None:
    from processors.engine import DefinitionError

    node = agent_node()
    node["tools"]["escalate"] = {"workflow": "nowhere", "revision": 1}
    h = RunHarness(definition({"triage": node}, state={"triage": None}))
    h.start({"ticket": "t"})
    assert h.types == ["RunRejected"] and "unknown child workflow nowhere@1" in h.last.events[0]["reason"]
    both = agent_node()
    both["tools"]["escalate"] = {"workflow": "escalation", "revision": 1, "action": "x"}
    with pytest.raises(DefinitionError, match="exactly one"):
        RunHarness(ESCALATION, definition({"triage": both}, state={"triage": None}))


def test_a_policy_refusal_of_a_tool_is_an_error_result_the_model_can_recover_from() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 1})))
    h.accept("triage", "~1.0").fail(
        "triage", code="PermissionDenied", message="secret billing not granted", lineage="~1.0"
    )
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert result["is_error"] and result["content"] == "error PermissionDenied: secret billing not granted"
    turn(h, 2, {"answer": "escalated instead"})
    assert h.status == "succeeded"


def test_a_secret_in_a_tool_result_never_reaches_the_model_or_the_events() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "keys"})))
    canary = "sk-live-CANARY0123456789abcdef0123456789"
    h.accept("triage", "~1.0").complete("triage", {"api_key": canary}, lineage="~1.0")
    result = activations(h)[-1]["agent"]["messages"][-1]
    assert result["is_error"] and "secret material" in result["content"]
    import orjson

    assert canary.encode() not in orjson.dumps([h.log, h.messages, h.state])


def test_a_resume_after_a_failed_turn_asks_the_model_again() -> None:
    h = harness().start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", "hit", lineage="~1.0")
    h.accept("triage", "~2").fail("triage", code="ExecutionFailed", message="provider down", lineage="~2")
    assert h.status == "failed"
    h.resume()
    again = activations(h)[-1]
    assert (again["lineage"], again["attempt"]) == ("~2", 2)  # turn 1 and its call are not asked again
    assert len(again["agent"]["messages"]) == 2
    turn(h, 2, {"answer": "fine"})
    assert h.status == "succeeded" and h.refold() == dump_state(h.state)


def test_a_resume_after_max_turns_fails_the_same_way() -> None:
    h = harness(agent_node(max_turns=1)).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", "hit", lineage="~1.0")
    assert h.status == "failed"
    before = len(activations(h))
    h.resume()
    assert h.status == "failed" and len(activations(h)) == before
