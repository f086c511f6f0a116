"""The agent provider interface: one chat-style completion, with usage."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True, slots=True)
class AgentRequest:
    agent: str
    model: str
    messages: list[Message]
    output_schema: dict[str, Any] | None = None
    capabilities: frozenset[str] = frozenset()
    timeout_s: float | None = None
    idempotency_key: str = ""


@dataclass(frozen=True, slots=True)
class AgentUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0


@dataclass(frozen=True, slots=True)
class AgentResponse:
    """`text` is the raw completion; `json` the parsed value when the provider already has it."""

    text: str
    usage: AgentUsage = field(default_factory=AgentUsage)
    json: Any = None


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
