"""Agent steps: prompt -> messages -> provider, with the structured-output attempt loop.

An agent activation carries `agent: AgentSpec {agent, model, prompt, output_schema,
structured_output_attempts}`. The prompt (already resolved by the engine) is a string, or
`{"system": ..., "user": ...}`, or `{"messages": [{role, content}, ...]}`, or any other JSON
(sent as the user message, JSON-encoded). With an output schema, each answer is parsed and
validated; an invalid one is sent back with the validation error, up to
`structured_output_attempts` calls; then `InvalidOutput` (not retryable). Usage is summed
over every call, also when the step fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from processors.executors.agents.anthropic import AnthropicProvider
from processors.executors.agents.base import (
    AgentProvider,
    AgentRequest,
    AgentResponse,
    Message,
    ToolSpec,
    json_text,
    schema_instruction,
)
from processors.executors.agents.local import LocalProvider
from processors.executors.agents.openai_compat import OpenAICompatProvider
from processors.executors.context import ActionContext
from processors.executors.errors import ActionError
from processors.executors.redaction import remember
from processors.executors.secrets import SecretStore, contains_handle
from processors.executors.settings import AgentsConfig, ProviderConfig


class ProviderRouter:
    """Picks the provider for `(agent, model)` from `AgentsConfig.routes`; builds each once."""

    def __init__(self, config: AgentsConfig, secrets: SecretStore) -> None:
        self.config = config
        self._secrets = secrets
        self._built: dict[str, AgentProvider] = {}
        # The providers' API keys are secrets this process knows from the start, not from the
        # first agent step: redacted from every message, log record and output before any is built.
        for cfg in config.providers.values():
            key = None
            if cfg.api_key_env:
                key = os.environ.get(cfg.api_key_env)
            elif cfg.api_key_secret:
                key = secrets.lookup(cfg.api_key_secret)
            if key:
                remember([key])

    def add(self, name: str, provider: AgentProvider, route: str | None = None) -> None:
        """Register a provider object directly (programmatic use, tests)."""
        self._built[name] = provider
        if route is not None:
            self.config.routes[route] = name

    def select(self, agent: str, model: str) -> AgentProvider:
        routes = self.config.routes
        for key in (f"{agent}/{model}", agent, f"*/{model}", "*"):
            if key in routes:
                return self._provider(routes[key])
        raise ActionError(
            "UnknownReference", f"no agent provider is routed for agent {agent!r} model {model!r}"
        )

    def _provider(self, name: str) -> AgentProvider:
        if name in self._built:
            return self._built[name]
        cfg = self.config.providers.get(name)
        if cfg is None:
            raise ActionError("UnknownReference", f"agent provider {name!r} is not configured")
        provider = self._build(name, cfg)
        self._built[name] = provider
        return provider

    def _build(self, name: str, cfg: ProviderConfig) -> AgentProvider:
        if cfg.kind == "local":
            return LocalProvider(cfg.prices or None, cfg.script)
        if not cfg.base_url:
            raise ActionError("UnknownReference", f"agent provider {name!r} needs a base_url")
        key = None
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
        elif cfg.api_key_secret:
            key = self._secrets.lookup(cfg.api_key_secret)
        if (cfg.api_key_env or cfg.api_key_secret) and not key:
            raise ActionError("PermissionDenied", f"agent provider {name!r}: API key is not configured")
        if key:
            remember([key])  # redacted from this process's logs, messages and outputs like any secret
        if cfg.kind == "anthropic":
            return AnthropicProvider(cfg.base_url, key, cfg.model, cfg.timeout_s, cfg.prices, cfg.max_tokens)
        return OpenAICompatProvider(cfg.base_url, key, cfg.model, cfg.timeout_s, cfg.prices)

    async def aclose(self) -> None:
        for provider in self._built.values():
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()


_content = json_text


def prompt_messages(prompt: Any, output_schema: dict[str, Any] | None) -> list[Message]:
    if isinstance(prompt, dict) and isinstance(prompt.get("messages"), list):
        messages = [
            {"role": str(m.get("role", "user")), "content": _content(m.get("content", ""))}
            for m in prompt["messages"]
            if isinstance(m, dict)
        ]
    elif isinstance(prompt, dict) and ("system" in prompt or "user" in prompt):
        messages = []
        if prompt.get("system") is not None:
            messages.append({"role": "system", "content": _content(prompt["system"])})
        messages.append({"role": "user", "content": _content(prompt.get("user", ""))})
    else:
        messages = [{"role": "user", "content": _content(prompt)}]
    if output_schema is not None:
        messages.insert(
            0,
            {"role": "system", "content": schema_instruction(output_schema)},
        )
    return messages


def parse_json_answer(text: str) -> Any:
    """The JSON in an answer, tolerating a Markdown code fence around it."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return orjson.loads(stripped)


