"""Adversarial review of tool-using agent loops (pure engine and executor side).

Each test quotes the documented promise it checks (docs/semantics.md "Agent loops" / "Budgets",
docs/executors.md "Agent steps" / "Tool-using agents")."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from processors.engine import dump_state
from tests.agent_loop_definitions import SEARCH_SCHEMA, triage_node
from tests.unit.engine_harness import RunHarness, definition

TOOLS: dict[str, Any] = {
    "kb_search": {
        "action": "kb.search",
        "queue": "tools",
        "description": "Search the knowledge base",
        "input_schema": SEARCH_SCHEMA,
    },
    "refund": {"action": "billing.refund", "queue": "default"},
}


def agent_node(**extra: Any) -> dict[str, Any]:
    return triage_node(copy.deepcopy(TOOLS), **extra)


def harness(node: dict[str, Any] | None = None, **extra: Any) -> RunHarness:
    return RunHarness(definition({"triage": node or agent_node()}, state={"triage": None}, **extra))


def turn(h: RunHarness, number: int, output: Any, usage: dict[str, int] | None = None) -> RunHarness:
    lineage = f"~{number}"
    h.accept("triage", lineage)
    return h.complete("triage", output, lineage=lineage, usage=usage)


def calls(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [{"id": f"c{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(pairs)],
    }


def activations(h: RunHarness) -> list[dict[str, Any]]:
    return [m for m in h.messages if m["type"] == "ActionActivation"]


def test_tokens_exactly_at_the_limit_do_not_pause_the_loop() -> None:
    """semantics.md "Budgets": exhaustion is "tokens or cost above the limit"; "Agent loops":
    tokens and cost are checked after each turn. A turn that lands exactly on max_tokens must not
    pause the loop; the next turn runs."""
    h = harness(budgets={"max_tokens": 100}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})), usage={"prompt_tokens": 70, "completion_tokens": 30})
    assert h.status == "running"
    assert [a["lineage"] for a in activations(h)][-1] == "~1.0"
    h.accept("triage", "~1.0").complete("triage", "hit", lineage="~1.0")
    assert activations(h)[-1]["lineage"] == "~2"
    turn(h, 2, {"content": "", "answer": "ok"})
    assert h.status == "succeeded"


def test_cost_one_micro_over_the_limit_pauses_before_the_calls_and_resume_continues() -> None:
    """semantics.md "Agent loops": "tokens and cost after each turn. An exhausted budget pauses the
    run (BudgetExhausted, RunPaused) ... ResumeRun with more budget re-activates the step, which
    keeps its loop"."""
    h = harness(budgets={"max_cost_micros": 1000}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})), usage={"cost_micros": 1001})
    assert h.status == "paused"
    assert next(e for e in h.log if e["type"] == "BudgetExhausted")["dimension"] == "cost_micros"
    assert not [a for a in activations(h) if a["lineage"] == "~1.0"]
    h.resume(budgets={"max_cost_micros": 10_000})
    assert activations(h)[-1]["lineage"] == "~1.0"
    assert len([a for a in activations(h) if a["lineage"] == "~1"]) == 1
    assert h.state["usage"]["cost_micros"] == 1001  # not counted twice by the resume


def test_a_turn_failing_invalid_output_still_charges_its_tokens() -> None:
    """executors.md "Agent steps": structured output "... then InvalidOutput, not retryable.
    Usage is summed over every call and reported on success and on failure." The failed turn's
    tokens land in the run's ledger, once."""
    h = harness().start({"ticket": "t"})
    h.accept("triage", "~1")
    h.send(
        {
            "type": "ActivationFailed",
            **h.ident("triage", "~1"),
            "worker_id": "w1",
            "code": "InvalidOutput",
            "message": "agent output invalid after 3 attempt(s)",
            "retryable": False,
            "usage": {"prompt_tokens": 40, "completion_tokens": 9, "cost_micros": 12},
        }
    )
    assert h.status == "failed"
    assert h.step("triage")["failure"]["code"] == "InvalidOutput"
    ledger = h.state["usage"]
    assert (ledger["prompt_tokens"], ledger["completion_tokens"], ledger["cost_micros"]) == (40, 9, 12)
    assert h.refold() == dump_state(h.state)


