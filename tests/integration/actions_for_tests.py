"""Actions the executor integration tests load into workers (`runfold worker --module <this file>`)."""

from __future__ import annotations

import time
from typing import Any

from processors.executors import ActionContext, NonRetryableError, action


@action("test.slow")
def slow(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """Sync: works for input.ms, checking for cancellation every 20 ms."""
    end = time.monotonic() + input.get("ms", 1000) / 1000
    while time.monotonic() < end:
        ctx.check_cancelled()
        time.sleep(0.02)
    return {"slept": input.get("ms", 1000), "attempt": ctx.attempt, "key": ctx.idempotency_key}


@action("test.reject")
def reject(ctx: ActionContext, input: Any) -> Any:
    raise NonRetryableError("input can never work", code="InvalidInput")


@action("test.boom")
async def boom(ctx: ActionContext, input: Any) -> Any:
    raise ValueError("unexpected")


@action("test.identity")
async def identity(ctx: ActionContext, input: Any) -> dict[str, Any]:
    ctx.usage(prompt_tokens=1, completion_tokens=2, cost_micros=3)
    return {
        "run": ctx.run_id,
        "node": ctx.node,
        "lineage": ctx.lineage,
        "attempt": ctx.attempt,
        "key": ctx.idempotency_key,
        "input": input,
    }
