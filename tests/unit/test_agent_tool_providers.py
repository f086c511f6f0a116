"""Tool-using agent turns without a broker: the OpenAI-compatible and Anthropic providers against
a real local HTTP stand-in (tests/agent_stand_in.py), the local provider's script, and
run_agent_turn end to end."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
import time
from typing import Any

import pytest
from agent_stand_in import Answer, Call, Raw, StandIn
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from leaks import leaks

from processors.executors import ActionError, AgentsConfig, ProviderConfig, SecretStore
from processors.executors.agents import (
    AgentRequest,
    AgentResponse,
    AnthropicProvider,
    LocalProvider,
    OpenAICompatProvider,
    ProviderRouter,
    ToolCall,
    ToolSpec,
    run_agent_turn,
)
from processors.executors.agents.anthropic import wire_messages as anthropic_wire
from processors.executors.agents.structured import prompt_messages
from processors.executors.context import ActionContext
from processors.executors.errors import Cancelled
from processors.executors.secrets import SecretResolver

CANARY = "sk-canary-7f3a91c2d4e5b6a8"
KINDS = ["openai", "anthropic"]

SEARCH = ToolSpec(
    "search",
    "Search the docs",
    {"type": "object", "required": ["q"], "properties": {"q": {"type": "string", "minLength": 1}}},
)
FETCH = ToolSpec(
    "fetch",
    "Fetch a page",
    {
        "type": "object",
        "required": ["url", "max_bytes"],
        "properties": {
            "url": {"type": "string", "format": "uri"},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "additionalProperties": False,
    },
)
TOOLS = (SEARCH, FETCH)
TOOL_DICTS = [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in TOOLS]

PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "find kafka docs"},
]
# a transcript after one tool-call turn: two parallel calls, one result an error
AFTER_TOOLS: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "c1", "name": "search", "arguments": {"q": "kafka"}},
            {"id": "c2", "name": "fetch", "arguments": {"url": "https://x.test/é", "max_bytes": 5}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "3 hits ✓", "is_error": False},
    {"role": "tool", "tool_call_id": "c2", "name": "fetch", "content": "HTTP 404", "is_error": True},
]


def _provider(kind: str, server: StandIn, **kw: Any) -> Any:
    if kind == "openai":
        return OpenAICompatProvider(server.base_url + "/v1", api_key=CANARY, **kw)
    return AnthropicProvider(server.base_url, api_key=CANARY, **kw)


def _complete(provider: Any, request: AgentRequest) -> AgentResponse:
    async def go() -> AgentResponse:
        try:
            result: AgentResponse = await provider.complete(request)
            return result
        finally:
            await provider.aclose()

    return asyncio.run(go())


def _request(messages: list[dict[str, Any]], **kw: Any) -> AgentRequest:
    return AgentRequest("researcher", "m1", messages, tools=TOOLS, idempotency_key="disp-1", **kw)


def _no_canary(*things: Any) -> None:
    for thing in things:
        text = thing if isinstance(thing, str) else repr(thing)
        assert leaks(text, CANARY) == [], text


# ---------------------------------------------------------------- a tool-call turn


@pytest.mark.parametrize("kind", KINDS)
def test_two_parallel_tool_calls_are_parsed_and_the_tools_are_on_the_wire(kind: str) -> None:
    reply = Answer(
        text="Let me look." if kind == "anthropic" else None,  # OpenAI: content null beside tool calls
        tool_calls=[Call("c1", "search", {"q": "kafka"}), Call("c2", "fetch", {"url": "u", "max_bytes": 9})],
        prompt_tokens=1200,
        completion_tokens=300,
    )
    with StandIn([reply]) as server:
        response = _complete(_provider(kind, server, prices={"*": (1000, 2000)}), _request(PROMPT))
    assert response.tool_calls == (
        ToolCall("c1", "search", {"q": "kafka"}),
        ToolCall("c2", "fetch", {"url": "u", "max_bytes": 9}),
    )
    assert response.text == ("Let me look." if kind == "anthropic" else "")
    # 1200 * 1000 / 1000 + 300 * 2000 / 1000 micros
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (1200, 300)
    assert response.usage.cost_micros == 1800
    (seen,) = server.requests
    assert seen.headers["idempotency-key"] == "disp-1"
    assert seen.headers["content-type"] == "application/json"
    if kind == "openai":
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {CANARY}"
        assert seen.body == {
            "model": "m1",
            "messages": PROMPT,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }
                for t in TOOLS
            ],
        }
    else:
        assert seen.path == "/v1/messages"
        assert seen.headers["x-api-key"] == CANARY and "authorization" not in seen.headers
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.body == {
            "model": "m1",
            "max_tokens": 4096,
            "system": "be brief",
            "messages": [{"role": "user", "content": "find kafka docs"}],
            "tools": TOOL_DICTS,
        }
    _no_canary(response)


# ---------------------------------------------------------------- the follow-up turn on the wire


def test_openai_follow_up_turn_converts_tool_calls_and_results_exactly() -> None:
    with StandIn([Answer(text="done")]) as server:
        response = _complete(_provider("openai", server), _request(PROMPT + AFTER_TOOLS))
    assert response.text == "done" and response.tool_calls == ()
    assert server.requests[0].body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "find kafka docs"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q":"kafka"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "fetch", "arguments": '{"url":"https://x.test/é","max_bytes":5}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3 hits ✓"},
        {"role": "tool", "tool_call_id": "c2", "content": "HTTP 404"},
    ]


def test_anthropic_follow_up_turn_converts_tool_calls_and_results_exactly() -> None:
    with StandIn([Answer(text="done")]) as server:
        response = _complete(_provider("anthropic", server, max_tokens=77), _request(PROMPT + AFTER_TOOLS))
    assert response.text == "done" and response.tool_calls == ()
    body = server.requests[0].body
    assert body["system"] == "be brief" and body["max_tokens"] == 77
    assert body["messages"] == [
        {"role": "user", "content": "find kafka docs"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "search", "input": {"q": "kafka"}},
                {
                    "type": "tool_use",
                    "id": "c2",
                    "name": "fetch",
                    "input": {"url": "https://x.test/é", "max_bytes": 5},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "3 hits ✓", "is_error": False},
                {"type": "tool_result", "tool_use_id": "c2", "content": "HTTP 404", "is_error": True},
            ],
        },
    ]


def test_anthropic_assistant_without_text_and_schema_instruction() -> None:
    calls_only = [{**AFTER_TOOLS[0], "content": ""}, *AFTER_TOOLS[1:], {"role": "user", "content": "and?"}]
    _, messages = anthropic_wire(PROMPT + calls_only)
    assert [b["type"] for b in messages[1]["content"]] == ["tool_use", "tool_use"]  # no empty text block
    # the results and the next user text are one user message, results first
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "tool_result", "text"]
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    with StandIn([Answer(text='{"n": 1}'), Answer(text='{"n": 1}')]) as server:
        _complete(_provider("anthropic", server), AgentRequest("a", "m", PROMPT, output_schema=schema))
        # prompt_messages already asks for JSON: not asked twice
        _complete(
            _provider("anthropic", server),
            AgentRequest("a", "m", prompt_messages("hi", schema), output_schema=schema),
        )
    first, second = (r.body["system"] for r in server.requests)
    assert first.startswith("Answer with one JSON value") and first.endswith("\n\nbe brief")
    assert json.dumps(schema, separators=(",", ":"), sort_keys=True) in first
    assert second.count("Answer with one JSON value") == 1


# ---------------------------------------------------------------- invalid JSON arguments


def test_openai_invalid_json_arguments_are_kept_raw_and_sent_back_verbatim() -> None:
    with StandIn(
        [Answer(text=None, tool_calls=[Call("c9", "search", '{"q": "kafka"'), Call("c10", "fetch", "")])]
    ) as server:
        response = _complete(_provider("openai", server), _request(PROMPT))
    assert response.tool_calls == (ToolCall("c9", "search", '{"q": "kafka"'), ToolCall("c10", "fetch", ""))
    follow_up: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c9", "name": "search", "arguments": '{"q": "kafka"'}],
        },
        {
            "role": "tool",
            "tool_call_id": "c9",
            "name": "search",
            "content": "arguments are not JSON",
            "is_error": True,
        },
    ]
    with StandIn([Answer(text="ok"), Answer(text="ok")]) as server:
        _complete(_provider("openai", server), _request(PROMPT + follow_up))
        _complete(_provider("anthropic", server), _request(PROMPT + follow_up))
    openai_body, anthropic_body = (r.body for r in server.requests)
    assert openai_body["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "search", "arguments": '{"q": "kafka"'}}
        ],
    }
    # the Messages API wants an object: the raw text is wrapped, not lost
    assert anthropic_body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c9", "name": "search", "input": {"value": '{"q": "kafka"'}}
    ]


# ---------------------------------------------------------------- errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


ERRORS = [
    (Raw(429, b'{"error": {"message": "slow down"}}'), "ExecutionFailed", True),
    (Raw(500), "ExecutionFailed", True),
    (Raw(529, b'{"type": "error", "error": {"type": "overloaded_error"}}'), "ExecutionFailed", True),
    (Raw(400, b'{"error": "bad request"}'), "ExecutionFailed", False),
    (Raw(401), "ExecutionFailed", False),
    (Raw(200, b"{not json"), "ExecutionFailed", True),
    (Raw(200, b"[1, 2]"), "ExecutionFailed", True),
    (Raw(200, b'{"choices": [], "content": "nope"}'), "ExecutionFailed", True),
    (Raw(200, b"{}", delay_s=1.0), "Timeout", True),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("reply", "code", "retryable"), ERRORS)
def test_error_mapping_never_shows_the_key(
    kind: str, reply: Raw, code: str, retryable: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with StandIn([reply]) as server, pytest.raises(ActionError) as err:
        _complete(_provider(kind, server, timeout_s=0.3), _request(PROMPT))
    assert (err.value.code, err.value.retryable) == (code, retryable), err.value.message
    assert len(server.requests) == 1 and server.requests[0].headers  # the key was really sent
    _no_canary(str(err.value), err.value.message, repr(err.value), caplog.text)


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_tool_calls_are_retryable(kind: str) -> None:
    bad: dict[str, Any]
    if kind == "openai":
        bad = {
            "choices": [{"message": {"content": None, "tool_calls": [{"type": "function", "function": {}}]}}]
        }
    else:
        bad = {"content": [{"type": "tool_use", "name": "search", "input": {}}]}  # no id
    with StandIn([Raw(200, json.dumps(bad).encode())]) as server, pytest.raises(ActionError) as err:
        _complete(_provider(kind, server), _request(PROMPT))
    assert err.value.retryable and "malformed" in err.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_network_error_is_retryable(kind: str) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    provider = (
        OpenAICompatProvider(url, api_key=CANARY)
        if kind == "openai"
        else AnthropicProvider(url, api_key=CANARY)
    )
    with pytest.raises(ActionError) as err:
        _complete(provider, _request(PROMPT))
    assert err.value.retryable and err.value.code == "ExecutionFailed"
    _no_canary(str(err.value))


# ---------------------------------------------------------------- run_agent_turn end to end


def _ctx() -> ActionContext:
    act = {
        "run_id": "r",
        "node": "research",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d7",
        "kind": "agent",
    }
    return ActionContext(act, SecretResolver(SecretStore(use_env=False), ()), "w")


def _router(kind: str, server: StandIn, monkeypatch: pytest.MonkeyPatch) -> ProviderRouter:
    monkeypatch.setenv("CANARY_LLM_KEY", CANARY)
    base_url = server.base_url + "/v1" if kind == "openai" else server.base_url
    config = AgentsConfig(
        providers={
            "remote": ProviderConfig(
                kind=kind,  # type: ignore[arg-type]
                base_url=base_url,
                api_key_env="CANARY_LLM_KEY",
                prices={"*": (1000, 1000)},
            )
        },
        routes={"*": "remote"},
    )
    return ProviderRouter(config, SecretStore(use_env=False))


SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
SPEC: dict[str, Any] = {
    "agent": "researcher",
    "model": "m1",
    "prompt": {"system": "be brief", "user": "find kafka docs"},
    "output_schema": SCHEMA,
    "structured_output_attempts": 2,
    "tools": TOOL_DICTS,
    "messages": [],
}


def _turn(router: ProviderRouter, spec: dict[str, Any], ctx: ActionContext | None = None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        try:
            return await run_agent_turn(ctx or _ctx(), spec, router)
        finally:
            await router.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_run_agent_turn_tool_calls_then_answer(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = [
        Answer(text="", tool_calls=[Call("c1", "search", {"q": "kafka"}), Call("c2", "fetch", {"url": "u"})]),
        Answer(text='```json\n{"n": 3}\n```', prompt_tokens=20, completion_tokens=2),
    ]
    with StandIn(script) as server:
        ctx = _ctx()
        first = _turn(_router(kind, server, monkeypatch), SPEC, ctx)
        assert first == {
            "content": "",
            "tool_calls": [
                {"id": "c1", "name": "search", "arguments": {"q": "kafka"}},
                {"id": "c2", "name": "fetch", "arguments": {"url": "u"}},
            ],
        }
        assert ctx.usage_record() == {"prompt_tokens": 10, "completion_tokens": 5, "cost_micros": 15}
        # the engine appends the calls and their results; the next turn answers
        results = [
            {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "3 hits", "is_error": False},
            {"role": "tool", "tool_call_id": "c2", "name": "fetch", "content": "gone", "is_error": True},
        ]
        transcript = [
            {"role": "assistant", "content": first["content"], "tool_calls": first["tool_calls"]},
            *results,
        ]
        second = _turn(_router(kind, server, monkeypatch), {**SPEC, "messages": transcript})
    assert second == {"content": '```json\n{"n": 3}\n```', "answer": {"n": 3}}
    assert [r.headers["idempotency-key"] for r in server.requests] == ["d7", "d7"]
    sent = server.requests[1].body["messages"]
    if kind == "openai":
        assert sent[0]["content"].startswith("Answer with one JSON value")  # prompt_messages' instruction
        assert [m["role"] for m in sent] == ["system", "system", "user", "assistant", "tool", "tool"]
        assert [m["tool_call_id"] for m in sent[4:]] == ["c1", "c2"]
    else:
        assert server.requests[1].body["system"].startswith("Answer with one JSON value")
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert [b["tool_use_id"] for b in sent[2]["content"]] == ["c1", "c2"]
    _no_canary(first, second)


@pytest.mark.parametrize("kind", KINDS)
def test_run_agent_turn_sends_an_invalid_answer_back(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with StandIn([Answer(text='{"n": "three"}'), Answer(text='{"n": 3}')]) as server:
        ctx = _ctx()
        assert _turn(_router(kind, server, monkeypatch), SPEC, ctx) == {
            "content": '{"n": 3}',
            "answer": {"n": 3},
        }
    assert len(server.requests) == 2 and ctx.usage_record()["prompt_tokens"] == 20
    retry = server.requests[1].body["messages"]
    assert retry[-2]["role"] == "assistant" and retry[-2]["content"] == '{"n": "three"}'
    assert retry[-1]["role"] == "user" and "rejected" in retry[-1]["content"] and "/n" in retry[-1]["content"]
    with StandIn([Answer(text="not json"), Answer(text="[]"), Answer(text='{"n": 1}')]) as server:
        ctx = _ctx()
        with pytest.raises(ActionError) as err:
            _turn(_router(kind, server, monkeypatch), SPEC, ctx)
    assert (err.value.code, err.value.retryable) == ("InvalidOutput", False)
    assert len(server.requests) == 2 and ctx.usage_record()["completion_tokens"] == 10


def test_run_agent_turn_without_schema_answers_text_and_refuses_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with StandIn([Answer(text="plain words")]) as server:
        out = _turn(_router("anthropic", server, monkeypatch), {**SPEC, "output_schema": None})
        assert out == {"content": "plain words", "answer": "plain words"}
        for prompt in (
            {"user": {"$secret": "k"}},
            {"messages": [{"role": "user", "content": {"x": [{"$secret": "k"}]}}]},
        ):
            with pytest.raises(ActionError) as err:
                _turn(_router("anthropic", server, monkeypatch), {**SPEC, "prompt": prompt})
            assert err.value.code == "PermissionDenied"
    assert len(server.requests) == 1  # a refused prompt never reached the model


@pytest.mark.parametrize(
    "bad",
    [
        {"tools": [{"name": "x", "input_schema": {"type": "nonsense"}}]},
        {"tools": [TOOL_DICTS[0], TOOL_DICTS[0]]},
        {"tools": [{"description": "no name"}]},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "tool", "content": "no id", "name": "search"}]},
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"name": "search"}]}]},
    ],
)
def test_run_agent_turn_rejects_a_malformed_spec(bad: dict[str, Any]) -> None:
    router = ProviderRouter(AgentsConfig(), SecretStore(use_env=False))
    with pytest.raises(ActionError) as err:
        _turn(router, {**SPEC, **bad})
    assert (err.value.code, err.value.retryable) == ("InvalidInput", False)


# ---------------------------------------------------------------- the local provider


def _local_turn(
    provider: LocalProvider, messages: list[dict[str, Any]], schema: Any = SCHEMA
) -> AgentResponse:
    return asyncio.run(provider.complete(AgentRequest("a", "m", messages, output_schema=schema, tools=TOOLS)))


def test_local_without_script_calls_every_tool_once_then_answers() -> None:
    first = _local_turn(LocalProvider(), PROMPT)
    assert [(c.id, c.name) for c in first.tool_calls] == [("call_0_0", "search"), ("call_0_1", "fetch")]
    for call, tool in zip(first.tool_calls, TOOLS, strict=True):
        Draft202012Validator(tool.input_schema).validate(call.arguments)
    assert first == _local_turn(LocalProvider(), PROMPT)  # same request, same turn
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0
    transcript: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in first.tool_calls],
        },
        *[
            {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": "zebra", "is_error": False}
            for c in first.tool_calls
        ],
    ]
    second = _local_turn(LocalProvider(), PROMPT + transcript, {"type": "string", "minLength": 30})
    assert second.tool_calls == () and isinstance(second.json, str)
    assert "zebra" in second.json.split()  # words come from the tool results too
    assert second == _local_turn(LocalProvider(), PROMPT + transcript, {"type": "string", "minLength": 30})
    # no tools: the answer does not depend on whether a script is configured
    plain = AgentRequest("a", "m", PROMPT, output_schema=SCHEMA)
    assert asyncio.run(LocalProvider().complete(plain)) == asyncio.run(
        LocalProvider(script=[{"answer": 1}]).complete(plain)
    )


def test_local_script_plays_turns_by_assistant_count() -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "search", "arguments": {"q": "one"}}, {"name": "fetch"}]},
        {"tool_calls": [{"name": "search", "arguments": "not json"}]},
        {"answer": {"n": 4}},
    ]
    provider = LocalProvider(script=script)
    turn0 = _local_turn(provider, PROMPT)
    assert turn0.tool_calls[0] == ToolCall("call_0_0", "search", {"q": "one"})
    assert turn0.tool_calls[1].id == "call_0_1"
    Draft202012Validator(FETCH.input_schema).validate(turn0.tool_calls[1].arguments)
    one_assistant = [*PROMPT, {"role": "assistant", "content": "", "tool_calls": []}]
    assert _local_turn(provider, one_assistant).tool_calls == (ToolCall("call_1_0", "search", "not json"),)
    two = [*one_assistant, {"role": "assistant", "content": "x"}]
    answer = _local_turn(provider, two)
    assert (answer.tool_calls, answer.json, answer.text) == ((), {"n": 4}, '{"n":4}')
    past_end = _local_turn(provider, [*two, {"role": "assistant", "content": "y"}])
    assert past_end.tool_calls == () and Draft202012Validator(SCHEMA).is_valid(past_end.json)
    assert past_end == _local_turn(
        LocalProvider(script=script), [*two, {"role": "assistant", "content": "y"}]
    )


def test_local_script_through_the_router_and_run_agent_turn() -> None:
    config = AgentsConfig(
        providers={
            "local": ProviderConfig(
                script=[
                    {"tool_calls": [{"name": "search", "arguments": {"q": "k"}}]},
                    {"answer": '{"n": "x"}'},
                    {"answer": '{"n": 2}'},
                ]
            )
        },
        routes={"*": "local"},
    )
    router = ProviderRouter(config, SecretStore(use_env=False))
    first = _turn(router, SPEC)
    assert first == {
        "content": "",
        "tool_calls": [{"id": "call_0_0", "name": "search", "arguments": {"q": "k"}}],
    }
    transcript = [
        {"role": "assistant", "content": "", "tool_calls": first["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_0_0", "name": "search", "content": "hits", "is_error": False},
    ]
    # turn 1 answers invalid text; the retry adds an assistant message, so turn 2 answers validly
    assert _turn(router, {**SPEC, "messages": transcript}) == {"content": '{"n": 2}', "answer": {"n": 2}}
    with pytest.raises(ValueError, match="script turn 0"):
        ProviderConfig(script=[{"tool_calls": [{"name": "x"}], "answer": 1}])


# ---------------------------------------------------------------- the Anthropic conversion, generated

_text = st.text(max_size=12)  # any unicode, empty included
_arguments = st.one_of(
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), _text, st.none()), max_size=3),
    _text,  # a raw (invalid JSON) string kept from another provider
)
_ids = st.text(min_size=1, max_size=8)
_call = st.builds(
    lambda i, n, a: {"id": i, "name": n, "arguments": a}, _ids, st.text(min_size=1, max_size=6), _arguments
)
_message = st.one_of(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["system", "user"]), _text),
    st.builds(
        lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls},
        _text,
        st.lists(_call, max_size=3),
    ),
    st.builds(
        lambda i, n, c, e: {"role": "tool", "tool_call_id": i, "name": n, "content": c, "is_error": e},
        _ids,
        st.text(max_size=6),
        _text,
        st.booleans(),
    ),
)


@given(st.lists(_message, max_size=14))
def test_anthropic_conversion_of_any_transcript(messages: list[dict[str, Any]]) -> None:
    """For any sequence of the four kinds of message: roles alternate (no two adjacent messages
    share one); system text goes to `system` only; every tool result, tool use and non-empty text
    survives, in order, with its id, content and error flag; a user message's tool results come
    before its text; no list holds an empty text block."""
    system, wire = anthropic_wire(messages)
    assert system == "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    roles = [w["role"] for w in wire]
    assert all(a != b for a, b in itertools.pairwise(roles)) and set(roles) <= {"user", "assistant"}

    def blocks(w: dict[str, Any]) -> list[dict[str, Any]]:
        content = w["content"]
        return [{"type": "text", "text": content}] if isinstance(content, str) else content

    out_blocks = [(w["role"], b) for w in wire for b in blocks(w)]
    results = [
        (b["tool_use_id"], b["content"], b["is_error"]) for r, b in out_blocks if b["type"] == "tool_result"
    ]
    assert results == [
        (m["tool_call_id"], m["content"], m["is_error"]) for m in messages if m["role"] == "tool"
    ]
    uses = [(b["id"], b["name"], b["input"]) for r, b in out_blocks if b["type"] == "tool_use"]
    assert uses == [
        (
            c["id"],
            c["name"],
            c["arguments"] if isinstance(c["arguments"], dict) else {"value": c["arguments"]},
        )
        for m in messages
        if m["role"] == "assistant"
        for c in m["tool_calls"]
    ]
    assert all(r == "assistant" for r, b in out_blocks if b["type"] == "tool_use")
    assert all(r == "user" for r, b in out_blocks if b["type"] == "tool_result")
    for role in ("user", "assistant"):
        texts = [b["text"] for r, b in out_blocks if r == role and b["type"] == "text" and b["text"]]
        assert texts == [m["content"] for m in messages if m["role"] == role and m["content"]]
    for w in wire:
        if isinstance(w["content"], list):
            kinds = [b["type"] for b in w["content"]]
            assert all(b["text"] for b in w["content"] if b["type"] == "text")
            if w["role"] == "user":
                assert kinds == sorted(kinds, key=lambda k: k != "tool_result")


def _agent_transcript() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Well-formed agent loops: rounds of an assistant's calls then their results (in any order),
    with system and user messages anywhere and plain assistant text before a round."""
    other = st.builds(
        lambda r, c: {"role": r, "content": c}, st.sampled_from(["system", "user", "assistant"]), _text
    )

    def round_(k: int, n: int) -> st.SearchStrategy[list[dict[str, Any]]]:
        ids = [f"r{n}_{i}" for i in range(k)]
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": i, "name": "t", "arguments": {}} for i in ids],
        }
        results = st.permutations(ids).map(
            lambda order: [
                {"role": "tool", "tool_call_id": i, "name": "t", "content": i, "is_error": False}
                for i in order
            ]
        )
        between = st.lists(
            st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["system", "user"]), _text),
            max_size=2,
        )
        return st.tuples(st.lists(other, max_size=2), results, between).map(
            lambda t: [
                *t[0],
                call,
                *[x for pair in zip(t[1], [*t[2], *[None] * k], strict=False) for x in pair if x is not None],
            ]
        )

    return st.lists(st.integers(1, 3), min_size=1, max_size=4).flatmap(
        lambda sizes: st.tuples(*[round_(k, n) for n, k in enumerate(sizes)]).map(
            lambda rs: [m for r in rs for m in r]
        )
    )