def test_exactly_max_tool_calls_is_allowed() -> None:
    """semantics.md "Agent loops": the step fails Limit only if the calls "would take the loop
    past max_tool_calls"; reaching it exactly is allowed."""
    h = harness(agent_node(max_tool_calls=3)).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"})))
    h.accept("triage", "~1.0").complete("triage", 1, lineage="~1.0")
    turn(h, 2, calls(("kb_search", {"query": "b"}), ("kb_search", {"query": "c"})))
    assert h.status == "running"
    assert sorted(a["lineage"] for a in activations(h) if a["lineage"].startswith("~2.")) == ["~2.0", "~2.1"]


def approval_node(timeout_ms: int = 60_000, retry: dict[str, Any] | None = None) -> dict[str, Any]:
    node = agent_node()
    node["tools"]["refund"]["approval"] = {"signal": "ok", "timeout_ms": timeout_ms}
    if retry is not None:
        node["tools"]["refund"]["retry"] = retry
    return node


def test_approvals_go_to_the_lowest_waiting_call_in_instance_order_past_ten_calls() -> None:
    """semantics.md "Agent loops": "The lowest waiting call (in instance order) takes a signal".
    With 12 calls, call 2 is lower than call 10 (instance order, not text order)."""
    h = harness(approval_node()).start({"ticket": "t"})
    turn(h, 1, calls(*[("refund", {"order": i}) for i in range(12)]))
    assert all(h.step("triage", f"~1.{i}")["status"] == "waiting" for i in range(12))
    approved = []
    for _ in range(3):
        h.signal("ok", {"approved": True})
        approved.append(activations(h)[-1]["lineage"])
    assert approved == ["~1.0", "~1.1", "~1.2"]
    h.signal("ok", {"approved": False, "reason": "no"})
    assert h.step("triage", "~1.3")["status"] == "failed"
    assert h.step("triage", "~1.10")["status"] == "waiting"


def test_an_approved_call_retries_by_its_own_policy_without_asking_again() -> None:
    """semantics.md "Agent loops": "Approved, the call runs as its next attempt"; a call runs
    "the tool's action ... with the tool's retry". The approval wait is not one of the tool's
    retry attempts, and a retry is not asked for approval again."""
    h = harness(approval_node(retry={"max_attempts": 2})).start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 1})))
    h.signal("ok", {"approved": True})
    h.accept("triage", "~1.0").fail("triage", message="flaky", retryable=True, lineage="~1.0")
    assert h.step("triage", "~1.0")["status"] == "retry_wait"
    h.fire("retry_backoff", "triage", "~1.0")
    again = activations(h)[-1]
    assert (again["lineage"], again["action"], again["attempt"]) == ("~1.0", "billing.refund", 3)
    assert not [e for e in h.log if e["type"] == "RunWaiting" and e.get("lineage") == "~1.0"][1:]
    h.accept("triage", "~1.0").complete("triage", {"refunded": True}, lineage="~1.0")
    assert activations(h)[-1]["lineage"] == "~2"


def test_an_approval_timeout_on_one_call_leaves_the_other_approvable() -> None:
    """semantics.md "Agent loops": no answer within timeout_ms is a Timeout error result; the
    next waiting call still takes the next signal."""
    h = harness(approval_node(timeout_ms=5_000)).start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 1}), ("refund", {"order": 2})))
    h.fire("wait_timeout", "triage", "~1.0")
    assert h.step("triage", "~1.0")["failure"]["code"] == "Timeout"
    h.signal("ok", {"approved": True})
    assert activations(h)[-1]["lineage"] == "~1.1"


