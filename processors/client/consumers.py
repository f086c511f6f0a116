"""The steps of a run left `scheduled` on a queue, for the hint `runs get` / `runs watch` give
when no worker consumes that queue (topology/consumers.py asks the brokers which)."""

from __future__ import annotations


def scheduled_queues(steps: dict[str, dict[str, object]]) -> dict[str, list[str]]:
    """queue -> the step keys scheduled (dispatched, not yet accepted) on it."""
    out: dict[str, list[str]] = {}
    for key, step in sorted(steps.items()):
        queue = step.get("queue")
        if step.get("status") == "scheduled" and isinstance(queue, str):
            out.setdefault(queue, []).append(key)
    return out