@given(_agent_transcript())
def test_anthropic_conversion_keeps_each_result_after_its_tool_use(messages: list[dict[str, Any]]) -> None:
    """For a well-formed agent loop (results follow their calls, maybe with system or user
    messages between), every tool_result's tool_use_id is a tool_use of the message just before."""
    _, wire = anthropic_wire(messages)
    for before, message in itertools.pairwise(wire):
        if isinstance(message["content"], list):
            used = {
                b["id"]
                for b in before["content"]
                if isinstance(before["content"], list) and b["type"] == "tool_use"
            }
            for b in message["content"]:
                if b["type"] == "tool_result":
                    assert b["tool_use_id"] in used, (before, message)
    assert (
        sum(
            isinstance(w["content"], list) and any(b["type"] == "tool_result" for b in w["content"])
            for w in wire
        )
        >= 1
    )


def test_run_agent_turn_honours_the_deadline_and_a_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    with StandIn([Raw(200, b"{}", delay_s=2.0)]) as server:
        ctx = _ctx()
        ctx.deadline_ms = int(time.time() * 1000) + 300  # the provider's own timeout is 60 s
        started = time.monotonic()
        with pytest.raises(ActionError) as err:
            _turn(_router("openai", server, monkeypatch), SPEC, ctx)
        assert err.value.code == "Timeout" and time.monotonic() - started < 1.5
        cancelled = _ctx()
        cancelled.signal_cancel("stop")
        with pytest.raises(Cancelled):
            _turn(_router("openai", server, monkeypatch), SPEC, cancelled)
    assert len(server.requests) == 1  # the cancelled turn never called the model
