"""The stopping phase: "cancelled" means stopped (docs/semantics.md, "Stopping").

An attempt that may still run (an action, agent or child run, scheduled or running) is never
settled by a cancel or a timeout alone: it goes to `stopping` (StepStopping, which sends the
CancelActivation / ChildRunCancel and arms its `stop_timeout` timer) and settles only on its
terminal evidence (receipts.py): the executor's ActivationCancelled, its completion or failure
(recorded; the outcome stays cancelled or timed out), the child run's own terminal receipt, or
the expiry of its lease (a dead worker: the one stop that is assumed). The timer bounds the wait
(`stop_timeout_ms`, default the lease): then it settles `stop_unconfirmed`, so nothing hangs.

A run that ends or pauses while such attempts are open (cancel, fail_fast, a budget pause) is
`cancelling` (RunCancelling names the event it will emit) until the last one settled; that
RunCancelled, RunFailed or RunPaused then lists how each stopped (`stops`). A run with nothing
in flight emits it at once, as it always did.
"""

from __future__ import annotations

from typing import Any, Final

from processors.engine.emitter import Emitter
from processors.engine.ids import order_key
from processors.engine.vocabulary import DISPATCHED_KINDS, EXECUTOR_KINDS, OPEN_STEP_STATUSES, Failure

# A child run's own stop waits for its steps' bounds (the lease, 30 s by default): the parent's
# bound for a workflow node is longer by default, so the child's terminal event comes first.
WORKFLOW_STOP_TIMEOUT_MS: Final = 60_000


def may_still_run(step: dict[str, Any]) -> bool:
    """The attempt was handed to an executor or a child run and has not settled. An agent loop's
    step is never handed out itself (its turns and tool calls are): it is cancelled at once."""
    return (
        step["status"] in ("scheduled", "running") and step["kind"] in DISPATCHED_KINDS and "loop" not in step
    )


def stop_timeout_ms(em: Emitter, step: dict[str, Any]) -> int:
    node = em.pinned.node(step["node"])
    if node.stop_timeout_ms is not None:
        return node.stop_timeout_ms
    # the attempt's own kind: an agent loop's call of a workflow tool is a child run
    return node.lease_ms if step["kind"] in EXECUTOR_KINDS else WORKFLOW_STOP_TIMEOUT_MS


def ask_to_stop(
    em: Emitter, step: dict[str, Any], cause: str, reason: str, problem: Failure | None = None
) -> None:
    """StepStopping: the attempt is asked to stop; `problem` is the failure a timeout settles it with."""
    em.emit_step(
        "StepStopping",
        step,
        cause=cause,
        reason=reason,
        failure=problem,
        due_ms=em.ts + stop_timeout_ms(em, step),
    )


def halt(
    em: Emitter,
    outcome: str,
    step_reason: str,
    *,
    reason: str | None = None,
    code: str | None = None,
    problem: Failure | None = None,
    key: str | None = None,
) -> None:
    """End the run with `outcome` (RunCancelled, RunFailed) or pause it (RunPaused) once no
    attempt of it may still run: open steps that hold nothing in flight are cancelled now, the
    others are asked to stop (a timed-out one already stopping goes on stopping). `key`: the
    CancelRun's idempotency key, carried by the RunCancelling or RunCancelled that answers it."""
    stopping = 0
    if em.state["open"] > 0:
        for step in _open_steps(em):
            if step["status"] == "stopping":
                stopping += 1
            elif may_still_run(step):
                ask_to_stop(em, step, "cancelled", step_reason)
                stopping += 1
            else:
                em.emit_step("StepCancelled", step, reason=step_reason)
    keyed: dict[str, Any] = {} if key is None else {"idempotency_key": key}
    if stopping == 0:
        _emit_outcome(em, outcome, reason, code, problem, None, keyed)
        return
    em.emit(
        "RunCancelling",
        outcome=outcome,
        reason=reason,
        code=code,
        failure=problem,
        step_reason=step_reason,
        **keyed,
    )


def finish_halt(em: Emitter) -> None:
    """After a stopping attempt settled: the run's pending outcome, once none is left open."""
    halting = em.state.get("halting")
    if halting is None or em.state["open"] > 0:
        return
    _emit_outcome(
        em, halting["outcome"], halting["reason"], halting["code"], halting["failure"], halting["stops"], {}
    )


def _emit_outcome(
    em: Emitter,
    outcome: str,
    reason: str | None,
    code: str | None,
    problem: Failure | None,
    stops: list[dict[str, Any]] | None,
    keyed: dict[str, Any],
) -> None:
    # `stops` only when the run waited for some: an outcome with nothing in flight is as it was.
    extra: dict[str, Any] = {} if stops is None else {"stops": stops}
    extra.update(keyed)  # a cancel's key: only RunCancelled answers a command (halt's `key`)
    if outcome == "RunCancelled":
        em.emit("RunCancelled", reason=reason, usage=em.usage(), **extra)
    elif outcome == "RunFailed":
        em.emit("RunFailed", failure=problem, usage=em.usage(), **extra)
    else:
        em.emit("RunPaused", code=code, reason=reason, **extra)


def _open_steps(em: Emitter) -> list[dict[str, Any]]:
    superstep = em.state["superstep"]
    found = [
        step
        for step in em.state["steps"].values()
        if step["superstep"] == superstep and step["status"] in OPEN_STEP_STATUSES
    ]
    return sorted(found, key=lambda step: order_key(step["node"], step["lineage"]))
