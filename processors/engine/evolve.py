"""`evolve(state, event) -> state`: the fold. Pure; never mutates its argument.

Copy-on-write: each handler copies the top-level dict and only the nested containers it
changes (`steps` and the one step record, the usage ledger, ...). Everything else is
shared with the previous state, which is safe because no one mutates a state in place.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from processors.engine.errors import EventBeforeStart
from processors.engine.ids import instance_key, is_loop_lineage, split_loop_lineage
from processors.engine.pinned import pinned, root_definition
from processors.engine.refs import input_hash
from processors.engine.state import RunState
from processors.engine.vocabulary import KEY_WINDOW, OPEN_STEP_STATUSES, UNSEQUENCED_EVENTS, ZERO_USAGE

Event = dict[str, Any]


def evolve(state: RunState | None, event: Event) -> RunState | None:
    """The run state after `event`: the one fold, for decide's emitter, restore and replay."""
    etype = event["type"]
    if etype in UNSEQUENCED_EVENTS:
        return state  # sequence 0 (RunRejected, CommandDeduplicated): belongs to no run, changes nothing
    if etype == "RunAccepted":
        return _run_accepted(event)
    if state is None:
        raise EventBeforeStart(etype, str(event.get("run_id")))
    handler = _HANDLERS.get(etype)
    if handler is None:
        raise ValueError(f"unknown run event type {etype!r}")
    new = dict(state)
    new["sequence"] = event["sequence"]
    new["updated_ms"] = event["ts_ms"]
    handler(new, event)
    return new


# ------------------------------------------------------------------------- run level


def _run_accepted(ev: Event) -> RunState:
    # The pin's own bundle object, not the event's copy (a restore decodes one per run): see
    # state.load_state.
    pin = pinned(ev["bundle"], ev["bundle_hash"])
    definition = pin.root
    parent = ev.get("parent")
    return {
        "run_id": ev["run_id"],
        "status": "queued",
        "sequence": ev["sequence"],
        "definition_id": ev["definition_id"],
        "revision": ev["revision"],
        "bundle": pin.json,
        "bundle_hash": ev["bundle_hash"],
        "input": ev["input"],
        "input_hash": input_hash(ev["input"]),
        "parent": parent,
        "root_run_id": parent["root_run_id"] if parent else ev["run_id"],
        "depth": parent["depth"] if parent else 0,
        "labels": ev.get("labels") or {},
        "budgets": ev["budgets"],
        "accepted_ms": ev["ts_ms"],
        "updated_ms": ev["ts_ms"],
        "state": _copy_json(definition.state),
        "superstep": 0,
        "frontier": [],
        "maps": {},
        "open": 0,
        "steps": {},
        "usage": {"steps": 0, "retries": 0, "agents": 0, **ZERO_USAGE},
        "warned": [],
        "wall": {"epoch": 0, "used_ms": 0, "since_ms": None, "due_ms": None},
        "signals": [],
        "waits": {},
        "pause": None,
        "output": None,
        "failure": None,
        "cancel_reason": None,
    }


def _copy_json(value: Any) -> Any:
    """`copy.deepcopy` of a JSON value (dicts, lists, immutable scalars), without its memo."""
    kind = type(value)
    if kind is dict:
        return {key: _copy_json(item) for key, item in value.items()}
    if kind is list:
        return [_copy_json(item) for item in value]
    if value is None or kind in _SCALARS:
        return value
    return copy.deepcopy(value)


_SCALARS = frozenset({str, int, float, bool})


def _run_started(s: RunState, ev: Event) -> None:
    definition = root_definition(s["bundle"], s["bundle_hash"])
    s["status"] = "running"
    s["superstep"] = ev["superstep"]
    s["frontier"] = sorted(set(definition.entry))
    s["maps"] = {}
    _arm_wall(s, ev["ts_ms"])


def _arm_wall(s: RunState, now: int) -> None:
    wall = dict(s["wall"])
    limit = s["budgets"].get("wall_time_ms") or 0
    wall["since_ms"] = now
    wall["due_ms"] = now + max(limit - wall["used_ms"], 0) if limit > 0 else None
    s["wall"] = wall


