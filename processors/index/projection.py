"""The run index's projection of run events: one `RunRow` per run, one `StepRow` per node instance.

Pure (no I/O, clock or randomness), like the engine. It is a small fold beside the engine's
`evolve`, not a second engine: it keeps only what a listing and a run page show (statuses,
timings, counts, usage, failure), none of the state, bundle, frontier or buffered signals
that `evolve` copies on every event. Each transition below mirrors its `evolve` handler, and
tests/unit/test_index_projection.py folds the engine's generated histories through both and
requires the same run status (`processors.engine.run_status`), usage ledger and step records
after every event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.engine.ids import instance_key, is_loop_lineage, split_loop_lineage
from processors.engine.vocabulary import OPEN_STEP_STATUSES, TERMINAL_EVENTS


class Skip(Exception):
    """An event the projection cannot apply to what it holds (it says why); the ingest counts it."""


@dataclass(slots=True)
class StepRow:
    run_id: str
    key: str  # instance_key(node, lineage): `node` or `node[lineage]`
    node: str
    lineage: str
    kind: str | None = None
    status: str = "scheduled"
    attempt: int = 0  # the latest attempt's number
    first_attempt: int = 0
    activations: int = 0  # StepScheduled events of this instance over the whole run
    superstep: int = 0
    queue: str | None = None
    dispatch_id: str | None = None
    scheduled_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    worker_id: str | None = None
    retry_due_ms: int | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0
    reason: str | None = None
    waiting: bool = False  # in the run's waits (a wait node reached, its signal not yet delivered)


@dataclass(slots=True)
class RunRow:
    run_id: str
    definition_id: str
    revision: int
    bundle_hash: str
    created_ms: int
    updated_ms: int
    sequence: int
    phase: str = "queued"  # the engine's `status` field; `status()` derives `waiting` from it
    superstep: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    budgets: dict[str, Any] = field(default_factory=dict)
    parent_run_id: str | None = None
    parent_node: str | None = None
    root_run_id: str = ""
    depth: int = 0
    finished_ms: int | None = None
    # the engine's usage ledger (processors.engine.vocabulary.Ledger), reservations included
    ledger_steps: int = 0
    retries: int = 0
    agents: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micros: int = 0
    attempts: int = 0  # StepScheduled events (every attempt of every step)
    failure_code: str | None = None
    failure_message: str | None = None
    failure_node: str | None = None
    pause_code: str | None = None
    pause_reason: str | None = None
    cancel_reason: str | None = None
    signals: int = 0  # SignalReceived events
    partition: int = -1
    steps: dict[str, StepRow] = field(default_factory=dict)
    dirty_steps: set[str] = field(default_factory=set)  # written by the next flush

    def status(self) -> str:
        """`processors.engine.run_status` of the state `evolve` would hold."""
        if self.phase != "running" or not any(s.waiting for s in self.steps.values()):
            return self.phase
        for step in self.steps.values():
            if (
                step.superstep == self.superstep
                and step.status in OPEN_STEP_STATUSES
                and step.status != "waiting"
                and not (step.kind == "agent" and step.queue is None and not is_loop_lineage(step.lineage))
            ):
                return "running"
        return "waiting"


def accept(event: dict[str, Any], partition: int = -1) -> RunRow:
    """A new run's row from its RunAccepted."""
    parent = event.get("parent")
    return RunRow(
        run_id=event["run_id"],
        definition_id=event["definition_id"],
        revision=event["revision"],
        bundle_hash=event["bundle_hash"],
        created_ms=event["ts_ms"],
        updated_ms=event["ts_ms"],
        sequence=event["sequence"],
        labels=dict(event.get("labels") or {}),
        budgets=dict(event.get("budgets") or {}),
        parent_run_id=parent["parent_run_id"] if parent else None,
        parent_node=parent["parent_node"] if parent else None,
        root_run_id=parent["root_run_id"] if parent else event["run_id"],
        depth=parent["depth"] if parent else 0,
        partition=partition,
    )


def apply(run: RunRow, event: dict[str, Any]) -> None:
    """Fold one run event (not RunAccepted, not RunRejected) into `run`, in place."""
    etype = event["type"]
    handler = _HANDLERS.get(etype)
    if handler is None:
        raise Skip(f"unknown run event type {etype!r}")
    handler(run, event)
    run.sequence = event["sequence"]
    run.updated_ms = event["ts_ms"]


