"""`decide(state, msg, ctx) -> Decision`: the pure decider.

Inputs are flat dicts (docs/messages.md). A message whose shape is wrong (unknown type,
missing or mistyped field) is dropped with the reason; a bad command becomes RunRejected;
nothing here raises on a well-typed message.
"""

from __future__ import annotations

from typing import Any

from processors.engine.commands import cancel_run, fail_run_for_runtime, resume_run, signal_run
from processors.engine.context import Decision, EngineContext, rejected, unchanged
from processors.engine.emitter import Emitter, deduplicated, rejection
from processors.engine.ids import command_key
from processors.engine.receipts import handle_receipt
from processors.engine.start import start_run
from processors.engine.state import RunState
from processors.engine.vocabulary import COMMANDS

Message = dict[str, Any]

_STEP_IDENTITY = {"node": str, "lineage": str, "attempt": int, "dispatch_id": str}
# Required fields by message type (beyond type, run_id, ts_ms), with their Python types.
REQUIRED: dict[str, dict[str, type]] = {
    "StartRun": {"definition_id": str},
    "CancelRun": {},
    "SignalRun": {"signal": str},
    "ResumeRun": {},
    "ActivationAccepted": {**_STEP_IDENTITY, "worker_id": str, "lease_ms": int},
    "ActivationHeartbeat": {**_STEP_IDENTITY, "worker_id": str, "lease_ms": int},
    "ActivationCompleted": {**_STEP_IDENTITY, "worker_id": str},
    "ActivationFailed": {**_STEP_IDENTITY, "worker_id": str, "code": str, "message": str},
    "ActivationCancelled": {**_STEP_IDENTITY, "worker_id": str},
    "ChildRunFinished": {**_STEP_IDENTITY, "child_run_id": str, "status": str},
    "TimerFired": {"timer_id": str, "timer_kind": str, "due_ms": int},
    "FailRun": {"code": str, "message": str},  # the runtime's own (commands.fail_run_for_runtime)
}


def _shape_problem(msg: Any) -> str | None:
    if not isinstance(msg, dict):
        return "message is not a dict"
    mtype = msg.get("type")
    if mtype not in REQUIRED:
        return f"unknown message type {mtype!r}"
    if not isinstance(msg.get("run_id"), str) or not msg["run_id"]:
        return f"{mtype} without a run_id"
    if type(msg.get("ts_ms")) is not int:
        return f"{mtype} without an integer ts_ms"
    for name, kind in REQUIRED[mtype].items():
        value = msg.get(name)
        if type(value) is not kind:
            return f"{mtype}.{name} must be {kind.__name__}"
    return None


def decide(state: RunState | None, msg: Any, ctx: EngineContext) -> Decision:
    """Any `msg` (hostile ones included) is shape-checked here first: compiled, a narrower
    parameter type would raise TypeError at the call instead of dropping it with the reason."""
    problem = _shape_problem(msg)
    if problem is not None:
        return unchanged(problem)
    mtype = msg["type"]
    if state is not None and state["run_id"] != msg["run_id"]:
        return unchanged("message for another run")
    if mtype == "StartRun":
        return start_run(state, msg, ctx)
    if mtype == "FailRun":
        if state is None:
            return unchanged("unknown run")
        return fail_run_for_runtime(state, msg, Emitter(state, msg, ctx))
    em = Emitter(state, msg, ctx)
    if mtype in COMMANDS:
        if state is None:
            return rejected(
                None, rejection(msg, "NotFound", f"run {msg['run_id']} does not exist"), "unknown run"
            )
        key, problem = command_key(msg.get("idempotency_key"), msg.get("record_id"))
        if problem is not None:
            return rejected(state, rejection(msg, "InvalidInput", problem), "invalid idempotency key")
        if key is not None:
            # A key the run applied is answered with that answer, before any rule that looks at
            # the run now: a signal repeated after its run finished is not a Conflict.
            kept = state.get("command_keys")
            answer = kept.get(key) if kept is not None else None
            if answer is not None:
                return rejected(state, deduplicated(msg, key, answer), "duplicate command")
            em.key = key
        if mtype == "CancelRun":
            return cancel_run(state, msg, em)
        if mtype == "SignalRun":
            return signal_run(state, msg, em)
        return resume_run(state, msg, em)
    return handle_receipt(state, msg, em)
