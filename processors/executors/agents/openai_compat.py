"""An OpenAI-compatible chat-completions provider over HTTP (httpx).

POST `{base_url}/chat/completions` with `model` and `messages`; with an output schema it asks
for `response_format: {type: json_schema}`; with tools it sends
`tools: [{type: function, function: {name, description, parameters}}]` and parses
`choices[0].message.tool_calls` (each `arguments` a JSON string; one that is not valid JSON is
kept as the raw string, so the engine can tell the model). 429, 5xx, network errors and timeouts
are retryable; other 4xx are not. The API key never appears in a message or receipt."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from processors.executors.agents.base import (
    AgentRequest,
    AgentResponse,
    AgentUsage,
    Message,
    ToolCall,
    cost_micros,
    priced_model,
)
from processors.executors.agents.http_json import malformed, post_json, timeout_for


def _arguments_text(arguments: Any) -> str:
    # a raw string is what the model sent (maybe invalid JSON): give it back verbatim
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The neutral transcript as chat-completions messages. A tool result's `is_error` has no
    field there: the result's content is all the model sees."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        elif role == "assistant" and m.get("tool_calls"):
            out.append(
                {
                    "role": "assistant",
                    # content may be null beside tool calls; an empty string is not text
                    "content": m.get("content") or None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": _arguments_text(c["arguments"])},
                        }
                        for c in m["tool_calls"]
                    ],
                }
            )
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return out


def _parse_arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw  # some compatible servers send the object itself
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise TypeError("tool_calls is not a list")
    calls = []
    for raw in raw_calls:
        function = raw["function"]
        call_id, name = raw["id"], function["name"]
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise TypeError("tool call id and name must be strings")
        calls.append(ToolCall(call_id, name, _parse_arguments(function.get("arguments", "{}"))))
    return tuple(calls)


class OpenAICompatProvider:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        timeout_s: float = 60.0,
        prices: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.prices = prices or {}
        self._client: httpx.AsyncClient | None = None

    def _body(self, request: AgentRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model or request.model,
            "messages": wire_messages(request.messages),
        }
        if request.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.output_schema, "strict": False},
            }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }
                for t in request.tools
            ]
        return body

    async def complete(self, request: AgentRequest) -> AgentResponse:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        headers = {"content-type": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        if request.idempotency_key:
            headers["idempotency-key"] = request.idempotency_key
        url = f"{self.base_url}/chat/completions"
        data = await post_json(
            self._client, url, self._body(request), headers, timeout_for(self.timeout_s, request.timeout_s)
        )
        try:
            message = data["choices"][0]["message"]
            text = message.get("content") or ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
            # without tools offered, a stray tool_calls field is none of this request's business
            tool_calls = _tool_calls(message) if request.tools else ()
            raw_usage = data.get("usage") or {}
            prompt_tokens = int(raw_usage.get("prompt_tokens") or 0)
            completion_tokens = int(raw_usage.get("completion_tokens") or 0)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise malformed(httpx.URL(url).host) from None
        model = priced_model(self.prices, data.get("model"), self.model, request.model)
        usage = AgentUsage(
            prompt_tokens,
            completion_tokens,
            cost_micros(self.prices, model, prompt_tokens, completion_tokens),
        )
        return AgentResponse(text=text, usage=usage, tool_calls=tool_calls)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
