"""The one vocabulary of runfold's messages (docs/messages.md): the kinds of messages and events,
the statuses of runs and steps, the failure codes, node kinds, and the typed shape of the
records that the engine, the runtime, replay and the client all read.

Everything that names a message kind or a status imports it from here (the engine on the
ground floor, so every other part may). The TypedDicts cost nothing at run time: they are
plain dicts that mypy checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, NotRequired, TypedDict

# ---------------------------------------------------------------------------- messages in

COMMANDS: Final = frozenset({"StartRun", "CancelRun", "SignalRun", "ResumeRun"})
# The commands that carry an idempotency key (its `idempotency_key`, else its `record_id`): a run
# applies each key once and answers a repeat with a CommandDeduplicated (docs/semantics.md,
# "Idempotent commands"). StartRun is idempotent by its run id instead.
KEYED_COMMANDS: Final = frozenset({"CancelRun", "SignalRun", "ResumeRun"})
# How many keys a run keeps (the most recently applied; the oldest is forgotten first), and how
# long an explicit key may be: a longer record id is kept as "sha256:<hex>" instead (ids.command_key).
KEY_WINDOW: Final = 1000
KEY_CHARS: Final = 128
# Receipts settle or touch an attempt; TimerFired comes back from the processor's own timers.
RECEIPTS: Final = frozenset(
    {
        "ActivationAccepted",
        "ActivationHeartbeat",
        "ActivationCompleted",
        "ActivationFailed",
        "ActivationCancelled",
        "ChildRunFinished",
        "TimerFired",
    }
)
# The receipts that carry an attempt's outcome (the first one wins).
TERMINAL_RECEIPTS: Final = frozenset({"ActivationCompleted", "ActivationFailed", "ChildRunFinished"})

# ---------------------------------------------------------------------------- messages out

# Run events of sequence 0: answers to a command that belong to no run's sequence and change nothing.
UNSEQUENCED_EVENTS: Final = frozenset({"RunRejected", "CommandDeduplicated"})
# The run-level events that answer a keyed command and carry its key (at most one per command).
KEYED_ANSWERS: Final = frozenset({"SignalReceived", "RunResumed", "RunCancelling", "RunCancelled"})
# Run events that end a run (until a resume of a failed run), by the status they give.
TERMINAL_EVENTS: Final[dict[str, str]] = {
    "RunSucceeded": "succeeded",
    "RunFailed": "failed",
    "RunCancelled": "cancelled",
}
# Run events after which a run no longer runs (its wall-time timer stops). RunCancelling: the run
# waits for its in-flight attempts to stop before the RunCancelled, RunFailed or RunPaused it names.
RUN_STOPPING_EVENTS: Final = frozenset({"RunPaused", "RunCancelling", *TERMINAL_EVENTS})
# Run events that settle a step's attempt.
STEP_SETTLING_EVENTS: Final = frozenset({"StepSucceeded", "StepFailed", "StepCancelled"})
ACTIVATION_MESSAGES: Final = frozenset({"ActionActivation", "CancelActivation"})
CHILD_MESSAGES: Final = frozenset({"ChildRunActivation", "ChildRunCancel"})

# ---------------------------------------------------------------------------- statuses

RUN_STATUSES: Final = (
    "queued",
    "running",
    "waiting",
    "cancelling",
    "paused",
    "succeeded",
    "failed",
    "cancelled",
)
# A finished run: terminal until an explicit resume (a failed run only).
TERMINAL_STATUSES: Final = frozenset(TERMINAL_EVENTS.values())
STEP_STATUSES: Final = (
    "scheduled",
    "running",
    "waiting",
    "retry_wait",
    "stopping",
    "succeeded",
    "failed",
    "cancelled",
    "skipped",
)
# Step statuses in which an attempt is outstanding (the superstep cannot commit yet). `stopping`:
# the attempt was cancelled or timed out but may still run; it settles on its terminal evidence.
OPEN_STEP_STATUSES: Final = frozenset({"scheduled", "running", "waiting", "retry_wait", "stopping"})
# Step statuses in which an activation may be in flight at an executor or child run.
IN_FLIGHT_STEP_STATUSES: Final = frozenset({"scheduled", "running", "waiting", "stopping"})
# Step statuses that hold one of a run's max_concurrency slots (a retry's backoff included).
IN_FLIGHT_SLOT_STATUSES: Final = frozenset({"scheduled", "running", "retry_wait", "stopping"})

# How a stopping attempt stopped (StepCancelled.stop, StepFailed.stop, the terminal event's
# `stops`): its executor confirmed the stop, it completed or failed anyway, its lease expired (a
# dead worker: the only stop that is assumed), or nothing proved it within stop_timeout_ms.
STOP_CONFIRMED: Final = "confirmed"
STOP_COMPLETED: Final = "completed"
STOP_FAILED: Final = "failed"
STOP_LEASE_EXPIRED: Final = "lease_expired"
STOP_UNCONFIRMED: Final = "stop_unconfirmed"
STOP_HOWS: Final = (STOP_CONFIRMED, STOP_COMPLETED, STOP_FAILED, STOP_LEASE_EXPIRED, STOP_UNCONFIRMED)
# Why an attempt is stopping: its run is being cancelled (or failed, or paused), or it timed out.
STOP_CAUSES: Final = ("cancelled", "timeout")
# Statuses an instance is (re)activated from by a resume.
NOT_SCHEDULED_STATUSES: Final = frozenset({"failed", "cancelled", "skipped"})

# ---------------------------------------------------------------------------- nodes

NODE_KINDS: Final = ("action", "agent", "workflow", "state", "wait", "sleep")
# Kinds an executor runs (an activation on a queue, a lease, heartbeats).
EXECUTOR_KINDS: Final = frozenset({"action", "agent"})
# Kinds dispatched to something outside the processor (they take a max_concurrency slot).
DISPATCHED_KINDS: Final = frozenset({"action", "agent", "workflow"})

# ---------------------------------------------------------------------------- failures

FAILURE_CODES: Final = frozenset(
    {
        "InvalidInput",
        "InvalidOutput",
        "UnknownReference",
        "ExecutionFailed",
        "Evaluation",
        "State",
        "Timeout",
        "BudgetExceeded",
        "RetryExhausted",
        "DependencySkipped",
        "Cancelled",
        "ChildFailed",
        "Conflict",
        "NotFound",
        "PermissionDenied",
        "Limit",
    }
)


class Failure(TypedDict):
    code: str
    message: str
    retryable: bool
    node: str | None
    lineage: str | None


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    cost_micros: int


USAGE_FIELDS: Final = ("prompt_tokens", "completion_tokens", "cost_micros")
# Shared, never mutated: an event that needs its own copy takes dict(ZERO_USAGE).
ZERO_USAGE: Final[Usage] = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


def zero_usage() -> Usage:
    """A fresh zero usage, for a record of its own (ZERO_USAGE is shared)."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


