"""One JSON POST to an agent provider, with the error mapping every HTTP provider shares.

429, 5xx and network errors are `RetryableError`; a timeout is `ActionError("Timeout")`,
retryable; other 4xx are `NonRetryableError`. Messages name the host and the status only: never
the URL's credentials, the headers (where the API key is) or the response body."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from processors.executors.errors import ActionError, NonRetryableError, RetryableError


def malformed(host: str) -> RetryableError:
    return RetryableError(f"agent provider {host} sent a malformed completion")


async def post_json(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """POST `body` as JSON and return the decoded JSON object of a 2xx answer."""
    host = httpx.URL(url).host
    try:
        response = await client.post(
            url, content=orjson.dumps(body), headers=headers, timeout=max(timeout_s, 0.001)
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
    except orjson.JSONDecodeError:
        raise malformed(host) from None
    if not isinstance(data, dict):
        raise malformed(host)
    return data


def timeout_for(default_s: float, request_timeout_s: float | None) -> float:
    """The provider's own timeout, shortened to what is left of the activation's deadline."""
    # `is not None`: 0.0 (no time left) is a deadline, not the absence of one
    return min(default_s, request_timeout_s) if request_timeout_s is not None else default_s
