"""Receipts from executors, the child-run executor and the timer service.

Receipts are fenced by the step identity: the first terminal receipt of an attempt wins;
an exact duplicate changes nothing ("duplicate receipt"); a different terminal receipt for
a settled attempt is reported as ReceiptConflict; receipts for a stale attempt, an unknown
dispatch id or a finished run are dropped with the reason.
"""

from __future__ import annotations

from typing import Any

from processors.engine import budgets
from processors.engine.context import Decision, unchanged
from processors.engine.emitter import Emitter, failure, text
from processors.engine.errors import schema_problem
from processors.engine.ids import instance_key, is_loop_lineage
from processors.engine.nesting import json_size, nesting_reason, too_deep
from processors.engine.secrets import find_secret_literals
from processors.engine.state import RunState
from processors.engine.steps import fail_attempt, loop_tool, pause_for, retry_attempt, retry_exhausted
from processors.engine.stopping import ask_to_stop, finish_halt
from processors.engine.superstep import progress
from processors.engine.vocabulary import (
    EXECUTOR_KINDS,
    FAILURE_CODES,
    STOP_COMPLETED,
    STOP_CONFIRMED,
    STOP_FAILED,
    STOP_LEASE_EXPIRED,
    STOP_UNCONFIRMED,
    TERMINAL_RECEIPTS,
    TERMINAL_STATUSES,
    ZERO_USAGE,
    Usage,
)

Message = dict[str, Any]
# An executor's error text is kept in the step record and its events: cut it so a huge one
# cannot make those records too large for Kafka (outputs are bounded by max_payload_bytes).
MESSAGE_CHARS = 4000


def handle_receipt(state: RunState | None, msg: Message, em: Emitter) -> Decision:
    if state is None:
        return unchanged("unknown run")
    if state["status"] in TERMINAL_STATUSES:
        return unchanged("run finished")
    dropped = _timer(em, msg) if msg["type"] == "TimerFired" else _step_receipt(em, msg)
    if dropped is None and em.state["status"] == "running":
        progress(em)
    return em.decision(dropped)


def _current_step(em: Emitter, msg: Message) -> tuple[dict[str, Any] | None, str | None]:
    step = em.state["steps"].get(instance_key(msg["node"], msg["lineage"]))
    if step is None or step["dispatch_id"] is None:
        return None, "unknown dispatch id"
    if msg["attempt"] < step["attempt"]:
        return None, "stale attempt"
    if msg["attempt"] != step["attempt"] or msg["dispatch_id"] != step["dispatch_id"]:
        return None, "unknown dispatch id"
    return step, None