def _stop_wall(s: RunState, now: int) -> None:
    wall = dict(s["wall"])
    if wall["since_ms"] is not None:
        wall["used_ms"] += max(now - wall["since_ms"], 0)
    wall["since_ms"] = None
    s["wall"] = wall


def _superstep_committed(s: RunState, ev: Event) -> None:
    s["state"] = ev["state"]
    s["frontier"] = list(ev["next_frontier"])
    s["superstep"] = ev["superstep"] + 1
    s["maps"] = {}


def _budget_warning(s: RunState, ev: Event) -> None:
    s["warned"] = sorted({*s["warned"], ev["dimension"]})


def _budget_exhausted(s: RunState, ev: Event) -> None:
    pass  # the RunPaused that follows carries the state change; the event is the record


def _run_paused(s: RunState, ev: Event) -> None:
    _end_halt(s)
    s["status"] = "paused"
    s["pause"] = {"code": ev["code"], "reason": ev["reason"]}
    _stop_wall(s, ev["ts_ms"])


def _remember_key(s: RunState, ev: Event) -> None:
    """`command_keys`: the idempotency key of a command the run applied -> [sequence, type] of the
    event that answered it (KEYED_ANSWERS), for the run to answer a repeat with. It keeps the
    KEY_WINDOW most recent keys: the oldest (lowest sequence) is forgotten first. Absent until a
    run applies its first keyed command, so a run that never gets one is as it always was."""
    key = ev.get("idempotency_key")
    if key is None:
        return
    kept = s.get("command_keys")
    keys: dict[str, list[Any]] = dict(kept) if kept else {}
    if len(keys) >= KEY_WINDOW and key not in keys:
        del keys[min(keys, key=lambda k: keys[k][0])]
    keys[key] = [ev["sequence"], ev["type"]]
    s["command_keys"] = keys


def _run_resumed(s: RunState, ev: Event) -> None:
    _remember_key(s, ev)
    old_budgets = s["budgets"]
    s["budgets"] = ev["budgets"]
    s["status"] = "running"
    s["pause"] = None
    s["failure"] = None
    # a warning stays given only for dimensions whose limit did not change (a dimension's limit
    # key: budgets.DIMENSIONS, "tokens" -> "max_tokens"; wall_time_ms is its own)
    s["warned"] = [
        d for d in s["warned"] if old_budgets.get(_limit_key(d)) == ev["budgets"].get(_limit_key(d))
    ]
    wall = dict(s["wall"])
    wall["epoch"] += 1
    s["wall"] = wall
    _arm_wall(s, ev["ts_ms"])


def _limit_key(dimension: str) -> str:
    return dimension if dimension == "wall_time_ms" else f"max_{dimension}"


def _run_cancelling(s: RunState, ev: Event) -> None:
    """The run waits for its stopping attempts before the outcome it names (stopping.py)."""
    _remember_key(s, ev)
    previous = s.get("halting")
    s["status"] = "cancelling"
    s["halting"] = {
        "outcome": ev["outcome"],
        "reason": ev.get("reason"),
        "code": ev.get("code"),
        "failure": ev.get("failure"),
        "step_reason": ev["step_reason"],
        "stops": previous["stops"] if previous is not None else [],
    }
    _stop_wall(s, ev["ts_ms"])


def _end_halt(s: RunState) -> None:
    s.pop("halting", None)  # `s` is this event's own copy of the state


def _run_succeeded(s: RunState, ev: Event) -> None:
    s["status"] = "succeeded"
    s["output"] = ev["output"]
    _stop_wall(s, ev["ts_ms"])


def _run_failed(s: RunState, ev: Event) -> None:
    _end_halt(s)
    s["status"] = "failed"
    s["failure"] = ev["failure"]
    _stop_wall(s, ev["ts_ms"])


def _run_cancelled(s: RunState, ev: Event) -> None:
    _remember_key(s, ev)
    _end_halt(s)
    s["status"] = "cancelled"
    s["cancel_reason"] = ev["reason"]
    _stop_wall(s, ev["ts_ms"])


def _nothing(s: RunState, ev: Event) -> None:
    pass


# ------------------------------------------------------------------------ step level


