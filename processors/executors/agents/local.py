"""A deterministic local agent provider: no network, same prompt -> same answer.

With an output schema it returns an instance of the schema built by a RNG seeded with
sha256(model, messages), with strings made of the user prompt's own words; without one, a short
sentence of prompt words. Usage counts words (prompt words in, answer words out); cost
comes from a price table (micros per 1000 tokens)."""

from __future__ import annotations

import hashlib
import random

import orjson

from processors.executors.agents.base import AgentRequest, AgentResponse, AgentUsage, cost_micros
from processors.executors.agents.schema_instance import build_instance, prompt_words

DEFAULT_PRICES: dict[str, tuple[int, int]] = {"*": (150, 600)}


class LocalProvider:
    def __init__(self, prices: dict[str, tuple[int, int]] | None = None) -> None:
        self.prices = DEFAULT_PRICES if prices is None else prices

    async def complete(self, request: AgentRequest) -> AgentResponse:
        return self.complete_sync(request)

    def complete_sync(self, request: AgentRequest) -> AgentResponse:
        prompt_text = "\n".join(m["content"] for m in request.messages)
        digest = hashlib.sha256(
            orjson.dumps([request.model, request.messages], option=orjson.OPT_SORT_KEYS)
        ).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        # strings come from what the user wrote, not from the schema instructions
        words = prompt_words("\n".join(m["content"] for m in request.messages if m["role"] == "user"))
        value = None
        if request.output_schema is not None:
            value = build_instance(request.output_schema, rng, words)
            text = orjson.dumps(value).decode()
        else:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(8, 16)))
        prompt_tokens = len(prompt_text.split())
        completion_tokens = len(text.replace(",", " ").split())
        usage = AgentUsage(
            prompt_tokens,
            completion_tokens,
            cost_micros(self.prices, request.model, prompt_tokens, completion_tokens),
        )
        return AgentResponse(text=text, usage=usage, json=value)
