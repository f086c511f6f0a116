"""An OpenAI-compatible chat-completions provider over HTTP (httpx).

POST `{base_url}/chat/completions` with `model` and `messages`; with an output schema it asks
for `response_format: {type: json_schema}`. 429, 5xx, network errors and timeouts are
retryable; other 4xx are not. The API key never appears in a message or receipt."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from processors.executors.agents.base import AgentRequest, AgentResponse, AgentUsage, cost_micros
from processors.executors.errors import ActionError, NonRetryableError, RetryableError


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
        body: dict[str, Any] = {"model": self.model or request.model, "messages": request.messages}
        if request.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.output_schema, "strict": False},
            }
        return body

    async def complete(self, request: AgentRequest) -> AgentResponse:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        headers = {"content-type": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        if request.idempotency_key:
            headers["idempotency-key"] = request.idempotency_key
        timeout = min(self.timeout_s, request.timeout_s) if request.timeout_s else self.timeout_s
        host = httpx.URL(self.base_url).host
        try:
            response = await self._client.post(
                f"{self.base_url}/chat/completions",
                content=orjson.dumps(self._body(request)),
                headers=headers,
                timeout=max(timeout, 0.001),
            )
        except httpx.TimeoutException:
            raise ActionError("Timeout", f"agent provider {host} timed out", True) from None
        except httpx.HTTPError as exc:
            raise RetryableError(f"agent provider {host} request failed ({type(exc).__name__})") from None
        status = response.status_code
        if status == 429 or status >= 500:
            raise RetryableError(f"agent provider {host} answered HTTP {status}")
        if status >= 400:
            raise NonRetryableError(f"agent provider {host} answered HTTP {status}")
        try:
            data = orjson.loads(response.content)
            text = data["choices"][0]["message"]["content"] or ""
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise RetryableError(f"agent provider {host} sent a malformed completion") from None
        raw_usage = data.get("usage") or {}
        prompt_tokens = int(raw_usage.get("prompt_tokens") or 0)
        completion_tokens = int(raw_usage.get("completion_tokens") or 0)
        model = str(data.get("model") or self.model or request.model)
        usage = AgentUsage(
            prompt_tokens,
            completion_tokens,
            cost_micros(self.prices, model, prompt_tokens, completion_tokens),
        )
        return AgentResponse(text=text, usage=usage)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