def _schema_error(validator: Draft202012Validator, value: Any) -> str | None:
    error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.path))), None)
    if error is None:
        return None
    where = "/" + "/".join(str(p) for p in error.path)
    return f"at {where}: {error.message[:300]}"


@dataclass(frozen=True, slots=True)
class CheckedAgent:
    """An AgentSpec's parts once checked, and the provider routed for it."""

    agent: str
    model: str
    prompt: Any
    schema: dict[str, Any] | None
    validator: Draft202012Validator | None
    attempts: int
    provider: AgentProvider


def check_agent_spec(spec: dict[str, Any], router: ProviderRouter) -> CheckedAgent:
    """Refuse secret handles in the prompt and an invalid output schema; pick the provider."""
    prompt = spec.get("prompt")
    if contains_handle(prompt):
        raise ActionError("PermissionDenied", "secret handles are not allowed in agent prompts")
    schema = spec.get("output_schema")
    validator = None
    if schema is not None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ActionError(
                "InvalidInput", f"agent output_schema is not a valid JSON schema: {exc.message[:200]}"
            ) from None
        validator = Draft202012Validator(schema)
    agent, model = str(spec.get("agent") or ""), str(spec.get("model") or "")
    provider = router.select(agent, model)
    attempts = max(1, int(spec.get("structured_output_attempts") or 1))
    return CheckedAgent(agent, model, prompt, schema, validator, attempts, provider)


async def complete_until_valid(
    ctx: ActionContext,
    checked: CheckedAgent,
    messages: list[Message],
    tools: tuple[ToolSpec, ...] = (),
) -> tuple[AgentResponse, Any]:
    """Call the provider until it answers validly: `(last response, answer)`.

    Without an output schema the first answer is the answer (the parsed JSON when the provider
    has it, else the text). With one, an answer that is not JSON or does not match is sent back
    with the problem, up to `attempts` calls in all; then `InvalidOutput`. When tools are offered
    and the model asks for some instead, that response is returned at once (answer None): if it
    came after a rejected answer, the rejection exchange is not part of what is returned.
    Usage is recorded on `ctx` after every call, so a failed step reports it too."""
    problem = ""
    for _ in range(checked.attempts):
        ctx.check_cancelled()
        remaining = ctx.remaining_ms()
        response = await checked.provider.complete(
            AgentRequest(
                agent=checked.agent,
                model=checked.model,
                messages=messages,
                output_schema=checked.schema,
                capabilities=ctx.capabilities,
                timeout_s=remaining / 1000 if remaining is not None else None,
                idempotency_key=ctx.idempotency_key,
                tools=tools,
            )
        )
        ctx.usage(response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.cost_micros)
        if tools and response.tool_calls:
            return response, None
        if checked.validator is None:
            return response, response.json if response.json is not None else response.text
        try:
            value = response.json if response.json is not None else parse_json_answer(response.text)
        except orjson.JSONDecodeError:
            problem = "the answer is not valid JSON"
        else:
            error = _schema_error(checked.validator, value)
            if error is None:
                return response, value
            problem = f"the answer does not match the schema {error}"
        messages = [
            *messages,
            {"role": "assistant", "content": response.text},
            {
                "role": "user",
                "content": f"Your previous answer was rejected: {problem}. Reply again with only JSON matching the schema.",
            },
        ]
    raise ActionError("InvalidOutput", f"agent output invalid after {checked.attempts} attempt(s): {problem}")


async def run_agent(ctx: ActionContext, spec: dict[str, Any], router: ProviderRouter) -> Any:
    checked = check_agent_spec(spec, router)
    _, answer = await complete_until_valid(ctx, checked, prompt_messages(checked.prompt, checked.schema))
    return answer
