"""Built-in actions every worker serves: `echo`, `noop`, `sleep`, `http.request`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import orjson

from processors.executors.context import ActionContext
from processors.executors.errors import ActionError, Cancelled, NonRetryableError, RetryableError
from processors.executors.sdk import ActionRegistry
from processors.executors.settings import WorkerSettings


async def echo(ctx: ActionContext, input: Any) -> Any:
    """Returns its input unchanged."""
    return input


async def noop(ctx: ActionContext, input: Any) -> Any:
    """Returns `{}` at once (benchmarks)."""
    return {}


async def sleep(ctx: ActionContext, input: Any) -> Any:
    """`{"ms": 1500}`: waits, cancellable; returns `{"slept_ms": ms}`."""
    ms = input.get("ms") if isinstance(input, dict) else input
    if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
        raise NonRetryableError("sleep needs input {\"ms\": <non-negative number>}", code="InvalidInput")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.wait_cancelled(), timeout=ms / 1000)
    ctx.check_cancelled()
    return {"slept_ms": ms}


def host_allowed(url: httpx.URL, allowed: list[str]) -> bool:
    """`host`, `host:port` or `*.domain` entries; deny when the list is empty."""
    host = (url.host or "").lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    for entry in allowed:
        entry = entry.strip().lower()
        if not entry:
            continue
        name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want_port and (not want_port.isdigit() or int(want_port) != port):
            continue
        if name == host or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


class HttpRequestAction:
    """`http.request`: `{method, url, headers?, params?, json? | body?, timeout_ms?}` ->
    `{status, headers: {content-type}, json | text}`.

    Deny by default: the URL's host must match `http_allowed_hosts`. `$secret` handles anywhere
    in the input are resolved here (capability `secret:<name>` required). Redirects are not
    followed. A response that echoes a resolved secret is `InvalidOutput`. 5xx, 429, network
    errors and timeouts are retryable; other 4xx are not."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._allowed = list(settings.http_allowed_hosts)
        self._timeout_s = settings.http_timeout_s
        self._max_bytes = settings.http_max_response_bytes
        self._client: httpx.AsyncClient | None = None

    async def call(self, ctx: ActionContext, input: Any) -> Any:
        if not isinstance(input, dict) or not isinstance(input.get("url"), str):
            raise NonRetryableError("http.request needs input {\"url\": ..., \"method\": ...}", code="InvalidInput")
        try:
            url = httpx.URL(input["url"])
        except Exception as exc:  # httpx raises several types for bad URLs
            raise NonRetryableError(f"http.request: invalid url ({type(exc).__name__})", code="InvalidInput") from None
        if url.scheme not in ("http", "https"):
            raise NonRetryableError("http.request: only http and https URLs", code="InvalidInput")
        if not host_allowed(url, self._allowed):
            raise ActionError("PermissionDenied", f"http.request: host {url.host!r} is not allowed on this worker")
        request = ctx.secrets.resolve({k: v for k, v in input.items() if k != "url"})
        method = str(request.get("method", "GET")).upper()
        timeout_s = request.get("timeout_ms", self._timeout_s * 1000) / 1000
        remaining = ctx.remaining_ms()
        if remaining is not None:
            timeout_s = max(0.001, min(timeout_s, remaining / 1000))
        kwargs: dict[str, Any] = {"headers": request.get("headers") or {}, "params": request.get("params")}
        if "json" in request:
            kwargs["content"] = orjson.dumps(request["json"])
            kwargs["headers"] = {"content-type": "application/json", **kwargs["headers"]}
        elif "body" in request:
            kwargs["content"] = str(request["body"]).encode()
        try:
            body, status, content_type = await self._send(method, url, timeout_s, kwargs)
        except httpx.TimeoutException:
            raise ActionError("Timeout", f"http.request: {method} {url.host} timed out", True) from None
        except httpx.HTTPError as exc:
            raise RetryableError(f"http.request: {method} {url.host} failed ({type(exc).__name__})") from None
        text = body.decode("utf-8", errors="replace")
        if any(secret in text for secret in ctx.secrets.resolved):
            raise ActionError("InvalidOutput", "http.request: the response echoed a resolved secret")
        if status >= 500 or status == 429:
            raise RetryableError(f"http.request: {method} {url.host} answered HTTP {status}")
        if status >= 400:
            raise NonRetryableError(f"http.request: {method} {url.host} answered HTTP {status}")
        out: dict[str, Any] = {"status": status, "headers": {"content-type": content_type}}
        if "json" in content_type:
            try:
                out["json"] = orjson.loads(body)
            except orjson.JSONDecodeError:
                out["text"] = text
        else:
            out["text"] = text
        return out

    async def _send(
        self, method: str, url: httpx.URL, timeout_s: float, kwargs: dict[str, Any]
    ) -> tuple[bytes, int, str]:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        async with self._client.stream(method, url, timeout=timeout_s, **kwargs) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._max_bytes:
                    raise NonRetryableError(f"http.request: response larger than {self._max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks), response.status_code, response.headers.get("content-type", "")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def builtin_registry(settings: WorkerSettings) -> ActionRegistry:
    reg = ActionRegistry()
    reg.register("echo", echo)
    reg.register("noop", noop)
    reg.register("sleep", sleep)
    reg.register("http.request", HttpRequestAction(settings).call)
    return reg


__all__ = ["Cancelled", "HttpRequestAction", "builtin_registry", "echo", "host_allowed", "noop", "sleep"]
