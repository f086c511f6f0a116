"""CancelRun, SignalRun and ResumeRun (StartRun lives in start.py), and the runtime's own FailRun."""

from __future__ import annotations

from typing import Any

from processors.engine import budgets
from processors.engine.agent_loop import answer_approval
from processors.engine.context import Decision, rejected, unchanged
from processors.engine.emitter import Emitter, failure, rejection, text
from processors.engine.errors import schema_problem
from processors.engine.ids import instance_key, is_loop_lineage, order_key
from processors.engine.nesting import json_size, nesting_reason, too_deep
from processors.engine.secrets import find_secret_literals
from processors.engine.state import RunState
from processors.engine.steps import plan_superstep
from processors.engine.stopping import halt
from processors.engine.superstep import fail_run, progress
from processors.engine.vocabulary import FAILURE_CODES, NOT_SCHEDULED_STATUSES, TERMINAL_STATUSES, ZERO_USAGE

Message = dict[str, Any]
# A command's free-text reason is copied into the run's events and every cancelled step:
# keep it short so a long one cannot make those records too large for Kafka.
REASON_CHARS = 1000


def cancel_run(state: RunState, msg: Message, em: Emitter) -> Decision:
    """Idempotent: cancelling a cancelled (or cancelling) run changes nothing. A succeeded or
    failed run, or one already failing while its steps stop, is never reopened by a cancel: the
    caller gets a RunRejected (code Conflict). A run pausing while its steps stop ends cancelled."""
    status = state["status"]
    halting = state.get("halting")
    if status == "cancelled" or (halting is not None and halting["outcome"] == "RunCancelled"):
        return unchanged("duplicate cancel")
    if status in TERMINAL_STATUSES:
        return rejected(state, rejection(msg, "Conflict", f"run already {status}"), "run already finished")
    if halting is not None and halting["outcome"] == "RunFailed":
        return rejected(state, rejection(msg, "Conflict", "run already failing"), "run already failing")
    reason = text(msg.get("reason"), REASON_CHARS) or "cancelled by request"
    halt(em, "RunCancelled", f"run cancelled: {reason}", reason=reason, key=em.key)
    return em.decision()


def fail_run_for_runtime(state: RunState, msg: Message, em: Emitter) -> Decision:
    """`FailRun` is the runtime's own message, never read from a topic (no Avro schema has it):
    the run cannot go on for a reason only the runtime sees, e.g. an input of the run whose
    outputs the broker refuses as too large (a fired timer's next activation, say), without
    which a step would wait for good. Fails the run and cancels its open steps; a finished run
    is left as it is."""
    if state["status"] in TERMINAL_STATUSES:
        return unchanged("run already finished")
    if state["status"] == "cancelling":
        return unchanged("run already stopping")  # it ends once its steps stopped, or at their bound
    code = msg["code"] if msg["code"] in FAILURE_CODES else "ExecutionFailed"
    # The message goes on RunFailed only: every cancelled step (a map's many items) gets the code.
    fail_run(em, failure(code, msg["message"][:REASON_CHARS]), f"run failed: {code}")
    return em.decision()


