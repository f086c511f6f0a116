"""The handler of the stopping chaos scenarios, loaded by subprocess workers (`--module`).

`chaos.spans` records each execution's start and end (wall ms, its worker's pid) as one JSON
line per edge in `$CHAOS_SPANS_DIR/<pid>.jsonl`, written unbuffered with O_APPEND (one
`write` per line: a SIGSTOP or SIGKILL never leaves half a line, and a start without an end
is a handler that never returned). It runs `ms` (`ms_retry` from attempt 2 on), fails
retryably on the attempts up to `fail_until`, and once cancelled (a CancelActivation or its
deadline) drains `stop_ms` before it stops: a handler that owns something it must put back.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from processors.executors import ActionContext, RetryableError, action

_SPANS_DIR = os.environ.get("CHAOS_SPANS_DIR", "")


def _edge(edge: str, ctx: ActionContext, **extra: Any) -> None:
    if not _SPANS_DIR:
        return
    line = orjson.dumps(
        {
            "edge": edge,
            "run": ctx.run_id,
            "node": ctx.node,
            "lineage": ctx.lineage,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "t": int(time.time() * 1000),
            **extra,
        }
    )
    fd = os.open(os.path.join(_SPANS_DIR, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)


@action("chaos.spans")
def spans(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    _edge("start", ctx)
    how = "returned"
    try:
        ms = input.get("ms_retry", input.get("ms", 500)) if ctx.attempt > 1 else input.get("ms", 500)
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            if ctx.is_cancelled:
                how = "cancelled"
                time.sleep(input.get("stop_ms", 0) / 1000)  # drains before it stops
                ctx.check_cancelled()
            time.sleep(0.01)
        if ctx.attempt <= input.get("fail_until", 0):
            how = "failed"
            raise RetryableError(f"attempt {ctx.attempt} fails on purpose")
        return {"attempt": ctx.attempt}
    finally:
        _edge("end", ctx, how=how)
