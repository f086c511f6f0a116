"""The handler of the stopping tests: it counts its executions and records each one's time
span, and takes `stop_ms` to stop once cancelled (a handler draining what it owns)."""

from __future__ import annotations

import threading
import time
from typing import Any

from processors.executors import ActionContext, action

# (run_id, node, lineage, attempt, start_ms, end_ms) of every execution, in this process
SPANS: list[tuple[str, str, str, int, int, int]] = []
RUNNING: dict[tuple[str, str, str, int], int] = {}  # executions still in the handler
_LOCK = threading.Lock()


@action("test.spans")
def spans(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    start = int(time.time() * 1000)
    ident = (ctx.run_id, ctx.node, ctx.lineage, ctx.attempt)
    with _LOCK:
        RUNNING[ident] = start
    try:
        end = time.monotonic() + input.get("ms", 1000) / 1000
        while time.monotonic() < end:
            if ctx.is_cancelled:
                time.sleep(input.get("stop_ms", 0) / 1000)  # drains before it stops
                ctx.check_cancelled()
            time.sleep(0.01)
        return {"attempt": ctx.attempt}
    finally:
        with _LOCK:
            del RUNNING[ident]
            SPANS.append((*ident, start, int(time.time() * 1000)))