def _usage(msg: Message) -> Usage:
    raw = msg.get("usage") or {}
    if not isinstance(raw, dict):
        return dict(ZERO_USAGE)  # type: ignore[return-value]  # dict() of a TypedDict widens
    return {
        "prompt_tokens": _count(raw.get("prompt_tokens")),
        "completion_tokens": _count(raw.get("completion_tokens")),
        "cost_micros": _count(raw.get("cost_micros")),
    }


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _outcome(em: Emitter, step: dict[str, Any], msg: Message) -> tuple[str, Any, Usage]:
    """What a terminal receipt settles the attempt to: ("succeeded", output, usage) or
    ("failed", failure, usage). Pure, so a re-delivered receipt can be compared."""
    usage = _usage(msg)
    name, lineage = step["node"], step["lineage"]
    rtype = msg["type"]
    if rtype == "ActivationFailed":
        code = str(msg["code"]) if msg["code"] in FAILURE_CODES else "ExecutionFailed"
        return (
            "failed",
            failure(
                code,
                text(msg["message"], MESSAGE_CHARS),
                retryable=bool(msg.get("retryable")),
                node=name,
                lineage=lineage,
            ),
            usage,
        )
    if rtype == "ChildRunFinished":
        status = msg["status"]
        if status != "succeeded":
            child_failure = msg.get("failure")
            detail = (
                text(child_failure.get("message"), MESSAGE_CHARS) if isinstance(child_failure, dict) else ""
            )
            return (
                "failed",
                failure(
                    "ChildFailed",
                    f"child run {msg['child_run_id']} {status[:64]}: {detail}".rstrip(": "),
                    node=name,
                    lineage=lineage,
                ),
                usage,
            )
    output = msg.get("output")
    limit = em.ctx.ceilings.max_json_depth
    where = too_deep(output, limit, "output")
    if where is not None:
        return (
            "failed",
            failure(
                "InvalidOutput", nesting_reason(f"output of {name}", where, limit), node=name, lineage=lineage
            ),
            usage,
        )
    size, unwritable = json_size(output)
    if unwritable:
        return (
            "failed",
            failure("InvalidOutput", f"output of {name} {unwritable}", node=name, lineage=lineage),
            usage,
        )
    if size > em.ctx.ceilings.max_payload_bytes:
        return (
            "failed",
            failure(
                "InvalidOutput",
                f"output of {size} bytes exceeds max_payload_bytes {em.ctx.ceilings.max_payload_bytes}",
                node=name,
                lineage=lineage,
            ),
            usage,
        )
    secrets = find_secret_literals(output, "output")
    if secrets:
        return (
            "failed",
            failure(
                "InvalidOutput",
                f"secret material in output at {', '.join(secrets[:5])}",
                node=name,
                lineage=lineage,
            ),
            usage,
        )
    # an agent loop's turn and tool call outputs are not the step's: agent_loop.py checks its answer
    validator = None if is_loop_lineage(lineage) else em.pinned.node_output_validator(name)
    if validator is not None:
        problem = schema_problem(validator, output)
        if problem is not None:
            return (
                "failed",
                failure("InvalidOutput", f"output of {name} {problem}", node=name, lineage=lineage),
                usage,
            )
    return "succeeded", output, usage


def _settled_by(step: dict[str, Any], outcome: str, value: Any, usage: Usage) -> bool:
    """Whether a terminal receipt for the settled attempt `step` is the one that settled it
    (executors deliver at least once: an identical receipt is a no-op, seed 004). A retryable
    failure was recorded as it came, or, when it ended the retries, as the RetryExhausted that
    `fail_attempt` made of it."""
    if step["usage"] != usage:
        return False
    if step["status"] == "succeeded":
        return outcome == "succeeded" and step["output"] == value
    if outcome != "failed":
        return False
    recorded = step["failure"]
    if recorded == value:
        return True
    return (
        bool(value["retryable"])
        and recorded["code"] == "RetryExhausted"
        and recorded in (retry_exhausted(step, value, "attempts"), retry_exhausted(step, value, "budget"))
    )


