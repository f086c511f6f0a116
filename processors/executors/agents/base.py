"""The agent provider interface: one chat-style completion, with usage, optionally with tools.

The transcript is provider-neutral; each provider converts it to its own wire format. A
`Message` is one of:

- `{"role": "system" | "user", "content": str}`
- `{"role": "assistant", "content": str, "tool_calls": [{"id": str, "name": str, "arguments": Any}]}`
  (`tool_calls` optional or empty; `arguments` is the parsed JSON the model sent, or the raw
  string when it was not valid JSON)
- `{"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}`
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: `input_schema` is the JSON Schema of its arguments."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for. `arguments` is a raw string when the model's JSON was invalid."""

    id: str
    name: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class AgentRequest:
    agent: str
    model: str
    messages: list[Message]
    output_schema: dict[str, Any] | None = None
    capabilities: frozenset[str] = frozenset()
    timeout_s: float | None = None
    idempotency_key: str = ""
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0


@dataclass(frozen=True, slots=True)
class AgentResponse:
    """`text` is the raw completion; `json` the parsed value when the provider already has it;
    `tool_calls` what the model asked to run (empty when it answered)."""

    text: str
    usage: AgentUsage = field(default_factory=AgentUsage)
    json: Any = None
    tool_calls: tuple[ToolCall, ...] = ()


class AgentProvider(Protocol):
    async def complete(self, request: AgentRequest) -> AgentResponse:
        """One completion. Raise `RetryableError` for transient faults (429, 5xx, timeouts),
        `NonRetryableError`/`ActionError` for permanent ones."""
        ...


def cost_micros(
    prices: dict[str, tuple[int, int]], model: str, prompt_tokens: int, completion_tokens: int
) -> int:
    """Cost from a price table `{model or "*": (prompt, completion) micros per 1000 tokens}`."""
    price = prices.get(model) or prices.get("*")
    if price is None:
        return 0
    return math.ceil((prompt_tokens * price[0] + completion_tokens * price[1]) / 1000)


def priced_model(prices: dict[str, tuple[int, int]], *models: Any) -> str:
    """The first of `models` the price table names (the model the server reports, then the one
    asked for: a server may answer "gpt-4o" as "gpt-4o-2024-08-06"), else "*"."""
    return next((m for m in models if isinstance(m, str) and m in prices), "*")


def json_text(value: Any) -> str:
    """`value` as a string: itself when it is one, else compact JSON with sorted keys."""
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def schema_instruction(output_schema: dict[str, Any]) -> str:
    """The system instruction that asks for JSON matching `output_schema` (for providers without
    a native structured-output mode, and for every prompt with a schema)."""
    return "Answer with one JSON value (no prose) that matches this JSON schema: " + json_text(output_schema)
