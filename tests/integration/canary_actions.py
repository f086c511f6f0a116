"""Handlers that try to get the canary secret out of the worker (test_security_canary.py loads
them with `runfold worker --module`). Each resolves the secret the ordinary way, then leaks it
the way its name says; none of these leaks may reach a topic, a log line, a metric or a query."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any
from urllib.parse import quote

from processors.executors import ActionContext, ActionError, action

log = logging.getLogger("canary.handler")


def _encoded(secret: str, mode: str) -> Any:
    raw = secret.encode()
    forms: dict[str, Any] = {
        "raw": secret,
        "upper": secret.upper(),
        "lower": secret.lower(),
        "base64": base64.b64encode(raw).decode(),
        "base64url": base64.urlsafe_b64encode(raw).decode(),
        "unpadded": base64.b64encode(b"x" + raw).decode().rstrip("="),
        "basic": base64.b64encode(b"u:" + raw).decode(),
        "url": quote(secret, safe=""),
        "json": json.dumps({"t": secret}),
        "repr": repr(raw),
        "hex": raw.hex(),
        "partial": secret[: len(secret) * 2 // 3],
        "key": {secret: 1},
        "list": ["ok", [{"deep": secret.swapcase()}]],
    }
    return forms[mode]


@action("canary.output")
def output(ctx: ActionContext, input: dict[str, Any]) -> Any:
    """Returns the secret written in `input.mode`."""
    return {"leak": _encoded(ctx.secrets.get("canary"), input["mode"])}


@action("canary.number")
def number(ctx: ActionContext, input: Any) -> Any:
    """A numeric secret returned as a JSON number."""
    return {"n": int(ctx.secrets.get("canary_num"))}


@action("canary.raise")
async def raise_error(ctx: ActionContext, input: dict[str, Any]) -> Any:
    """A classified error whose message carries the secret (raw, upper-cased, base64)."""
    secret = ctx.secrets.get("canary")
    raise ActionError(
        "ExecutionFailed",
        f"bad token {secret} / {secret.upper()} / {base64.b64encode(secret.encode()).decode()}",
        retryable=False,
    )


@action("canary.crash")
def crash(ctx: ActionContext, input: Any) -> Any:
    """An unexpected exception (sync handler) with the secret's repr in it."""
    secret = ctx.secrets.get("canary")
    raise ValueError(f"could not parse {secret!r} ({secret.encode()!r})")


@action("canary.log")
def log_it(ctx: ActionContext, input: Any) -> Any:
    """Logs the secret through the context's logger, another logger and an exception."""
    secret = ctx.secrets.get("canary")
    ctx.log.warning("using token %s", secret)
    log.error("token in base64: %s", base64.b64encode(secret.encode()).decode())
    try:
        raise RuntimeError(f"while using {quote(secret, safe='')}")
    except RuntimeError:
        log.exception("it failed")
    return {"logged": True}


@action("canary.intrude")
def intrude(ctx: ActionContext, input: Any) -> Any:
    """From a definition the policy does not name: the secret must not resolve at all."""
    return {"got": ctx.secrets.get("canary")}