def _step_receipt(em: Emitter, msg: Message) -> str | None:
    step, dropped = _current_step(em, msg)
    if step is None:
        return dropped
    rtype = msg["type"]
    status = step["status"]
    expected = "workflow" if rtype == "ChildRunFinished" else None
    if (expected == "workflow") != (step["kind"] == "workflow") or (
        expected is None and step["kind"] not in EXECUTOR_KINDS
    ):
        return f"{rtype} does not apply to a {step['kind']} step"
    if status == "cancelled":
        return "step already cancelled"
    if status == "skipped":  # a later superstep skipped the node; this receipt is of an older activation
        return "step skipped"
    if status == "stopping" and rtype != "ActivationAccepted" and rtype != "ActivationHeartbeat":
        settle_stopping(
            em, step, _stopped_how(msg), _usage(msg) if rtype in TERMINAL_RECEIPTS else ZERO_USAGE
        )
        return None
    stop = step.get("stop") or {}
    if (
        status != "stopping"
        and ("cause" in stop or stop.get("how") == STOP_LEASE_EXPIRED)
        and rtype != "ActivationHeartbeat"
    ):
        # settled from stopping (its evidence came already), or presumed dead when its lease
        # expired: a frozen worker's late receipts are dropped (semantics.md, Stopping)
        return "attempt already stopped"
    if rtype in TERMINAL_RECEIPTS:
        outcome, value, usage = _outcome(em, step, msg)
        if status in ("scheduled", "running"):
            if outcome == "succeeded":
                em.emit_step("StepSucceeded", step, output=value, usage=usage)
            else:
                fail_attempt(em, step, value, usage)
            return None
        if _settled_by(step, outcome, value, usage):
            return "duplicate receipt"
        settled = "succeeded" if status == "succeeded" else "failed"
        em.emit_step(
            "ReceiptConflict",
            step,
            receipt_type=rtype,
            reason=f"attempt already settled as {settled}; this {rtype} differs",
        )
        return None
    if rtype == "ActivationCancelled":
        if status in ("scheduled", "running"):
            reason = text(msg.get("reason"), MESSAGE_CHARS) or "no reason given"
            # an executor that gave up on its own (a shutdown): the next attempt may start
            # unless it says its handler has not stopped
            fail_attempt(
                em,
                step,
                failure(
                    "Cancelled",
                    f"activation cancelled by its executor: {reason}",
                    retryable=True,
                    node=step["node"],
                    lineage=step["lineage"],
                ),
                ZERO_USAGE,
                stop=_stopped_how(msg),
            )
            return None
        return "step already settled"
    worker = msg["worker_id"]
    lease_ms = msg.get("lease_ms")
    if type(lease_ms) is not int or lease_ms <= 0:
        return f"{rtype} without a positive lease_ms"
    if rtype == "ActivationAccepted":
        # a stopping attempt accepted now still runs: its lease is the one stop that can be assumed
        if status == "scheduled" or (status == "stopping" and step["worker_id"] is None):
            em.emit_step("StepStarted", step, worker_id=worker, lease_expires_ms=em.ts + lease_ms)
            return None
        if status in ("running", "stopping"):
            if step["worker_id"] == worker:
                return "duplicate receipt"
            em.emit_step(
                "ReceiptConflict",
                step,
                receipt_type=rtype,
                reason="activation already accepted by another worker",
            )
            return None
        return "step already settled"
    # ActivationHeartbeat
    if status == "scheduled" or (status == "stopping" and step["worker_id"] is None):
        return "heartbeat before acceptance"
    if status not in ("running", "stopping"):
        return "step already settled"
    if step["worker_id"] != worker:
        return "heartbeat from a worker that does not hold the lease"
    expires = em.ts + lease_ms
    if expires <= step["lease_expires_ms"]:
        return "heartbeat does not extend the lease"
    em.emit_step("StepLeaseExtended", step, worker_id=worker, lease_expires_ms=expires)
    return None