# ------------------------------------------------------------------- command bodies
# What a service writes as a command, beside the envelope's run_id / record_id / ts_ms
# (schemas/runfold.CommandEnvelope.avsc; docs/messages.md). The codec checks the bytes at the
# boundary; these let mypy check the dicts a Python producer builds.


class StartRunBody(TypedDict):
    type: Literal["StartRun"]
    definition_id: str
    revision: int | None
    input: Any
    labels: dict[str, str]
    budgets: NotRequired[dict[str, int] | None]
    parent: NotRequired[dict[str, Any] | None]  # a ParentRef: child runs only
    bundle: NotRequired[Any]  # the pinned definitions of a child run


class CancelRunBody(TypedDict):
    type: Literal["CancelRun"]
    reason: str
    idempotency_key: NotRequired[str | None]  # null: the envelope's record_id (KEYED_COMMANDS)


class SignalRunBody(TypedDict):
    type: Literal["SignalRun"]
    signal: str
    payload: Any
    idempotency_key: NotRequired[str | None]


class ResumeRunBody(TypedDict):
    type: Literal["ResumeRun"]
    budgets: dict[str, int] | None
    reason: str
    idempotency_key: NotRequired[str | None]


CommandBody = StartRunBody | CancelRunBody | SignalRunBody | ResumeRunBody


