"""Agent steps without a broker: local provider, structured-output loop, OpenAI-compatible provider."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from processors.executors import ActionError, AgentsConfig, ProviderConfig, SecretStore
from processors.executors.agents import AgentRequest, AgentResponse, AgentUsage, LocalProvider, ProviderRouter
from processors.executors.agents.openai_compat import OpenAICompatProvider
from processors.executors.agents.structured import parse_json_answer, prompt_messages, run_agent
from processors.executors.context import ActionContext
from processors.executors.secrets import SecretResolver

BRIEF = {
    "type": "object",
    "required": ["title", "queries", "priority", "tags"],
    "properties": {
        "title": {"type": "string", "minLength": 5, "maxLength": 40},
        "queries": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
        "when": {"type": "string", "format": "date-time"},
        "extra": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/point"}]},
    },
    "additionalProperties": False,
    "$defs": {
        "point": {
            "type": "object",
            "required": ["x", "y"],
            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        }
    },
}


def _ctx(caps: tuple[str, ...] = ()) -> ActionContext:
    act = {
        "run_id": "r",
        "node": "plan",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d1",
        "kind": "agent",
        "capabilities": list(caps),
    }
    return ActionContext(act, SecretResolver(SecretStore(use_env=False), caps), "w")


def _complete(
    provider: Any, prompt: str, schema: dict[str, Any] | None, model: str = "small"
) -> AgentResponse:
    req = AgentRequest(
        agent="planner", model=model, messages=prompt_messages(prompt, schema), output_schema=schema
    )
    return asyncio.run(provider.complete(req))


def test_local_provider_is_deterministic_and_schema_valid() -> None:
    provider = LocalProvider()
    a = _complete(provider, "Plan research on kafka exactly once semantics", BRIEF)
    b = _complete(provider, "Plan research on kafka exactly once semantics", BRIEF)
    c = _complete(provider, "Plan research on durable agent workflows", BRIEF)
    assert a == b and a.json != c.json
    Draft202012Validator(BRIEF).validate(a.json)
    Draft202012Validator(BRIEF).validate(c.json)
    assert set(a.json["title"].split()) <= {"plan", "research", "on", "kafka", "exactly", "once", "semantics"}
    assert a.usage.prompt_tokens > 0 and a.usage.completion_tokens > 0 and a.usage.cost_micros > 0
    free_text = _complete(provider, "say something about kafka", None)
    assert free_text.json is None and set(free_text.text.split()) <= {"say", "something", "about", "kafka"}


_leaf = st.one_of(
    st.just({"type": "string"}),
    st.builds(
        lambda lo, n: {"type": "string", "minLength": lo, "maxLength": lo + n},
        st.integers(0, 10),
        st.integers(0, 10),
    ),
    st.builds(
        lambda lo, n: {"type": "integer", "minimum": lo, "maximum": lo + n},
        st.integers(-50, 50),
        st.integers(0, 20),
    ),
    st.builds(lambda lo: {"type": "number", "minimum": lo, "exclusiveMaximum": lo + 3}, st.integers(-5, 5)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": ["string", "null"], "format": "email"}),
    st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4, unique=True).map(
        lambda xs: {"enum": xs}
    ),
    st.integers(1, 5).map(lambda m: {"type": "integer", "multipleOf": m, "minimum": 0, "maximum": 40}),
)
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda items, lo: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 2},
            inner,
            st.integers(0, 3),
        ),
        st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, min_size=1, max_size=4).flatmap(
            lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
                lambda req: {
                    "type": "object",
                    "properties": props,
                    "required": req,
                    "additionalProperties": False,
                }
            )
        ),
        st.lists(inner, min_size=1, max_size=3).map(lambda subs: {"anyOf": subs}),
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas, st.text(max_size=40))
def test_local_provider_output_satisfies_generated_schemas(schema: dict[str, Any], prompt: str) -> None:
    out = _complete(LocalProvider(), prompt, schema)
    assert Draft202012Validator(schema).is_valid(out.json), (schema, out.json)
    assert out == _complete(LocalProvider(), prompt, schema)


class Scripted:
    """A provider that answers from a script (a real AgentProvider, no network)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.requests: list[AgentRequest] = []

    async def complete(self, request: AgentRequest) -> AgentResponse:
        self.requests.append(request)
        return AgentResponse(text=self.answers[len(self.requests) - 1], usage=AgentUsage(10, 3, 7))


def _router(provider: Any) -> ProviderRouter:
    router = ProviderRouter(AgentsConfig(), SecretStore(use_env=False))
    router.add("scripted", provider, route="*")
    return router


SPEC = {
    "agent": "planner",
    "model": "small",
    "prompt": {"system": "be brief", "user": "plan"},
    "output_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
    "structured_output_attempts": 3,
}