def test_structured_output_that_never_validates_in_a_tool_turn_reports_all_usage() -> None:
    """executors.md "Providers for tool-using agents": "An answer goes through the same
    structured-output loop as a plain agent step"; "Agent steps": "up to
    structured_output_attempts calls; then InvalidOutput, not retryable. Usage is summed over
    every call and reported on success and on failure"."""
    from processors.executors.agents.base import AgentResponse, AgentUsage
    from processors.executors.agents.structured import ProviderRouter
    from processors.executors.agents.tool_turn import run_agent_turn
    from processors.executors.errors import ActionError
    from processors.executors.secrets import SecretStore
    from processors.executors.settings import AgentsConfig

    class Stubborn:
        calls = 0

        async def complete(self, request: Any) -> AgentResponse:
            Stubborn.calls += 1
            return AgentResponse(text='{"category": "weather"}', usage=AgentUsage(10, 2, 3))

    router = ProviderRouter(AgentsConfig(), SecretStore({}))
    router.add("stubborn", Stubborn(), route="*")
    recorded: list[tuple[int, int, int]] = []

    class Ctx:
        capabilities: frozenset[str] = frozenset()
        idempotency_key = "d1"

        def check_cancelled(self) -> None:
            return None

        def remaining_ms(self) -> int | None:
            return None

        def usage(self, p: int, c: int, cost: int) -> None:
            recorded.append((p, c, cost))

    spec = {
        "agent": "a",
        "model": "m",
        "prompt": "t",
        "output_schema": {"type": "object", "properties": {"category": {"enum": ["bug"]}}},
        "structured_output_attempts": 3,
        "tools": [{"name": "kb", "description": "", "input_schema": {"type": "object"}}],
        "messages": [],
    }
    with pytest.raises(ActionError) as info:
        asyncio.run(run_agent_turn(Ctx(), spec, router))  # type: ignore[arg-type]
    assert info.value.code == "InvalidOutput" and not info.value.retryable
    assert Stubborn.calls == 3 and recorded == [(10, 2, 3)] * 3


def test_a_deadline_reached_exactly_cuts_the_provider_timeout_not_restores_it() -> None:
    """executors.md "Providers for tool-using agents": the request's "timeout is cut to the
    activation's remaining time". With 0 ms left (remaining_ms() == 0, so timeout_s == 0.0) the
    HTTP timeout must not go back to the provider's own 60 s."""
    from processors.executors.agents.http_json import timeout_for

    assert timeout_for(60.0, 2.5) == 2.5
    assert timeout_for(60.0, 0.0) <= 0.001


def _priced_completion(kind: str, served_model: str) -> int:
    """Cost of one completion of 1000 prompt + 1000 completion tokens, priced by a table keyed
    by the model the route names, from a server that reports a dated model id (as OpenAI's and
    Anthropic's do: "gpt-4o" is answered as "gpt-4o-2024-08-06")."""
    import httpx

    from processors.executors.agents.anthropic import AnthropicProvider
    from processors.executors.agents.base import AgentRequest
    from processors.executors.agents.openai_compat import OpenAICompatProvider

    def answer(request: httpx.Request) -> httpx.Response:
        if kind == "openai":
            body = {
                "model": served_model,
                "choices": [{"message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 1000},
            }
        else:
            body = {
                "model": served_model,
                "content": [{"type": "text", "text": "hi"}],
                "usage": {"input_tokens": 1000, "output_tokens": 1000},
            }
        return httpx.Response(200, json=body)

    prices = {"big": (3000, 15000)}
    provider: Any
    if kind == "openai":
        provider = OpenAICompatProvider("http://model.test/v1", model="big", prices=prices)
    else:
        provider = AnthropicProvider("http://model.test", model="big", prices=prices)
    provider._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))

    async def go() -> int:
        try:
            response = await provider.complete(AgentRequest("a", "big", [{"role": "user", "content": "q"}]))
        finally:
            await provider.aclose()
        return response.usage.cost_micros

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_price_keyed_by_the_configured_model_prices_a_dated_model_answer(kind: str) -> None:
    """executors.md "Agent steps": `prices` are "micros per 1000 prompt / completion tokens" per
    model ("Providers for tool-using agents": "Usage is prompt_tokens/completion_tokens ...,
    priced by prices"); semantics.md "Agent loops": cost is checked after each turn against the
    run's budget. A turn must not become free (and a max_cost_micros budget unenforceable)
    because the server names its model with a version suffix."""
    assert _priced_completion(kind, "big") == 18_000
    assert _priced_completion(kind, "big-2025-01-01") == 18_000