# ------------------------------------------------------------------------- run level


def _run_started(run: RunRow, ev: dict[str, Any]) -> None:
    run.phase = "running"
    run.superstep = ev["superstep"]


def _superstep_committed(run: RunRow, ev: dict[str, Any]) -> None:
    run.superstep = ev["superstep"] + 1


def _run_paused(run: RunRow, ev: dict[str, Any]) -> None:
    run.phase = "paused"
    run.pause_code, run.pause_reason = ev["code"], ev["reason"]


def _run_cancelling(run: RunRow, ev: dict[str, Any]) -> None:
    run.phase = "cancelling"  # until its in-flight attempts stopped (engine/stopping.py)


def _run_resumed(run: RunRow, ev: dict[str, Any]) -> None:
    run.phase = "running"
    run.budgets = dict(ev.get("budgets") or {})
    run.pause_code = run.pause_reason = None
    run.failure_code = run.failure_message = run.failure_node = None
    run.finished_ms = None


def _terminal(run: RunRow, ev: dict[str, Any]) -> None:
    run.phase = TERMINAL_EVENTS[ev["type"]]
    run.finished_ms = ev["ts_ms"]
    failure = ev.get("failure")
    if failure:
        run.failure_code, run.failure_message = failure.get("code"), failure.get("message")
        run.failure_node = failure.get("node")
    if ev["type"] == "RunCancelled":
        run.cancel_reason = ev.get("reason")


def _signal_received(run: RunRow, ev: dict[str, Any]) -> None:
    run.signals += 1


def _nothing(run: RunRow, ev: dict[str, Any]) -> None:
    pass


# ------------------------------------------------------------------------ step level


def _put(run: RunRow, step: StepRow) -> None:
    run.steps[step.key] = step
    run.dirty_steps.add(step.key)


def _existing(run: RunRow, ev: dict[str, Any]) -> StepRow:
    key = instance_key(ev["node"], ev["lineage"])
    step = run.steps.get(key)
    if step is None:
        raise Skip(f"{ev['type']} of step {key!r}, which the run never scheduled")
    run.dirty_steps.add(key)
    return step


def _add_usage(run: RunRow, step: StepRow | None, usage: dict[str, Any] | None) -> None:
    if not usage:
        return
    p, c, m = (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(usage.get("cost_micros") or 0),
    )
    run.prompt_tokens += p
    run.completion_tokens += c
    run.cost_micros += m
    if step is not None:
        step.prompt_tokens, step.completion_tokens, step.cost_micros = p, c, m


def _step_scheduled(run: RunRow, ev: dict[str, Any]) -> None:
    node, lineage = ev["node"], ev["lineage"]
    key = instance_key(node, lineage)
    old = run.steps.get(key)
    same_superstep = old is not None and old.superstep == ev["superstep"]
    retrying = same_superstep and old is not None and old.status == "retry_wait"
    loop = split_loop_lineage(lineage) if lineage else None
    if not same_superstep:  # a fresh activation reserves a step (and an agent), as in evolve
        if loop is not None:  # an agent loop's model turn takes an agent, its tool call a step
            run.ledger_steps += loop[2] is not None
            run.agents += loop[2] is None
        else:  # an agent loop's own step (an agent on no queue) takes a step, its turns the agents
            run.ledger_steps += 1
            run.agents += ev["kind"] == "agent" and ev.get("queue") is not None
    run.attempts += 1
    _put(
        run,
        StepRow(
            run_id=run.run_id,
            key=key,
            node=node,
            lineage=lineage,
            kind=ev["kind"],
            status="scheduled",
            attempt=ev["attempt"],
            first_attempt=old.first_attempt if retrying and old is not None else ev["attempt"],
            activations=(old.activations if old is not None else 0) + 1,
            superstep=ev["superstep"],
            queue=ev.get("queue"),
            dispatch_id=ev["dispatch_id"],
            scheduled_ms=ev["ts_ms"],
            # a tool call scheduled after its approval waits no more
            waiting=old.waiting if old is not None and loop is None else False,
        ),
    )


