"""A deterministic local agent provider: no network, same prompt -> same answer.

With an output schema it returns an instance of the schema built by a RNG seeded with
sha256(model, messages), with strings made of the user prompt's own words; without one, a short
sentence of prompt words. Usage counts words (prompt words in, answer words out); cost
comes from a price table (micros per 1000 tokens).

With tools offered, it plays a turn of a tool-using agent. The turn index is the number of
assistant messages already in the transcript. With a `script` (a list of turns, each
`{"tool_calls": [{"name", "arguments"?}, ...]}` or `{"answer": value or text}`) it plays that
turn; a call without `arguments` gets an instance of the tool's input schema; past the script's
end it answers. Without a script, turn 0 calls every tool once (arguments built from its input
schema) and later turns answer. Call ids are `call_<turn>_<i>`. The RNG of a tool turn is seeded
with the tools too, and its words also come from the tool results in the transcript."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import orjson

from processors.executors.agents.base import (
    AgentRequest,
    AgentResponse,
    AgentUsage,
    ToolCall,
    ToolSpec,
    cost_micros,
)
from processors.executors.agents.schema_instance import build_instance, prompt_words

DEFAULT_PRICES: dict[str, tuple[int, int]] = {"*": (150, 600)}


def _rng(seed_material: list[Any]) -> random.Random:
    digest = hashlib.sha256(orjson.dumps(seed_material, option=orjson.OPT_SORT_KEYS)).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class LocalProvider:
    def __init__(
        self,
        prices: dict[str, tuple[int, int]] | None = None,
        script: list[dict[str, Any]] | None = None,
    ) -> None:
        self.prices = DEFAULT_PRICES if prices is None else prices
        self.script = script

    async def complete(self, request: AgentRequest) -> AgentResponse:
        return self.complete_sync(request)

    def complete_sync(self, request: AgentRequest) -> AgentResponse:
        if request.tools:
            return self._tool_turn(request)
        rng = _rng([request.model, request.messages])
        # strings come from what the user wrote, not from the schema instructions
        words = prompt_words("\n".join(m["content"] for m in request.messages if m["role"] == "user"))
        text, value = self._answer(request, rng, words)
        return self._response(request, text, value)

    def _answer(self, request: AgentRequest, rng: random.Random, words: list[str]) -> tuple[str, Any]:
        if request.output_schema is not None:
            value = build_instance(request.output_schema, rng, words)
            return orjson.dumps(value).decode(), value
        return " ".join(rng.choice(words) for _ in range(rng.randint(8, 16))), None

    def _response(
        self, request: AgentRequest, text: str, value: Any, calls: tuple[ToolCall, ...] = ()
    ) -> AgentResponse:
        prompt_text = "\n".join(m.get("content") or "" for m in request.messages)
        prompt_tokens = len(prompt_text.split())
        completion_tokens = len(text.replace(",", " ").split())
        usage = AgentUsage(
            prompt_tokens,
            completion_tokens,
            cost_micros(self.prices, request.model, prompt_tokens, completion_tokens),
        )
        return AgentResponse(text=text, usage=usage, json=value, tool_calls=calls)

    def _tool_turn(self, request: AgentRequest) -> AgentResponse:
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        tools = [[t.name, t.description, t.input_schema] for t in request.tools]
        rng = _rng([request.model, request.messages, tools])
        words = prompt_words(
            "\n".join(m.get("content") or "" for m in request.messages if m["role"] in ("user", "tool"))
        )
        if self.script is not None:
            step = self.script[turn] if turn < len(self.script) else None
        else:
            step = {"tool_calls": [{"name": t.name} for t in request.tools]} if turn == 0 else None
        if step is None:
            text, value = self._answer(request, rng, words)
            return self._response(request, text, value)
        if "answer" in step:
            answer = step["answer"]
            if isinstance(answer, str):  # text, parsed (or not) by the caller like a model's
                return self._response(request, answer, None)
            return self._response(request, orjson.dumps(answer).decode(), answer)
        by_name: dict[str, ToolSpec] = {t.name: t for t in request.tools}
        calls = []
        for i, call in enumerate(step["tool_calls"]):
            if "arguments" in call:
                arguments = call["arguments"]
            else:
                tool = by_name.get(call["name"])
                arguments = build_instance(tool.input_schema, rng, words) if tool is not None else {}
            calls.append(ToolCall(f"call_{turn}_{i}", call["name"], arguments))
        text = orjson.dumps([[c.name, c.arguments] for c in calls]).decode()
        # the text of a tool-call turn is empty, as a model's usually is; usage counts the calls
        response = self._response(request, text, None, tuple(calls))
        return AgentResponse(text="", usage=response.usage, tool_calls=response.tool_calls)
