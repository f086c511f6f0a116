"""Actions the demo's worker serves (`runfold worker --module processors.demo.actions`).

They are deterministic given the activation (no hidden state), so a run replays to the
same outcome and a worker restart changes nothing:

- `demo.flaky`  fails (retryable) on attempts 1..fail_times, then succeeds — shows retries.
- `demo.search` a pretend web search: a few notes per query after a short pause.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from processors.executors import ActionContext, RetryableError, action


@action("demo.flaky")
def flaky(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    fail_times = int((input or {}).get("fail_times", 1))
    if ctx.attempt <= fail_times:
        raise RetryableError(f"transient failure on attempt {ctx.attempt} of a flaky dependency")
    return {"attempt": ctx.attempt, "key": (input or {}).get("key"), "idempotency_key": ctx.idempotency_key}


@action("demo.search")
def search(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    query = str((input or {}).get("query", ""))
    time.sleep(float((input or {}).get("delay_ms", 50)) / 1000)
    ctx.check_cancelled()
    digest = hashlib.sha256(query.encode()).hexdigest()
    return {
        "query": query,
        "source": f"https://example.org/{digest[:10]}",
        "snippet": f"Findings about {query} ({digest[10:16]})",
    }