@pytest.mark.parametrize("raw", ["²", "8²"])
def test_a_port_setting_in_unicode_digits_is_one_clear_error(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README.md "Troubleshooting": "`runfold kafka up` fails: the message names the cause";
    a bad RUNFOLD_KAFKA_PORT is a LocalKafkaError naming the variable (the CLI prints it as one
    line), never a ValueError traceback."""
    from topology.local_kafka import LocalKafkaConfig, LocalKafkaError

    monkeypatch.setenv("RUNFOLD_KAFKA_PORT", raw)
    with pytest.raises(LocalKafkaError, match="RUNFOLD_KAFKA_PORT"):
        LocalKafkaConfig.from_env()


def test_a_step_budget_pauses_before_a_batch_of_calls_that_does_not_fit() -> None:
    """semantics.md "Agent loops": "a call one of max_steps (the step itself one); both are checked
    before the turn or the batch of calls is dispatched". max_steps 2: the step takes 1, a batch
    of 2 calls does not fit; nothing of it is dispatched, and a resume dispatches both."""
    h = harness(budgets={"max_steps": 2}).start({"ticket": "t"})
    turn(h, 1, calls(("kb_search", {"query": "a"}), ("kb_search", {"query": "b"})))
    assert h.status == "paused"
    assert not [a for a in activations(h) if "." in a["lineage"]]
    h.resume(budgets={"max_steps": 10})
    assert sorted(a["lineage"] for a in activations(h) if "." in a["lineage"]) == ["~1.0", "~1.1"]
    assert h.state["usage"]["steps"] == 3


def test_a_second_approval_for_an_already_approved_call_is_refused_and_runs_nothing() -> None:
    """semantics.md "Agent loops": "one sent while no call waits is refused, never kept for a later
    call". A second approval after the only waiting call was approved is refused (Conflict) and
    does not run the tool again, nor approve the next turn's call."""
    h = harness(approval_node()).start({"ticket": "t"})
    turn(h, 1, calls(("refund", {"order": 1})))
    h.signal("ok", {"approved": True})
    before = len(activations(h))
    h.signal("ok", {"approved": True})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert len(activations(h)) == before
    h.accept("triage", "~1.0").complete("triage", "done", lineage="~1.0")
    turn(h, 2, calls(("refund", {"order": 2})))
    assert h.step("triage", "~2.0")["status"] == "waiting"


def test_a_redelivered_turn_receipt_does_not_count_its_tokens_twice() -> None:
    """semantics.md "Agent loops": "a settled turn is never asked again"; the ledger records each
    turn's usage once (an executor's at-least-once receipt redelivery after a crash included)."""
    h = harness().start({"ticket": "t"})
    usage = {"prompt_tokens": 11, "completion_tokens": 4, "cost_micros": 7}
    turn(h, 1, calls(("kb_search", {"query": "a"})), usage=usage)
    h.complete("triage", calls(("kb_search", {"query": "a"})), lineage="~1", usage=usage)
    ledger = h.state["usage"]
    assert (ledger["prompt_tokens"], ledger["completion_tokens"], ledger["cost_micros"]) == (11, 4, 7)


def test_an_answer_that_overruns_the_token_budget_pauses_and_a_resume_does_not_ask_again() -> None:
    """semantics.md "Agent loops": tokens are checked after each turn; an exhausted budget pauses
    the run; on resume "settled ones are not" dispatched again: the answer already given is the
    step's output."""
    h = harness(budgets={"max_tokens": 100}).start({"ticket": "t"})
    turn(h, 1, {"content": "", "answer": "ok"}, usage={"prompt_tokens": 500})
    assert h.status == "paused"
    h.resume(budgets={"max_tokens": 1000})
    assert h.status == "succeeded" and h.state["state"]["triage"] == "ok"
    assert [a["lineage"] for a in activations(h)] == ["~1"]