def _timer(em: Emitter, msg: Message) -> str | None:
    kind = msg.get("timer_kind")
    state = em.state
    if kind == "wall_time":
        if state["status"] != "running" or msg.get("due_ms") != state["wall"]["due_ms"]:
            return "stale timer"
        pause_for(em, budgets.WALL_TIME_OVERRUN)
        return None
    if state["status"] != "running" and not (
        state["status"] == "cancelling" and kind in ("lease_expiry", "stop_timeout")
    ):
        return "stale timer"  # paused: its steps were cancelled; cancelling: only stops count
    if (
        not isinstance(msg.get("node"), str)
        or not isinstance(msg.get("lineage"), str)
        or type(msg.get("attempt")) is not int
    ):
        return f"{kind} timer without a step identity"
    step, dropped = _current_step(em, {**msg, "dispatch_id": msg.get("dispatch_id")})
    if step is None:
        return "stale timer" if dropped == "stale attempt" else dropped
    status = step["status"]
    name, lineage = step["node"], step["lineage"]
    if kind == "retry_backoff":
        if status != "retry_wait":
            return "stale timer"
        retry_attempt(em, step)
        return None
    if kind == "node_timeout":
        if status not in ("scheduled", "running") or step["kind"] not in ("action", "agent", "workflow"):
            return "stale timer"
        tool = loop_tool(em, name, lineage)
        timeout = tool.timeout_ms if tool is not None else em.pinned.node(name).timeout_ms
        message = f"{name} timed out after {timeout} ms"
        # the attempt may still run: it settles (and a retry starts) once it stopped
        ask_to_stop(
            em,
            step,
            "timeout",
            message,
            failure("Timeout", message, retryable=True, node=name, lineage=lineage),
        )
        return None
    if kind == "lease_expiry":
        if status not in ("running", "stopping") or msg.get("due_ms") != step["lease_expires_ms"]:
            return "stale timer"
        if status == "stopping":
            settle_stopping(em, step, STOP_LEASE_EXPIRED, ZERO_USAGE)
            return None
        fail_attempt(
            em,
            step,
            failure(
                "Timeout",
                f"activation lease expired (worker {step['worker_id']})",
                retryable=True,
                node=name,
                lineage=lineage,
            ),
            ZERO_USAGE,
            stop=STOP_LEASE_EXPIRED,
        )
        return None
    if kind == "stop_timeout":
        if status != "stopping" or msg.get("due_ms") != step["stop"]["due_ms"]:
            return "stale timer"
        settle_stopping(em, step, STOP_UNCONFIRMED, ZERO_USAGE)
        return None
    if kind == "wait_timeout":
        if status != "waiting":
            return "stale timer"
        tool = loop_tool(em, name, lineage)
        waited = tool.approval if tool is not None and tool.approval is not None else em.pinned.node(name)
        fail_attempt(
            em,
            step,
            failure(
                "Timeout",
                f"no signal {waited.signal!r} within {waited.timeout_ms} ms",
                node=name,
                lineage=lineage,
            ),
            ZERO_USAGE,
        )
        return None
    if kind == "sleep":
        if status != "scheduled" or step["kind"] != "sleep":
            return "stale timer"
        em.emit_step("StepSucceeded", step, output=None, usage=dict(ZERO_USAGE))
        return None
    return f"unknown timer kind {kind!r}"


def _stopped_how(msg: Message) -> str:
    """How the attempt a receipt ends stopped: an ActivationCancelled confirms the stop unless it
    says `confirmed: false` (an executor whose handler did not stop within its grace time); a
    child run's cancelled terminal receipt is its confirmed stop."""
    rtype = msg["type"]
    if rtype == "ActivationCancelled":
        return STOP_UNCONFIRMED if msg.get("confirmed") is False else STOP_CONFIRMED
    if rtype == "ActivationCompleted":
        return STOP_COMPLETED
    if rtype == "ChildRunFinished":
        status = msg["status"]
        return (
            STOP_CONFIRMED
            if status == "cancelled"
            else STOP_COMPLETED
            if status == "succeeded"
            else STOP_FAILED
        )
    return STOP_FAILED


def settle_stopping(em: Emitter, step: dict[str, Any], how: str, usage: Usage) -> None:
    """A stopping attempt's terminal evidence came (or its bound passed): a cancelled one (every
    step of a cancelling run) settles StepCancelled, a timed-out one fails with its Timeout (and
    may retry now). A completion or failure is recorded (`stop`, usage), never the outcome."""
    halting = em.state.get("halting")
    stop = step["stop"]
    if halting is not None or stop["cause"] == "cancelled":
        reason = halting["step_reason"] if halting is not None else stop["reason"]
        em.emit_step("StepCancelled", step, reason=reason, stop=how, usage=usage)
        finish_halt(em)
        return
    problem = stop["failure"]
    assert problem is not None  # a timeout names its failure (stopping.ask_to_stop)
    fail_attempt(em, step, problem, usage, stop=how)
