"""Built-in actions every worker serves: `echo`, `noop`, `sleep`, `http.request`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import orjson

from processors.executors.context import ActionContext
from processors.executors.destinations import (
    AddressGuard,
    DestinationRefused,
    GuardedTransport,
    first_match,
    origin_text,
    parse_entry,
    url_origin,
)
from processors.executors.errors import ActionError, Cancelled, NonRetryableError, RetryableError
from processors.executors.registry import ActionRegistry
from processors.executors.secrets import SECRET_KEY
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
        raise NonRetryableError('sleep needs input {"ms": <non-negative number>}', code="InvalidInput")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.wait_cancelled(), timeout=ms / 1000)
    ctx.check_cancelled()
    return {"slept_ms": ms}


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_KEYS = frozenset({"url", "method", "headers", "params", "json", "body", "timeout_ms"})


def host_allowed(url: httpx.URL, allowed: list[str]) -> bool:
    """The URL's scheme, host and port match an allow-list entry (destinations.py); deny when
    the list is empty."""
    return first_match([parse_entry(e) for e in allowed], url) is not None


def _invalid(message: str) -> NonRetryableError:
    return NonRetryableError(f"http.request: {message}", code="InvalidInput")


class HttpRequestAction:
    """`http.request`: `{url, method?, headers?, params?, json? | body?, timeout_ms?}` ->
    `{status, headers: {content-type}, json | text}`.

    Deny by default: the URL's scheme, host and port must match `http_allowed_hosts`, and the
    address connected to must be public unless allowed (destinations.py, checked at connect
    time). `$secret` handles are resolved in `headers` values, `params` values and the body
    (`json`, `body`) only; `url`, `method` and `timeout_ms` are plain values (`method` one of
    METHODS, no `Host` header: the url names the host), and no error message repeats an input
    value. A request that carries a secret goes
    only where the secret's policy rule lets it (`hosts`: https unless an entry says http://).
    Redirects are not followed. A response that echoes a secret, in any form the redactor finds,
    is `InvalidOutput`. 5xx, 429, network errors and timeouts are retryable; other 4xx are not."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._allowed = [parse_entry(e) for e in settings.http_allowed_hosts]
        self._guard = AddressGuard([e.host for e in self._allowed], settings.http_allowed_networks)
        self._timeout_s = settings.http_timeout_s
        self._max_bytes = settings.http_max_response_bytes
        self._client: httpx.AsyncClient | None = None

    def _parse(self, input: Any) -> tuple[httpx.URL, str, float | None]:
        if not isinstance(input, dict) or not isinstance(input.get("url"), str):
            raise _invalid(
                'needs input {"url": "<string>", "method": ...} (the url is never a secret handle)'
            )
        unknown = sorted(str(k) for k in input if k not in _KEYS)
        if unknown:
            raise _invalid(f"unknown input keys {unknown[:5]} (takes {sorted(_KEYS)})")
        try:
            url = httpx.URL(input["url"])
        except Exception as exc:  # httpx raises several types for bad URLs
            raise _invalid(f"invalid url ({type(exc).__name__})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise _invalid("only http and https URLs with a host")
        method = input.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise _invalid(
                f"method must be one of {', '.join(METHODS)} (a plain string, never a secret handle)"
            )
        timeout_ms = input.get("timeout_ms")
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or timeout_ms <= 0
        ):
            raise _invalid("timeout_ms must be a positive number")
        for key in ("headers", "params"):
            if input.get(key) is not None and (not isinstance(input[key], dict) or SECRET_KEY in input[key]):
                raise _invalid(f"{key} must be an object of names to values (a handle goes in a value)")
        if any(str(name).strip().lower() == "host" for name in input.get("headers") or {}):
            # the destination is the url's: a Host of its own would ask the allowed address (a
            # shared ingress, a CDN) for another host, one no allow-list entry or rule names
            raise _invalid("the Host header comes from the url (no Host in headers)")
        return url, method.upper(), timeout_ms / 1000 if timeout_ms is not None else None

    async def call(self, ctx: ActionContext, input: Any) -> Any:
        url, method, timeout_s = self._parse(input)
        if first_match(self._allowed, url) is None:
            raise ActionError(
                "PermissionDenied",
                f"http.request: {origin_text(*url_origin(url))} is not in this worker's http_allowed_hosts",
            )
        headers = ctx.secrets.resolve(input.get("headers") or {})
        params = ctx.secrets.resolve(input.get("params"))
        ctx.secrets.check_destination(url)  # before the body: a refused request resolves no more
        body = ctx.secrets.resolve({k: input[k] for k in ("json", "body") if k in input})
        ctx.secrets.check_destination(url)
        if any(not isinstance(v, str | int | float) or isinstance(v, bool) for v in headers.values()):
            raise _invalid("header values must be strings or numbers")
        headers = {str(k): str(v) for k, v in headers.items()}
        timeout_s = timeout_s if timeout_s is not None else self._timeout_s
        remaining = ctx.remaining_ms()
        if remaining is not None:
            timeout_s = max(0.001, min(timeout_s, remaining / 1000))
        kwargs: dict[str, Any] = {"headers": headers, "params": params}
        if "json" in body:
            kwargs["content"] = orjson.dumps(body["json"])
            kwargs["headers"] = {"content-type": "application/json", **headers}
        elif "body" in body:
            kwargs["content"] = str(body["body"]).encode()
        where = url.host
        try:
            raw, status, content_type = await self._send(method, url, timeout_s, kwargs)
        except DestinationRefused as exc:
            raise ActionError("PermissionDenied", f"http.request: {exc}") from None
        except httpx.TimeoutException:
            raise ActionError("Timeout", f"http.request: {method} {where} timed out", True) from None
        except httpx.HTTPError as exc:
            raise RetryableError(f"http.request: {method} {where} failed ({type(exc).__name__})") from None
        text = raw.decode("utf-8", errors="replace")
        if ctx.secrets.redactor.find(text) or ctx.secrets.redactor.find(content_type):
            raise ActionError("InvalidOutput", "http.request: the response echoed a secret")
        if status >= 500 or status == 429:
            raise RetryableError(f"http.request: {method} {where} answered HTTP {status}")
        if status >= 400:
            raise NonRetryableError(f"http.request: {method} {where} answered HTTP {status}")
        out: dict[str, Any] = {"status": status, "headers": {"content-type": content_type}}
        if "json" in content_type:
            try:
                out["json"] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                out["text"] = text
        else:
            out["text"] = text
        return out

    async def _send(
        self, method: str, url: httpx.URL, timeout_s: float, kwargs: dict[str, Any]
    ) -> tuple[bytes, int, str]:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=False, trust_env=False, transport=GuardedTransport(self._guard)
            )
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


__all__ = [
    "METHODS",
    "Cancelled",
    "HttpRequestAction",
    "builtin_registry",
    "echo",
    "host_allowed",
    "noop",
    "sleep",
]
