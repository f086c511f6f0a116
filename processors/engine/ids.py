"""Deterministic identities: dispatch ids, instance keys, child run ids, timer ids, record ids.

Everything here is a pure function of its arguments so that a replay derives the same ids
(docs/messages.md fixes the dispatch id and child run id formulas).
"""

from __future__ import annotations

import hashlib
import re

from processors.engine.vocabulary import KEY_CHARS

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


def order_key(node: str, lineage: str) -> tuple[str, int, int, int]:
    """The deterministic order of node instances: by node, then map index (unmapped first), then
    an agent loop's turn and tool call (the step itself before its turns, a turn before its calls)."""
    if not lineage:
        return (node, -1, -1, -1)
    loop = split_loop_lineage(lineage)
    if loop is None:
        return (node, int(lineage), -1, -1)
    parent, turn, call = loop
    return (node, int(parent) if parent else -1, turn, -1 if call is None else call)


# An agent loop's model turns and tool calls are node instances of the agent node, below the
# step's own lineage: turn t is `{lineage}~{t}`, tool call i of turn t is `{lineage}~{t}.{i}`
# ("~" and "." never occur in a map index). docs/messages.md fixes the formula.
LOOP_MARK = "~"


def turn_lineage(parent: str, turn: int) -> str:
    return f"{parent}{LOOP_MARK}{turn}"


def call_lineage(parent: str, turn: int, call: int) -> str:
    return f"{parent}{LOOP_MARK}{turn}.{call}"


def is_loop_lineage(lineage: str) -> bool:
    return LOOP_MARK in lineage


def split_loop_lineage(lineage: str) -> tuple[str, int, int | None] | None:
    """(the step's own lineage, turn, call or None for the model turn), or None if `lineage` is
    not an agent loop's."""
    if LOOP_MARK not in lineage:  # the common case (every step of a run without agent loops)
        return None
    parent, _, rest = lineage.partition(LOOP_MARK)
    turn, dot, call = rest.partition(".")
    return parent, int(turn), int(call) if dot else None


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


def duplicate_record_id(run_id: str, input_record_id: str) -> str:
    """A CommandDeduplicated has sequence 0 too; its id derives from the repeated input record."""
    return f"{run_id}:duplicate:{input_record_id}"


def command_key(key: object, record_id: object) -> tuple[str | None, str | None]:
    """The idempotency key of a CancelRun, SignalRun or ResumeRun, and why it is refused if it is.

    An explicit key (1 to KEY_CHARS characters) is taken as it is, a longer one refused: a key is an
    id, and the run keeps it. Without one (null or ""), the record id is the key; one longer than
    KEY_CHARS is kept as "sha256:<hex of its UTF-8>" so the run's memory stays bounded. (None,
    None): a message with neither (an engine test's) is not deduplicated."""
    if key is not None and key != "":
        if type(key) is not str:
            return None, "idempotency_key must be a string"
        if len(key) > KEY_CHARS:
            return None, f"idempotency_key is {len(key)} characters; at most {KEY_CHARS} (a UUID is 36)"
        return key, None
    if type(record_id) is not str or not record_id:
        return None, None
    if len(record_id) <= KEY_CHARS:
        return record_id, None
    return "sha256:" + hashlib.sha256(record_id.encode("utf-8", "surrogatepass")).hexdigest(), None
