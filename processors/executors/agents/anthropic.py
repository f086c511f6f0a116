"""An Anthropic Messages API provider over HTTP (httpx).

POST `{base_url}/v1/messages` with `x-api-key`, `anthropic-version: 2023-06-01` and the body
`{model, max_tokens, system?, messages, tools?}`. The neutral transcript (base.py) is converted
by `wire_messages`: system messages become the `system` string; an assistant's tool calls become
`tool_use` blocks; tool results become `tool_result` blocks in a user message; adjacent messages
of the same role are merged into one (the API wants user and assistant to alternate), with a
user message's tool results first (the API wants them before any text). The API has no JSON
mode: with an output schema and no tools, the system prompt asks for JSON (unless it already
does). Errors map as for the OpenAI-compatible provider (http_json.py); the API key never
appears in a message or receipt."""

from __future__ import annotations

from typing import Any

import httpx

from processors.executors.agents.base import (
    AgentRequest,
    AgentResponse,
    AgentUsage,
    Message,
    ToolCall,
    cost_micros,
    priced_model,
    schema_instruction,
)
from processors.executors.agents.http_json import malformed, post_json, timeout_for

ANTHROPIC_VERSION = "2023-06-01"


def _tool_input(arguments: Any) -> dict[str, Any]:
    # the API wants an object; arguments another provider kept raw (invalid JSON) are wrapped,
    # not dropped, so the model still sees what it sent
    return arguments if isinstance(arguments, dict) else {"value": arguments}


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    role = message["role"]
    if role == "tool":
        return "user", [
            {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
                "is_error": bool(message.get("is_error", False)),
            }
        ]
    text = message.get("content") or ""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if role == "assistant":
        blocks += [
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _tool_input(c["arguments"])}
            for c in message.get("tool_calls") or ()
        ]
    return ("assistant" if role == "assistant" else "user"), blocks


def wire_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) for the Messages API."""
    system = "\n\n".join(m.get("content") or "" for m in messages if m["role"] == "system")
    merged: list[tuple[str, list[dict[str, Any]]]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        role, blocks = _blocks(m)
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, blocks))
    out: list[dict[str, Any]] = []
    for role, blocks in merged:
        if role == "user":  # tool results first; stable, so each group keeps its order
            blocks.sort(key=lambda b: b["type"] != "tool_result")
        if not blocks:  # the API refuses empty text blocks: an empty message stays a plain ""
            out.append({"role": role, "content": ""})
        elif len(blocks) == 1 and blocks[0]["type"] == "text":
            out.append({"role": role, "content": blocks[0]["text"]})
        else:
            out.append({"role": role, "content": blocks})
    return system, out


class AnthropicProvider:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        timeout_s: float = 60.0,
        prices: dict[str, tuple[int, int]] | None = None,
        max_tokens: int = 4096,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.prices = prices or {}
        self.max_tokens = max_tokens
        self._client: httpx.AsyncClient | None = None

    def _body(self, request: AgentRequest) -> dict[str, Any]:
        system, messages = wire_messages(request.messages)
        if request.output_schema is not None and not request.tools:
            instruction = schema_instruction(request.output_schema)
            if instruction not in system:
                system = f"{instruction}\n\n{system}" if system else instruction
        body: dict[str, Any] = {
            "model": self.model or request.model,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in request.tools
            ]
        return body

    async def complete(self, request: AgentRequest) -> AgentResponse:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        if request.idempotency_key:
            headers["idempotency-key"] = request.idempotency_key
        url = f"{self.base_url}/v1/messages"
        data = await post_json(
            self._client, url, self._body(request), headers, timeout_for(self.timeout_s, request.timeout_s)
        )
        try:
            blocks = data["content"]
            if not isinstance(blocks, list):
                raise TypeError("content is not a list")
            texts: list[str] = []
            calls: list[ToolCall] = []
            for block in blocks:
                if block["type"] == "text":
                    if not isinstance(block["text"], str):
                        raise TypeError("text is not a string")
                    texts.append(block["text"])
                elif block["type"] == "tool_use":
                    if not isinstance(block["id"], str) or not isinstance(block["name"], str):
                        raise TypeError("tool_use id and name must be strings")
                    calls.append(ToolCall(block["id"], block["name"], block.get("input", {})))
                # other blocks (thinking, ...) carry nothing the engine uses
            raw_usage = data.get("usage") or {}
            prompt_tokens = int(raw_usage.get("input_tokens") or 0)
            completion_tokens = int(raw_usage.get("output_tokens") or 0)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise malformed(httpx.URL(url).host) from None
        model = priced_model(self.prices, data.get("model"), self.model, request.model)
        usage = AgentUsage(
            prompt_tokens,
            completion_tokens,
            cost_micros(self.prices, model, prompt_tokens, completion_tokens),
        )
        return AgentResponse(
            text="".join(texts), usage=usage, tool_calls=tuple(calls) if request.tools else ()
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
