"""Deterministic identities: dispatch ids, instance keys, child run ids, timer ids, record ids.

Everything here is a pure function of its arguments so that a replay derives the same ids
(docs/messages.md fixes the dispatch id and child run id formulas).
"""

from __future__ import annotations

import hashlib
import re

_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")


def control_character(run_id: str) -> str | None:
    """The first control character in `run_id`, if any: run ids are printable text (the
    processor's store joins a run id and a timer id with \x1f, so "a" and "a\x1fb" would
    share keys). StartRun rejects such an id; the client refuses to send one."""
    bad = _CONTROL_CHARACTER.search(run_id)
    return bad.group() if bad else None


def dispatch_id(run_id: str, node: str, lineage: str, attempt: int) -> str:
    """The idempotency key of one attempt of one node instance (docs/messages.md)."""
    raw = f"{run_id}\x1f{node}\x1f{lineage}\x1f{attempt}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def instance_key(node: str, lineage: str) -> str:
    """Key of a node instance in the run state: `node`, or `node[lineage]` when mapped."""
    return f"{node}[{lineage}]" if lineage else node


def order_key(node: str, lineage: str) -> tuple[str, int]:
    """The deterministic order of node instances: by node, then map index (unmapped first)."""
    return (node, int(lineage) if lineage else -1)


def child_run_id(parent_run_id: str, node: str, lineage: str, attempt: int) -> str:
    """`{parent}/{node}`, then `[{lineage}]` when mapped, then `#{attempt}` when attempt > 1."""
    out = f"{parent_run_id}/{node}"
    if lineage:
        out += f"[{lineage}]"
    if attempt > 1:
        out += f"#{attempt}"
    return out


def step_timer_id(kind: str, dispatch: str) -> str:
    """Timer of one attempt (`node_timeout`, `lease_expiry`, `retry_backoff`, `sleep`,
    `wait_timeout`). Dispatch ids embed the run id, so these are globally unique."""
    return f"{kind}:{dispatch}"


def wall_timer_id(run_id: str, epoch: int) -> str:
    """The wall-time timer; `epoch` counts resumes so a re-armed timer has a fresh id."""
    return f"wall_time:{run_id}:{epoch}"


def event_record_id(run_id: str, sequence: int) -> str:
    return f"{run_id}:{sequence}"


def rejection_record_id(run_id: str, input_record_id: str) -> str:
    """A RunRejected has sequence 0; its id derives from the rejected input record."""
    return f"{run_id}:rejected:{input_record_id}"