def test_structured_output_retries_with_the_validation_error() -> None:
    provider = Scripted(["not json", '{"n": "seven"}', '```json\n{"n": 7}\n```'])
    ctx = _ctx()
    assert asyncio.run(run_agent(ctx, SPEC, _router(provider))) == {"n": 7}
    assert len(provider.requests) == 3
    last = provider.requests[-1].messages
    assert (
        last[-1]["role"] == "user" and "/n" in last[-1]["content"] and last[-2]["content"] == '{"n": "seven"}'
    )
    assert ctx.usage_record() == {"prompt_tokens": 30, "completion_tokens": 9, "cost_micros": 21}


def test_structured_output_exhausted_is_invalid_output_with_usage() -> None:
    ctx = _ctx()
    with pytest.raises(ActionError) as err:
        asyncio.run(
            run_agent(ctx, {**SPEC, "structured_output_attempts": 2}, _router(Scripted(["[]", "{}"])))
        )
    assert (err.value.code, err.value.retryable) == ("InvalidOutput", False)
    assert ctx.usage_record()["prompt_tokens"] == 20


def test_secret_in_prompt_is_refused_and_bad_schema_rejected() -> None:
    with pytest.raises(ActionError) as err:
        asyncio.run(
            run_agent(
                _ctx(("secret:k",)), {**SPEC, "prompt": {"user": {"$secret": "k"}}}, _router(Scripted(["{}"]))
            )
        )
    assert err.value.code == "PermissionDenied"
    with pytest.raises(ActionError) as bad:
        asyncio.run(
            run_agent(_ctx(), {**SPEC, "output_schema": {"type": "nonsense"}}, _router(Scripted(["{}"])))
        )
    assert bad.value.code == "InvalidInput"


def test_routing_prefers_the_most_specific_route() -> None:
    config = AgentsConfig(
        providers={
            "local": ProviderConfig(),
            "cheap": ProviderConfig(prices={"*": (1, 1)}),
            "remote": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9", api_key_env="NOPE_KEY"),
        },
        routes={"*": "local", "planner": "cheap", "*/big": "remote"},
    )
    router = ProviderRouter(config, SecretStore(use_env=False))
    assert router.select("planner", "small").prices == {"*": (1, 1)}
    assert router.select("writer", "small").prices != {"*": (1, 1)}
    with pytest.raises(ActionError, match="API key"):
        router.select("writer", "big")
    with pytest.raises(ActionError):
        ProviderRouter(AgentsConfig(routes={}), SecretStore(use_env=False)).select("a", "b")


def test_prompt_shapes() -> None:
    assert prompt_messages("hi", None) == [{"role": "user", "content": "hi"}]
    msgs = prompt_messages(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": {"a": 1}}]}, None
    )
    assert msgs == [{"role": "system", "content": "s"}, {"role": "user", "content": '{"a":1}'}]
    assert prompt_messages({"topic": "x"}, None) == [{"role": "user", "content": '{"topic":"x"}'}]
    assert parse_json_answer(" ```\n[1]\n``` ") == [1]


# ---------------------------------------------------------------- OpenAI-compatible, real local server


class _Chat(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []
    status = 200

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Chat.seen.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
        if _Chat.status != 200:
            payload = b'{"error": "nope"}'
            self.send_response(_Chat.status)
        else:
            content = json.dumps({"n": len(body["messages"])})
            payload = json.dumps(
                {
                    "model": body["model"],
                    "choices": [{"message": {"content": content}}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 4},
                }
            ).encode()
            self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def chat_server() -> Iterator[str]:
    _Chat.seen, _Chat.status = [], 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_openai_compat_provider_round_trip(chat_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test-123")
    config = AgentsConfig(
        providers={
            "remote": ProviderConfig(
                kind="openai", base_url=chat_server, api_key_env="TEST_LLM_KEY", prices={"*": (1000, 2000)}
            )
        },
        routes={"*": "remote"},
    )
    router = ProviderRouter(config, SecretStore(use_env=False))
    ctx = _ctx()

    async def go() -> Any:
        try:
            return await run_agent(ctx, SPEC, router)
        finally:
            await router.aclose()

    assert asyncio.run(go()) == {"n": 3}
    seen = _Chat.seen[0]
    assert seen["path"] == "/v1/chat/completions" and seen["auth"] == "Bearer sk-test-123"
    assert seen["body"]["response_format"]["json_schema"]["schema"] == SPEC["output_schema"]
    assert ctx.usage_record() == {"prompt_tokens": 12, "completion_tokens": 4, "cost_micros": 20}


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (502, True), (401, False)])
def test_openai_compat_errors(chat_server: str, status: int, retryable: bool) -> None:
    _Chat.status = status
    provider = OpenAICompatProvider(chat_server, api_key="sk-secret-abc")

    async def go() -> Any:
        try:
            return await provider.complete(AgentRequest("a", "m", [{"role": "user", "content": "x"}]))
        finally:
            await provider.aclose()

    with pytest.raises(ActionError) as err:
        asyncio.run(go())
    assert err.value.retryable is retryable and "sk-secret-abc" not in err.value.message
