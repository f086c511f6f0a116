"""An agent loop end to end in the in-memory harness: the real agent executor code (run_agent_turn,
the transcript conversion, the attempt loop), real registered tool actions that count their own
executions, and the engine's folding, with the local provider following a script of tool calls."""

from __future__ import annotations

from collections import Counter
from typing import Any

from processors.executors.agents import AgentRequest, AgentResponse, ToolCall
from processors.testing import WorkflowEnvironment
from tests.agent_loop_definitions import SEARCH_SCHEMA, TRIAGE_SCHEMA, triage_definition


def definition(**node_extra: Any) -> dict[str, Any]:
    tools = {
        "kb_search": {
            "action": "kb.search",
            "description": "Search the knowledge base",
            "input_schema": SEARCH_SCHEMA,
        },
        "flaky": {"action": "flaky"},
    }
    return triage_definition("triage", tools, **{"output_schema": TRIAGE_SCHEMA, **node_extra})


class ScriptedModel:
    """A model that asks for the tools, reads their results, then answers."""

    def __init__(self) -> None:
        self.requests: list[AgentRequest] = []

    def __call__(self, request: AgentRequest) -> AgentResponse:
        self.requests.append(request)
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        if turn == 0:
            return AgentResponse(
                text="looking",
                tool_calls=(
                    ToolCall("a", "kb_search", {"query": "late order"}),
                    ToolCall("b", "flaky", {}),
                ),
            )
        results = [m for m in request.messages if m["role"] == "tool"]
        if turn == 1:
            assert [(r["tool_call_id"], r["is_error"]) for r in results] == [("a", False), ("b", True)]
            return AgentResponse(text="again", tool_calls=(ToolCall("c", "kb_search", {"query": "refund"}),))
        return AgentResponse(text='{"category": "billing"}')


def test_a_three_turn_loop_runs_each_tool_call_once_and_recovers_from_a_tool_failure() -> None:
    ran: Counter[str] = Counter()

    def kb_search(ctx: Any, args: dict[str, Any]) -> list[str]:
        ran[args["query"]] += 1
        return [f"article about {args['query']}"]

    def flaky(ctx: Any, args: Any) -> None:
        ran["flaky"] += 1
        raise RuntimeError("the tool broke")

    model = ScriptedModel()
    with WorkflowEnvironment(
        definition(), actions={"kb.search": kb_search, "flaky": flaky}, agents={"support": model}
    ) as env:
        result = env.run("triage", {"ticket": "where is my order"})
    result.assert_succeeded()
    assert result.state["triage"] == {"category": "billing"}
    assert ran == {"late order": 1, "flaky": 1, "refund": 1}
    assert len(model.requests) == 3
    assert [t.name for t in model.requests[0].tools] == ["flaky", "kb_search"]
    last = model.requests[2].messages
    assert any(m["role"] == "user" and "where is my order" in m["content"] for m in last)
    assert "article about refund" in last[-1]["content"]


def test_the_local_provider_calls_every_tool_once_then_answers_offline() -> None:
    ran: Counter[str] = Counter()

    def count(name: str) -> Any:
        def handler(ctx: Any, args: Any) -> str:
            ran[name] += 1
            return f"{name} done"

        return handler

    with WorkflowEnvironment(
        definition(), actions={"kb.search": count("kb"), "flaky": count("flaky")}
    ) as env:
        first = env.run("triage", {"ticket": "late"}, run_id="r-1")
        second = env.run("triage", {"ticket": "late"}, run_id="r-2")
    first.assert_succeeded()
    assert ran == {"kb": 2, "flaky": 2}
    assert first.state["triage"] == second.state["triage"]  # deterministic, offline


def test_max_turns_ends_a_model_that_never_answers() -> None:
    def stubborn(request: AgentRequest) -> AgentResponse:
        return AgentResponse(text="", tool_calls=(ToolCall("x", "kb_search", {"query": "again"}),))

    with WorkflowEnvironment(
        definition(max_turns=3),
        actions={"kb.search": lambda ctx, a: "r", "flaky": lambda ctx, a: None},
        agents={"support": stubborn},
    ) as env:
        result = env.run("triage", {"ticket": "t"})
    result.assert_step_failed("triage", code="Limit")
