"""The emitter that builds a decision's events and folds them, and the records events carry.

`decide` never computes a follow-up from a stale view: every event it emits is folded
into its working state at once (`Emitter.emit`), so the next rule reads the state as the
runtime will see it; the states it folds travel in the `Decision` (context.py).
"""

from __future__ import annotations

from typing import Any

from processors.engine.context import Decision, EngineContext
from processors.engine.evolve import evolve
from processors.engine.ids import (
    command_key,
    dispatch_id,
    duplicate_record_id,
    event_record_id,
    rejection_record_id,
    split_loop_lineage,
)
from processors.engine.pinned import Pinned, pinned
from processors.engine.state import RunState, usage_of
from processors.engine.vocabulary import KEYED_COMMANDS, Failure, Usage

Event = dict[str, Any]
Message = dict[str, Any]

_USAGE_EVENTS = frozenset(
    {"StepScheduled", "StepSucceeded", "StepFailed", "StepRetryScheduled", "RunResumed"}
)


def failure(
    code: str, message: str, *, retryable: bool = False, node: str | None = None, lineage: str | None = None
) -> Failure:
    return {"code": code, "message": message, "retryable": retryable, "node": node, "lineage": lineage}


def rejection(
    msg: Message, code: str, reason: str, *, definition_id: str | None = None, revision: int | None = None
) -> Event:
    run_id = text(msg.get("run_id"))
    if definition_id is None:
        definition_id = msg.get("definition_id") if type(msg.get("definition_id")) is str else None
    event: Event = {
        "type": "RunRejected",
        "run_id": run_id,
        "ts_ms": msg["ts_ms"],
        "record_id": rejection_record_id(run_id, text(msg.get("record_id"))),
        "sequence": 0,
        "code": code,
        "reason": reason,
        "definition_id": definition_id,
        "revision": revision,
        "command_type": msg["type"],
    }
    if msg["type"] in KEYED_COMMANDS:  # so a sender that matches answers by key finds its rejection
        key = command_key(msg.get("idempotency_key"), msg.get("record_id"))[0]
        if key is not None:
            event["idempotency_key"] = key
    return event


def deduplicated(msg: Message, key: str, answer: list[Any]) -> Event:
    """The answer to a repeat of a keyed command the run applied: sequence 0, like a RunRejected,
    naming the event (`[sequence, type]` from the run's `command_keys`) that answered the first."""
    run_id = text(msg.get("run_id"))
    return {
        "type": "CommandDeduplicated",
        "run_id": run_id,
        "ts_ms": msg["ts_ms"],
        "record_id": duplicate_record_id(run_id, text(msg.get("record_id"))),
        "sequence": 0,
        "command_type": msg["type"],
        "idempotency_key": key,
        "answer_sequence": answer[0],
        "answer_type": answer[1],
    }


def text(value: Any, limit: int | None = None) -> str:
    """A free-text field of a message as a string ("" when it is not one), cut to `limit`
    characters: the wire gives strings, but `str()` of a hostile nested value would recurse."""
    out = value if type(value) is str else ""
    return out if limit is None else out[:limit]


class Emitter:
    """Builds the events of one decision, folding each into `state` as it goes."""

    __slots__ = (
        "_pinned",
        "ctx",
        "events",
        "failed_any",
        "key",
        "loops",
        "run_id",
        "settled_items",
        "state",
        "states",
        "ts",
        "usage_changed",
    )

    def __init__(self, state: RunState | None, msg: Message, ctx: EngineContext) -> None:
        # {} until RunAccepted folds the run's first state (never None: compiled, the attribute
        # holds a dict only; a run's real state is never empty)
        self.state: RunState = state if state is not None else {}
        self.events: list[Event] = []
        self.states: list[RunState | None] = []  # the state after each event
        self.ts: int = msg["ts_ms"]
        self.run_id: str = msg["run_id"]
        self.ctx = ctx
        self.failed_any = False  # a StepFailed was emitted: check fail_fast
        # mapped node -> an item of it that settled: the node may now be settled as failed
        self.settled_items: dict[str, int] = {}
        self.usage_changed = False  # the ledger moved: check budgets
        # agent loops (node, lineage of the step) that a turn or tool call settled in, or that were
        # just scheduled: progress drives each to its next turn, call or outcome (agent_loop.py)
        self.loops: set[tuple[str, str]] = set()
        self._pinned: Pinned | None = None
        # the idempotency key of the command being decided (decider.py): its answering event carries it
        self.key: str | None = None

    @property
    def pinned(self) -> Pinned:
        if self._pinned is None:
            self._pinned = pinned(self.state["bundle"], self.state["bundle_hash"])
        return self._pinned

    def emit(self, etype: str, **fields: Any) -> Event:
        sequence = self.state.get("sequence", 0) + 1
        event: Event = {
            "type": etype,
            "run_id": self.run_id,
            "ts_ms": self.ts,
            "record_id": event_record_id(self.run_id, sequence),
            "sequence": sequence,
            **fields,
        }
        new_state = evolve(self.state or None, event)
        assert new_state is not None  # only RunRejected folds to None, and it is never emitted here
        self.state = new_state
        self.events.append(event)
        self.states.append(new_state)
        if etype in _USAGE_EVENTS:
            self.usage_changed = True
            if etype == "StepFailed":
                self.failed_any = True
            if (etype == "StepSucceeded" or etype == "StepFailed") and fields["lineage"]:
                lineage = fields["lineage"]
                loop = split_loop_lineage(lineage)
                if loop is None:
                    self.settled_items[fields["node"]] = int(lineage)
                else:
                    self.loops.add((fields["node"], loop[0]))
        return event

    def emit_step(self, etype: str, step: dict[str, Any], **fields: Any) -> Event:
        """An event carrying the step identity of `step` (a step record)."""
        return self.emit(
            etype,
            node=step["node"],
            lineage=step["lineage"],
            attempt=step["attempt"],
            dispatch_id=step["dispatch_id"],
            **fields,
        )

    def emit_attempt(self, etype: str, node: str, lineage: str, attempt: int, **fields: Any) -> Event:
        """An event for attempt `attempt` of instance `node[lineage]`, with its dispatch id."""
        return self.emit(
            etype,
            node=node,
            lineage=lineage,
            attempt=attempt,
            dispatch_id=dispatch_id(self.run_id, node, lineage, attempt),
            **fields,
        )

    def keyed(self) -> dict[str, Any]:
        """The fields that put the command's key on its answering event (KEYED_ANSWERS): none
        without a key, so an event of a message without one is as it always was."""
        return {} if self.key is None else {"idempotency_key": self.key}

    def usage(self) -> Usage:
        return usage_of(self.state)

    def decision(self, dropped: str | None = None) -> Decision:
        """The events emitted so far, the state after each, and why nothing was, if nothing was."""
        return Decision(self.events, self.states, dropped)