def start_run_body(
    definition_id: str,
    input: Any = None,
    revision: int | None = None,
    labels: Mapping[str, str] | None = None,
    budgets: Mapping[str, int] | None = None,
) -> StartRunBody:
    """A StartRun as a service sends it (the client, the test harness): no input is `{}`."""
    body: StartRunBody = {
        "type": "StartRun",
        "definition_id": definition_id,
        "revision": revision,
        "input": {} if input is None else input,
        "labels": dict(labels or {}),
    }
    if budgets:
        body["budgets"] = dict(budgets)
    return body


class Envelope(TypedDict):
    run_id: str
    record_id: str  # the sender's id of this record: answers and dedupe name it
    ts_ms: int


class StartRunCommand(StartRunBody, Envelope):
    pass


class CancelRunCommand(CancelRunBody, Envelope):
    pass


# ---------------------------------------------------------------------------- records


class Ledger(TypedDict):
    """A run's usage: what it reserved (steps, retries, agents) and what its receipts recorded."""

    steps: int
    retries: int
    agents: int
    prompt_tokens: int
    completion_tokens: int
    cost_micros: int


class StepRecord(TypedDict):
    """One node instance's latest attempt in the run state (docs/semantics.md, "Run state")."""

    node: str
    lineage: str
    kind: str | None
    status: str
    attempt: int
    first_attempt: int
    dispatch_id: str | None
    superstep: int
    queue: str | None
    input: Any
    input_hash: str | None
    deadline_ms: int | None
    scheduled_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    worker_id: str | None
    lease_expires_ms: int | None
    retry_due_ms: int | None
    output: Any
    failure: Failure | None
    usage: Usage
    reason: str | None
    cancel_in_flight: bool
    # only on an attempt that went through `stopping` or whose stop was recorded (stopping.py)
    stop: NotRequired[StopRecord]


class StopRecord(TypedDict, total=False):
    """Why a stopping attempt stops (cause, reason, the failure a timeout settles it with, the
    stop_timeout bound `due_ms`) and, once it settled, `how` it stopped (STOP_HOWS)."""

    cause: str
    reason: str
    failure: Failure | None
    due_ms: int
    how: str


class TimerBody(TypedDict):
    """A durable timer: the TimerFired receipt the processor produces at `due_ms`."""

    type: str
    run_id: str
    timer_id: str
    timer_kind: str
    due_ms: int
    node: str | None
    lineage: str | None
    attempt: int | None
    dispatch_id: str | None


__all__ = [
    "ACTIVATION_MESSAGES",
    "CHILD_MESSAGES",
    "COMMANDS",
    "DISPATCHED_KINDS",
    "EXECUTOR_KINDS",
    "FAILURE_CODES",
    "IN_FLIGHT_SLOT_STATUSES",
    "IN_FLIGHT_STEP_STATUSES",
    "KEYED_ANSWERS",
    "KEYED_COMMANDS",
    "KEY_CHARS",
    "KEY_WINDOW",
    "NODE_KINDS",
    "NOT_SCHEDULED_STATUSES",
    "OPEN_STEP_STATUSES",
    "RECEIPTS",
    "RUN_STATUSES",
    "RUN_STOPPING_EVENTS",
    "STEP_SETTLING_EVENTS",
    "STEP_STATUSES",
    "STOP_CAUSES",
    "STOP_COMPLETED",
    "STOP_CONFIRMED",
    "STOP_FAILED",
    "STOP_HOWS",
    "STOP_LEASE_EXPIRED",
    "STOP_UNCONFIRMED",
    "TERMINAL_EVENTS",
    "TERMINAL_RECEIPTS",
    "TERMINAL_STATUSES",
    "UNSEQUENCED_EVENTS",
    "USAGE_FIELDS",
    "ZERO_USAGE",
    "Failure",
    "Ledger",
    "StepRecord",
    "StopRecord",
    "TimerBody",
    "Usage",
]
