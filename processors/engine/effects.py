"""`effects(state_after, event) -> Effects`: the messages and timers an event implies.

Activations go to per-queue topics (ActionActivation carries `queue`), child runs to the
child-activation topic; timers are TimerFired bodies the timer service fires at `due_ms`.
Timer ids are deterministic (ids.py), so re-arming one replaces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from processors.engine.ids import (
    child_run_id,
    dispatch_id,
    instance_key,
    split_loop_lineage,
    step_timer_id,
    wall_timer_id,
)
from processors.engine.pending import wall_timer
from processors.engine.pinned import Pinned, pinned
from processors.engine.refs import ABSENT, RefError, Scope, resolve
from processors.engine.state import RunState
from processors.engine.transcript import tool_call, tool_specs, transcript
from processors.engine.vocabulary import (
    DISPATCHED_KINDS,
    EXECUTOR_KINDS,
    RUN_STOPPING_EVENTS,
    STEP_SETTLING_EVENTS,
    STOP_LEASE_EXPIRED,
    UNSEQUENCED_EVENTS,
)

Event = dict[str, Any]
Message = dict[str, Any]


@dataclass(slots=True)
class Effects:
    """What an event implies. Read-only for callers: most events imply nothing and share
    one empty instance (`NONE`), so the fields are sequences (empty ones are tuples)."""

    messages: Sequence[Message] = ()
    set_timers: Sequence[dict[str, Any]] = ()
    clear_timers: Sequence[str] = ()


NONE = Effects()


def effects(state: RunState | None, event: Event) -> Effects:
    etype = event["type"]
    if state is None or etype in UNSEQUENCED_EVENTS:
        return NONE
    if etype == "StepScheduled":
        return _scheduled(state, event)
    if etype in STEP_SETTLING_EVENTS:
        return _settled(state, event)
    if etype == "StepStopping":
        return _stopping(state, event)
    if etype in ("StepStarted", "StepLeaseExtended"):
        return Effects(set_timers=[_timer(state, event, "lease_expiry", event["lease_expires_ms"])])
    if etype == "StepRetryScheduled":
        timer = _timer(state, event, "retry_backoff", event["due_ms"])
        timer["timer_id"] = event["timer_id"]
        return Effects(set_timers=[timer])
    if etype == "RunWaiting":
        if event.get("due_ms") is None:
            return NONE
        step = state["steps"][instance_key(event["node"], event["lineage"])]
        return Effects(set_timers=[_timer(state, step, "wait_timeout", event["due_ms"])])
    if etype in ("RunStarted", "RunResumed"):
        wall = state["wall"]
        if wall["due_ms"] is None:
            return NONE
        return Effects(set_timers=[wall_timer(state["run_id"], wall)])
    if etype in RUN_STOPPING_EVENTS:
        wall = state["wall"]
        if wall["due_ms"] is None:
            return NONE
        return Effects(clear_timers=[wall_timer_id(state["run_id"], wall["epoch"])])
    return NONE


def _timer(state: RunState, ident: dict[str, Any], kind: str, due: int) -> dict[str, Any]:
    return {
        "type": "TimerFired",
        "run_id": state["run_id"],
        "timer_id": step_timer_id(kind, ident["dispatch_id"]),
        "timer_kind": kind,
        "due_ms": due,
        "node": ident["node"],
        "lineage": ident["lineage"],
        "attempt": ident["attempt"],
        "dispatch_id": ident["dispatch_id"],
    }


def _envelope(event: Event, index: int, mtype: str) -> Message:
    return {
        "type": mtype,
        "run_id": event["run_id"],
        "ts_ms": event["ts_ms"],
        "record_id": f"{event['record_id']}:{index}",
        "node": event["node"],
        "lineage": event["lineage"],
        "attempt": event["attempt"],
        "dispatch_id": event["dispatch_id"],
    }


def _scheduled(state: RunState, event: Event) -> Effects:
    kind = event["kind"]
    deadline = event.get("deadline_ms")
    if kind == "sleep":
        return Effects(set_timers=[_timer(state, event, "sleep", deadline or event["ts_ms"])])
    if kind not in DISPATCHED_KINDS:
        return NONE
    p = pinned(state["bundle"], state["bundle_hash"])
    node = p.node(event["node"])
    step = state["steps"][instance_key(event["node"], event["lineage"])]
    if "loop" in step:
        return NONE  # an agent loop's step: its turns and tool calls are the activations
    loop = split_loop_lineage(event["lineage"])
    timers = [_timer(state, event, "node_timeout", deadline)] if deadline is not None else []
    # A retry: the backoff timer that led here has fired (the runtime dropped it then), but
    # only this event tells a restore, which folds events and never sees the TimerFired.
    clear = [_previous_retry_timer(state, event)] if event["attempt"] > step["first_attempt"] else []
    if loop is not None and loop[2] is not None and event["attempt"] > 1:
        # a tool call approved: the previous attempt was its wait for the approval, with a timer
        previous = dispatch_id(state["run_id"], event["node"], event["lineage"], event["attempt"] - 1)
        clear.append(step_timer_id("wait_timeout", previous))
    tool = (
        node.tools[tool_call(state, event["node"], loop)["name"]]
        if loop is not None and loop[2] is not None
        else None
    )
    if kind == "workflow":
        # a workflow node's child run, or an agent loop's call of a workflow tool
        workflow, revision = (
            (node.workflow, node.revision) if tool is None else (tool.workflow, tool.revision)
        )
        assert workflow is not None and revision is not None
        message = _envelope(event, 0, "ChildRunActivation")
        message.update(
            child_run_id=child_run_id(state["run_id"], event["node"], event["lineage"], event["attempt"]),
            definition_id=workflow,
            revision=revision,
            input=event["input"],
            bundle=p.child_bundle(workflow, revision),
            parent={
                "parent_run_id": state["run_id"],
                "parent_node": event["node"],
                "parent_lineage": event["lineage"],
                "parent_dispatch_id": event["dispatch_id"],
                "root_run_id": state["root_run_id"],
                "depth": state["depth"] + 1,
            },
            deadline_ms=deadline,
        )
        return Effects(messages=[message], set_timers=timers, clear_timers=clear)
    action, capabilities = node.action or node.agent or "", node.capabilities
    if tool is not None and tool.action is not None:  # a tool call: the tool's action, its grants
        action, capabilities = tool.action, tool.capabilities
    message = _envelope(event, 0, "ActionActivation")
    message.update(
        definition_id=state["definition_id"],
        root_run_id=state["root_run_id"],
        kind=kind,
        action=action,
        queue=event["queue"],
        input=event["input"],
        deadline_ms=deadline,
        lease_ms=node.lease_ms,
        heartbeat_ms=node.heartbeat_ms,
        capabilities=list(capabilities),
        agent=_agent_spec(state, p, event) if kind == "agent" else None,
    )
    return Effects(messages=[message], set_timers=timers, clear_timers=clear)


def _previous_retry_timer(state: RunState, event: Event) -> str:
    previous = dispatch_id(state["run_id"], event["node"], event["lineage"], event["attempt"] - 1)
    return step_timer_id("retry_backoff", previous)


def _agent_spec(state: RunState, p: Pinned, event: Event) -> dict[str, Any]:
    node = p.node(event["node"])
    item: Any = ABSENT
    scope_state = state["state"]
    loop = split_loop_lineage(event["lineage"])
    lineage = event["lineage"] if loop is None else loop[0]
    try:
        if node.map is not None and lineage:
            item = resolve(node.map, Scope(input=state["input"], state=scope_state))[int(lineage)]
        prompt = resolve(node.prompt, Scope(input=state["input"], state=scope_state, item=item))
    except (RefError, IndexError, TypeError, KeyError):
        prompt = node.prompt  # checked when the step was scheduled; unreachable for a valid run
    spec: dict[str, Any] = {
        "agent": node.agent or "",
        "model": node.model or "",
        "prompt": prompt,
        "output_schema": node.output_schema,
        "structured_output_attempts": node.structured_output_attempts,
    }
    if loop is not None:  # a model turn: the tools it may ask for, and the loop so far
        spec["tools"] = tool_specs(node)
        spec["messages"] = transcript(state, event["node"], loop[0], loop[1])
    return spec


def _settled(state: RunState, event: Event) -> Effects:
    step = state["steps"][instance_key(event["node"], event["lineage"])]
    kind = step["kind"]
    dispatch = event["dispatch_id"]
    clear: list[str] = []
    messages: list[Message] = []
    if step["deadline_ms"] is not None and kind is not None:
        clear.append(
            step_timer_id({"sleep": "sleep", "wait": "wait_timeout"}.get(kind, "node_timeout"), dispatch)
        )
    if step["lease_expires_ms"] is not None:
        clear.append(step_timer_id("lease_expiry", dispatch))
    etype = event["type"]
    if etype == "StepCancelled" and step["retry_due_ms"] is not None:
        clear.append(step_timer_id("retry_backoff", dispatch))
    stop = step.get("stop")
    if stop is not None and "due_ms" in stop:
        clear.append(step_timer_id("stop_timeout", dispatch))
    # an attempt timed out by its executor, or whose lease expired (its worker presumed dead),
    # may still run somewhere: stop it (a stopping one was told at StepStopping)
    # (an agent loop's step was never handed out: only its turns and calls are ever in flight)
    in_flight = "loop" not in step and (
        (etype == "StepCancelled" and step["cancel_in_flight"])
        or (
            etype == "StepFailed"
            and event["failure"]["code"] == "Timeout"
            and event.get("stop") in (None, STOP_LEASE_EXPIRED)
        )
    )
    if in_flight:
        reason = event["reason"] if etype == "StepCancelled" else event["failure"]["message"]
        messages += _cancel_messages(state, event, kind, reason)
    if not messages and not clear:  # most settlements: no timer armed, nothing in flight
        return NONE
    return Effects(messages=messages, clear_timers=clear)


def _stopping(state: RunState, event: Event) -> Effects:
    """Ask the attempt to stop, and bound the wait for its proof (stopping.py)."""
    step = state["steps"][instance_key(event["node"], event["lineage"])]
    return Effects(
        messages=_cancel_messages(state, event, step["kind"], event["reason"]),
        set_timers=[_timer(state, event, "stop_timeout", event["due_ms"])],
    )


def _cancel_messages(state: RunState, event: Event, kind: str | None, reason: str) -> list[Message]:
    if kind in EXECUTOR_KINDS:
        message = _envelope(event, 0, "CancelActivation")
        message["reason"] = reason
        return [message]
    if kind == "workflow":
        message = _envelope(event, 0, "ChildRunCancel")
        message["child_run_id"] = child_run_id(
            state["run_id"], event["node"], event["lineage"], event["attempt"]
        )
        message["reason"] = reason
        return [message]
    return []