def signal_run(state: RunState, msg: Message, em: Emitter) -> Decision:
    """Deliver to the lowest waiting instance of a wait node on that signal; otherwise
    buffer it (SignalReceived with node null) for a wait reached later."""
    status = state["status"]
    name = msg.get("signal")
    if status in TERMINAL_STATUSES:
        return rejected(state, rejection(msg, "Conflict", f"run already {status}"), "run already finished")
    if not isinstance(name, str) or not name:
        return rejected(state, rejection(msg, "InvalidInput", "signal name is required"), "invalid signal")
    approval = name in em.pinned.approval_signals
    if not approval and not any(
        node.kind == "wait" and node.signal == name for node in em.pinned.root.nodes.values()
    ):
        reason = (
            f"no wait node of {state['definition_id']}@{state['revision']} waits for signal {name[:100]!r}"
        )
        return rejected(state, rejection(msg, "InvalidInput", reason), "unknown signal")
    payload = msg.get("payload")
    limit = em.ctx.ceilings.max_json_depth
    where = too_deep(payload, limit, "payload")
    if where is not None:
        return rejected(
            state,
            rejection(msg, "InvalidInput", nesting_reason("signal payload", where, limit)),
            "signal payload too deep",
        )
    size, unwritable = json_size(payload)
    if unwritable:
        return rejected(
            state, rejection(msg, "InvalidInput", f"signal payload {unwritable}"), "signal payload not JSON"
        )
    if size > em.ctx.ceilings.max_payload_bytes:
        reason = (
            f"signal payload of {size} bytes exceeds max_payload_bytes {em.ctx.ceilings.max_payload_bytes}"
        )
        return rejected(state, rejection(msg, "Limit", reason), "signal payload too large")
    secrets = find_secret_literals(payload, "payload")
    if secrets:
        reason = f"secret material in signal payload at {', '.join(secrets[:5])}"
        return rejected(state, rejection(msg, "InvalidInput", reason), "secret in signal")
    if approval:  # an agent loop's tool call waits for it (agent_loop.py)
        refused = answer_approval(em, name, payload)
        if refused is not None:
            return rejected(state, rejection(msg, "Conflict", refused), "approval refused")
        progress(em)
        return em.decision()
    waits = sorted(
        (wait for wait in state["waits"].values() if wait["signal"] == name),
        key=lambda wait: order_key(wait["node"], wait["lineage"]),
    )
    # Every wait node on a signal declares the same contract (validation: signal_contract).
    taker = next(
        n for n, node in sorted(em.pinned.root.nodes.items()) if node.kind == "wait" and node.signal == name
    )
    validator = em.pinned.payload_validator(taker)
    if validator is not None:
        problem = schema_problem(validator, payload)
        if problem is not None:  # refused before it reaches the run: the wait goes on waiting
            reason = f"signal {name[:100]!r}: payload {problem} (the payload_schema of {taker})"
            return rejected(state, rejection(msg, "InvalidInput", reason), "signal payload refused")
    if not waits or status != "running":
        if not em.pinned.node(taker).accept_early:
            where = (
                f"the run is {status}" if status != "running" else f"no wait on {name[:100]!r} is reached yet"
            )
            reason = (
                f"{where}, and wait node {taker} takes only a signal that arrives while it waits "
                "(accept_early: false); send it again once the run waits for it"
            )
            return rejected(state, rejection(msg, "Conflict", reason), "early signal refused")
        em.emit("SignalReceived", signal=name, payload=payload, node=None, **em.keyed())
        return em.decision()
    wait = waits[0]
    step = state["steps"][instance_key(wait["node"], wait["lineage"])]
    em.emit("SignalReceived", signal=name, payload=payload, node=wait["node"], **em.keyed())
    em.emit_step(
        "StepSucceeded",
        step,
        output=payload,
        usage=dict(ZERO_USAGE),
    )
    progress(em)
    return em.decision()


def resume_run(state: RunState, msg: Message, em: Emitter) -> Decision:
    """A paused run, or a failed run whose current superstep has failed or cancelled
    instances, continues: those instances are re-activated as new attempts."""
    status = state["status"]
    if status not in ("paused", "failed"):
        return rejected(
            state,
            rejection(msg, "Conflict", f"run is {status}; only a paused or failed run resumes"),
            "nothing to resume",
        )
    superstep = state["superstep"]
    # A failed run resumes only when a step failed it (fail_fast) or its steps were cancelled
    # (FailRun): a failed `continue` / `skip_dependents` instance did not, the barrier did.
    resumable = bool(state["frontier"]) and (
        status == "paused"
        or any(
            step["superstep"] == superstep
            and step["status"] in NOT_SCHEDULED_STATUSES
            and (
                step["status"] == "cancelled"
                or (
                    step["status"] == "failed"
                    and not is_loop_lineage(step["lineage"])
                    and em.pinned.node(step["node"]).on_failure == "fail_fast"
                )
            )
            for step in state["steps"].values()
        )
    )
    if not resumable:
        reason = "run failed outside a step (at a barrier or at its end); resuming would fail the same way"
        return rejected(state, rejection(msg, "Conflict", reason), "nothing to resume")
    pinned = em.pinned
    limits, reason = budgets.effective_budgets(pinned.root.budgets, em.ctx.ceilings, None, may_raise=True)
    assert limits is not None
    limits = {**limits, **state["budgets"]}
    overrides = msg.get("budgets")
    if overrides is not None:
        new_limits, reason = budgets.effective_budgets(
            pinned.root.budgets, em.ctx.ceilings, overrides, may_raise=True
        )
        if new_limits is None:
            return rejected(state, rejection(msg, "Limit", reason), "invalid budgets")
        limits = {**limits, **{key: new_limits[key] for key in overrides}}
    em.emit("RunResumed", budgets=limits, reason=text(msg.get("reason"), REASON_CHARS), **em.keyed())
    plan_superstep(em, reactivate=True)
    progress(em)
    return em.decision()


__all__ = ["cancel_run", "resume_run", "signal_run"]