def _put_step(s: RunState, key: str, step: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Store a new version of a step record and keep the open-activation count."""
    was_open = old is not None and old["superstep"] == s["superstep"] and old["status"] in OPEN_STEP_STATUSES
    is_open = step["status"] in OPEN_STEP_STATUSES
    if was_open != is_open:
        s["open"] = s["open"] + (1 if is_open else -1)
    steps = dict(s["steps"])
    steps[key] = step
    s["steps"] = steps


def _add_usage(s: RunState, usage: dict[str, int] | None, **reserved: int) -> None:
    ledger = dict(s["usage"])
    if usage:
        for name in ("prompt_tokens", "completion_tokens", "cost_micros"):
            ledger[name] += int(usage.get(name) or 0)
    for name, amount in reserved.items():
        ledger[name] += amount
    s["usage"] = ledger


def _step_scheduled(s: RunState, ev: Event) -> None:
    node, lineage = ev["node"], ev["lineage"]
    key = instance_key(node, lineage)
    old = s["steps"].get(key)
    same_superstep = old is not None and old["superstep"] == ev["superstep"]
    retrying = same_superstep and old is not None and old["status"] == "retry_wait"
    # Reservations: a fresh activation takes a step (and an agent); a retry took its retry at
    # StepRetryScheduled; a re-activation after a resume takes nothing (it was reserved once).
    loop = split_loop_lineage(lineage)
    # an agent loop's own step: an agent on no queue (steps.schedule), never dispatched itself
    looping = loop is None and ev["kind"] == "agent" and ev.get("queue") is None
    if not same_superstep:
        if loop is not None:  # an agent loop's model turn takes an agent, its tool call a step
            _add_usage(s, None, steps=0 if loop[2] is None else 1, agents=1 if loop[2] is None else 0)
        else:  # an agent with tools takes a step; its agents are its turns
            _add_usage(s, None, steps=1, agents=1 if ev["kind"] == "agent" and not looping else 0)
    step = {
        "node": node,
        "lineage": lineage,
        "kind": ev["kind"],
        "status": "scheduled",
        "attempt": ev["attempt"],
        "first_attempt": old["first_attempt"] if retrying and old is not None else ev["attempt"],
        "dispatch_id": ev["dispatch_id"],
        "superstep": ev["superstep"],
        "queue": ev.get("queue"),
        "input": ev["input"],
        "input_hash": ev["input_hash"],
        "deadline_ms": ev.get("deadline_ms"),
        "scheduled_ms": ev["ts_ms"],
        "started_ms": None,
        "finished_ms": None,
        "worker_id": None,
        "lease_expires_ms": None,
        "retry_due_ms": None,
        "output": None,
        "failure": None,
        "usage": dict(ZERO_USAGE),
        "reason": None,
        "cancel_in_flight": False,
    }
    if looping:  # a re-activation (a resume) goes on with the loop it had: turns are not paid twice
        if same_superstep and old is not None and "loop" in old:
            # `again`: a turn that failed before the resume is asked again, not taken as the outcome
            step["loop"] = {**old["loop"], "again": True}
        else:
            step["loop"] = {"turn": 0}
    _put_step(s, key, step, old)
    if loop is not None and loop[2] is None:
        _loop_turn(s, node, loop[0], loop[1])
    else:
        _count_item(s, node, lineage)
    if loop is not None:
        _drop_wait(s, key)  # a tool call approved: it waits no more


def _loop_turn(s: RunState, node: str, parent: str, turn: int) -> None:
    """An agent loop's turn was scheduled: its step's `loop.turn` is the latest turn."""
    key = instance_key(node, parent)
    old = s["steps"][key]
    if old["loop"]["turn"] >= turn and "again" not in old["loop"]:
        return  # a turn retried or dispatched again
    step = dict(old)
    step["loop"] = {"turn": max(turn, old["loop"]["turn"])}
    _put_step(s, key, step, old)


def _count_item(s: RunState, node: str, lineage: str) -> None:
    """`maps[node]`: how many items of a mapped node this superstep has activated."""
    if lineage and not is_loop_lineage(lineage) and s["maps"].get(node, 0) <= int(lineage):
        maps = dict(s["maps"])
        maps[node] = int(lineage) + 1
        s["maps"] = maps


def _step_update(s: RunState, ev: Event, **changes: Any) -> None:
    key = instance_key(ev["node"], ev["lineage"])
    old = s["steps"][key]
    step = dict(old)
    step.update(changes)
    _put_step(s, key, step, old)


def _step_started(s: RunState, ev: Event) -> None:
    old = s["steps"][instance_key(ev["node"], ev["lineage"])]
    _step_update(
        s,
        ev,
        status="stopping" if old["status"] == "stopping" else "running",
        started_ms=ev["ts_ms"],
        worker_id=ev["worker_id"],
        lease_expires_ms=ev["lease_expires_ms"],
    )


def _step_lease_extended(s: RunState, ev: Event) -> None:
    _step_update(s, ev, lease_expires_ms=ev["lease_expires_ms"])


def _step_succeeded(s: RunState, ev: Event) -> None:
    _add_usage(s, ev["usage"])
    key = instance_key(ev["node"], ev["lineage"])
    old = s["steps"].get(key)
    if old is None or old["superstep"] != s["superstep"]:
        _settled_unscheduled(s, ev, key, old, "succeeded")  # an empty map
    else:
        _step_update(
            s, ev, status="succeeded", output=ev["output"], usage=ev["usage"], finished_ms=ev["ts_ms"]
        )
    _drop_wait(s, key)


def _step_failed(s: RunState, ev: Event) -> None:
    _add_usage(s, ev["usage"])
    key = instance_key(ev["node"], ev["lineage"])
    old = s["steps"].get(key)
    if old is None or old["superstep"] != s["superstep"]:
        _settled_unscheduled(s, ev, key, old, "failed")  # its input or map source did not resolve
    else:
        stop = _stop_after(old, ev)
        _step_update(
            s,
            ev,
            status="failed",
            failure=ev["failure"],
            usage=ev["usage"],
            finished_ms=ev["ts_ms"],
            **({} if stop is None else {"stop": stop}),
        )
    _drop_wait(s, key)


def _stop_after(old: dict[str, Any], ev: Event) -> dict[str, Any] | None:
    """The step's stop record after a settling event that says how the attempt stopped."""
    how = ev.get("stop")
    if how is None:
        return None
    return {**(old.get("stop") or {}), "how": how}


def _step_stopping(s: RunState, ev: Event) -> None:
    _step_update(
        s,
        ev,
        status="stopping",
        stop={
            "cause": ev["cause"],
            "reason": ev["reason"],
            "failure": ev.get("failure"),
            "due_ms": ev["due_ms"],
        },
    )


def _settled_unscheduled(s: RunState, ev: Event, key: str, old: dict[str, Any] | None, status: str) -> None:
    """A node instance of this superstep that settled without a StepScheduled (an empty map, a
    map source or input that did not resolve). It takes a step, as a scheduled one does, so
    that max_steps bounds a loop through it."""
    _add_usage(s, None, steps=1)
    step: dict[str, Any] = {
        "node": ev["node"],
        "lineage": ev["lineage"],
        "kind": None,
        "status": status,
        "attempt": ev["attempt"],
        "first_attempt": ev["attempt"],
        "dispatch_id": ev["dispatch_id"],
        "superstep": s["superstep"],
        "queue": None,
        "input": None,
        "input_hash": None,
        "deadline_ms": None,
        "scheduled_ms": None,
        "started_ms": None,
        "finished_ms": ev["ts_ms"],
        "worker_id": None,
        "lease_expires_ms": None,
        "retry_due_ms": None,
        "output": ev["output"] if status == "succeeded" else None,
        "failure": ev["failure"] if status == "failed" else None,
        "usage": ev["usage"],
        "reason": None,
        "cancel_in_flight": False,
    }
    _put_step(s, key, step, old)
    _count_item(s, ev["node"], ev["lineage"])


def _step_retry_scheduled(s: RunState, ev: Event) -> None:
    _add_usage(s, None, retries=1)
    _step_update(s, ev, status="retry_wait", retry_due_ms=ev["due_ms"])


def _step_cancelled(s: RunState, ev: Event) -> None:
    key = instance_key(ev["node"], ev["lineage"])
    old = s["steps"][key]
    changes: dict[str, Any] = {}
    stop = _stop_after(old, ev)
    if stop is not None:  # settled from stopping: what its evidence recorded
        usage = ev.get("usage") or dict(ZERO_USAGE)
        _add_usage(s, usage)
        changes.update(stop=stop, usage=usage)
        halting = s.get("halting")
        if halting is not None:
            entry = {
                "node": ev["node"],
                "lineage": ev["lineage"],
                "attempt": ev["attempt"],
                "stop": stop["how"],
            }
            s["halting"] = {**halting, "stops": [*halting["stops"], entry]}
    _step_update(
        s,
        ev,
        status="cancelled",
        reason=ev["reason"],
        finished_ms=ev["ts_ms"],
        cancel_in_flight=old["status"] in ("scheduled", "running"),
        **changes,
    )
    _drop_wait(s, key)


def _step_skipped(s: RunState, ev: Event) -> None:
    node, lineage = ev["node"], ev["lineage"]
    key = instance_key(node, lineage)
    old = s["steps"].get(key)
    step = (
        dict(old)
        if old is not None
        else {
            "node": node,
            "lineage": lineage,
            "kind": None,
            "attempt": 0,
            "first_attempt": 0,
            "dispatch_id": None,
            "queue": None,
            "input": None,
            "input_hash": None,
            "deadline_ms": None,
            "scheduled_ms": None,
            "started_ms": None,
            "worker_id": None,
            "lease_expires_ms": None,
            "retry_due_ms": None,
            "output": None,
            "failure": None,
            "usage": dict(ZERO_USAGE),
            "cancel_in_flight": False,
        }
    )
    step.update(status="skipped", reason=ev["reason"], superstep=s["superstep"], finished_ms=ev["ts_ms"])
    _put_step(s, key, step, old)


def _run_waiting(s: RunState, ev: Event) -> None:
    key = instance_key(ev["node"], ev["lineage"])
    _step_update(s, ev, status="waiting")
    waits = dict(s["waits"])
    waits[key] = {
        "node": ev["node"],
        "lineage": ev["lineage"],
        "signal": ev["signal"],
        "due_ms": ev.get("due_ms"),
    }
    s["waits"] = waits


def _signal_received(s: RunState, ev: Event) -> None:
    _remember_key(s, ev)
    if ev.get("node") is None:
        s["signals"] = [*s["signals"], {"signal": ev["signal"], "payload": ev["payload"]}]
        return
    # Delivered to a wait node: it is either consumed from the buffer (the wait was just
    # reached) or arrived live (then no buffered signal of that name exists).
    signals = s["signals"]
    for index, buffered in enumerate(signals):
        if buffered["signal"] == ev["signal"]:
            s["signals"] = signals[:index] + signals[index + 1 :]
            break


def _drop_wait(s: RunState, key: str) -> None:
    if key in s["waits"]:
        waits = dict(s["waits"])
        del waits[key]
        s["waits"] = waits


_HANDLERS: dict[str, Callable[[RunState, Event], None]] = {
    "RunStarted": _run_started,
    "StepScheduled": _step_scheduled,
    "StepStarted": _step_started,
    "StepLeaseExtended": _step_lease_extended,
    "StepSucceeded": _step_succeeded,
    "StepFailed": _step_failed,
    "StepRetryScheduled": _step_retry_scheduled,
    "StepSkipped": _step_skipped,
    "StepCancelled": _step_cancelled,
    "StepStopping": _step_stopping,
    "SuperstepCommitted": _superstep_committed,
    "RunWaiting": _run_waiting,
    "SignalReceived": _signal_received,
    "BudgetWarning": _budget_warning,
    "BudgetExhausted": _budget_exhausted,
    "RunPaused": _run_paused,
    "RunCancelling": _run_cancelling,
    "RunResumed": _run_resumed,
    "RunSucceeded": _run_succeeded,
    "RunFailed": _run_failed,
    "RunCancelled": _run_cancelled,
    "ReceiptConflict": _nothing,
}

EVENT_TYPES = frozenset({"RunAccepted", *UNSEQUENCED_EVENTS, *_HANDLERS})