def _step_started(run: RunRow, ev: dict[str, Any]) -> None:
    step = _existing(run, ev)
    status = "stopping" if step.status == "stopping" else "running"  # accepted while asked to stop
    step.status, step.started_ms, step.worker_id = status, ev["ts_ms"], ev["worker_id"]


def _settle(run: RunRow, ev: dict[str, Any], status: str) -> None:
    key = instance_key(ev["node"], ev["lineage"])
    old = run.steps.get(key)
    if old is None or old.superstep != run.superstep:
        # settled without a StepScheduled in this superstep (an empty map, an input that did
        # not resolve): a new record that takes a step, as evolve's _settled_unscheduled does
        run.ledger_steps += 1
        step = StepRow(
            run_id=run.run_id,
            key=key,
            node=ev["node"],
            lineage=ev["lineage"],
            attempt=ev["attempt"],
            first_attempt=ev["attempt"],
            activations=old.activations if old is not None else 0,
            superstep=run.superstep,
            dispatch_id=ev["dispatch_id"],
            waiting=old.waiting if old is not None else False,
        )
        _put(run, step)
    else:
        step = old
        run.dirty_steps.add(key)
    step.status = status
    step.finished_ms = ev["ts_ms"]
    failure = ev.get("failure") if status == "failed" else None
    step.failure_code = failure.get("code") if failure else None
    step.failure_message = failure.get("message") if failure else None
    _add_usage(run, step, ev.get("usage"))
    step.waiting = False


def _step_succeeded(run: RunRow, ev: dict[str, Any]) -> None:
    _settle(run, ev, "succeeded")


def _step_failed(run: RunRow, ev: dict[str, Any]) -> None:
    _settle(run, ev, "failed")


def _step_retry_scheduled(run: RunRow, ev: dict[str, Any]) -> None:
    step = _existing(run, ev)
    run.retries += 1
    step.status, step.retry_due_ms = "retry_wait", ev["due_ms"]


def _step_cancelled(run: RunRow, ev: dict[str, Any]) -> None:
    step = _existing(run, ev)
    step.status, step.reason, step.finished_ms = "cancelled", ev["reason"], ev["ts_ms"]
    step.waiting = False
    if ev.get("stop") is not None:  # what a stopping attempt's completion or failure reported
        _add_usage(run, step, ev.get("usage"))


def _step_stopping(run: RunRow, ev: dict[str, Any]) -> None:
    _existing(run, ev).status = "stopping"


def _step_skipped(run: RunRow, ev: dict[str, Any]) -> None:
    key = instance_key(ev["node"], ev["lineage"])
    step = run.steps.get(key)
    if step is None:
        step = StepRow(run_id=run.run_id, key=key, node=ev["node"], lineage=ev["lineage"])
        _put(run, step)
    else:
        run.dirty_steps.add(key)
    step.status, step.reason = "skipped", ev["reason"]
    step.superstep, step.finished_ms = run.superstep, ev["ts_ms"]


def _run_waiting(run: RunRow, ev: dict[str, Any]) -> None:
    step = _existing(run, ev)
    step.status, step.waiting = "waiting", True


_HANDLERS = {
    "RunStarted": _run_started,
    "StepScheduled": _step_scheduled,
    "StepStarted": _step_started,
    "StepLeaseExtended": _nothing,
    "StepSucceeded": _step_succeeded,
    "StepFailed": _step_failed,
    "StepRetryScheduled": _step_retry_scheduled,
    "StepSkipped": _step_skipped,
    "StepCancelled": _step_cancelled,
    "StepStopping": _step_stopping,
    "SuperstepCommitted": _superstep_committed,
    "RunWaiting": _run_waiting,
    "SignalReceived": _signal_received,
    "BudgetWarning": _nothing,
    "BudgetExhausted": _nothing,
    "RunPaused": _run_paused,
    "RunResumed": _run_resumed,
    "RunCancelling": _run_cancelling,
    "RunSucceeded": _terminal,
    "RunFailed": _terminal,
    "RunCancelled": _terminal,
    "ReceiptConflict": _nothing,
}

EVENT_TYPES = frozenset({"RunAccepted", "RunRejected", *_HANDLERS})
