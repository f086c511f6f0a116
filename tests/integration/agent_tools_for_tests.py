"""Tools the agent-loop integration tests load into workers (`runfold worker --module <this file>`).

`loop.record` counts its own executions: each one appends a line to the file named by
RUNFOLD_TEST_TOOL_LOG when it starts and when it finishes (lineage, attempt, dispatch id, pid,
wall times), so a test can prove every tool call ran to completion exactly once."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from processors.executors import ActionContext, NonRetryableError, action


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("RUNFOLD_TEST_TOOL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


@action("loop.record")
def record(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    ident = {"lineage": ctx.lineage, "attempt": ctx.attempt, "key": ctx.idempotency_key, "pid": os.getpid()}
    _log({**ident, "at": "start", "t": time.time()})
    if args.get("query") == "broken":  # a tool that fails: its error goes back to the model
        _log({**ident, "at": "failed", "t": time.time()})
        raise NonRetryableError("the knowledge base is offline", code="ExecutionFailed")
    end = time.monotonic() + float(args.get("ms", 0)) / 1000
    while time.monotonic() < end:
        ctx.check_cancelled()
        time.sleep(0.02)
    _log({**ident, "at": "end", "t": time.time()})
    return {
        "query": args.get("query"),
        "result": f"found {args.get('query')}",
        "pad": "x" * int(args.get("pad", 0)),
    }
