"""`timers_of(state) -> [TimerFired body]`: the timers a run's state has armed.

A store restored from a run's snapshot (its latest state, `<p>.run-state`) instead of its
events needs the timers that folding the events' `effects` would have left armed: this is
that set, read from the state alone. It must equal the event fold's exactly, timer ids, due
times and bodies (tests/unit/test_engine_pending_timers.py folds generated histories both
ways after every event). Each rule names the effects that arm and clear the timer:

- `wall_time:<run>:<epoch>`: armed at RunStarted/RunResumed when the run has a wall-time
  budget, cleared at every run-stopping event; `wall.since_ms` is set exactly in between.
- `sleep` / `node_timeout` / `wait_timeout` (`step.deadline_ms`, armed at StepScheduled;
  a wait's at RunWaiting), `lease_expiry` (StepStarted, StepLeaseExtended), `stop_timeout`
  (StepStopping): cleared when the attempt settles, so armed while its step is open.
- `retry_backoff`: armed at StepRetryScheduled (status `retry_wait`), cleared by the next
  attempt's StepScheduled or a StepCancelled.
"""

from __future__ import annotations

from typing import Any

from processors.engine.ids import step_timer_id, wall_timer_id
from processors.engine.state import RunState
from processors.engine.vocabulary import DISPATCHED_KINDS

Timer = dict[str, Any]
# statuses of a step whose attempt has not settled (retry_wait: settled, its retry not begun)
_UNSETTLED = frozenset({"scheduled", "running", "waiting", "stopping"})


def _timer(run_id: str, step: dict[str, Any], kind: str, due: int) -> Timer:
    # the key order of effects._timer: the store holds these bodies as JSON bytes
    return {
        "type": "TimerFired",
        "run_id": run_id,
        "timer_id": step_timer_id(kind, step["dispatch_id"]),
        "timer_kind": kind,
        "due_ms": due,
        "node": step["node"],
        "lineage": step["lineage"],
        "attempt": step["attempt"],
        "dispatch_id": step["dispatch_id"],
    }


def wall_timer(run_id: str, wall: dict[str, Any]) -> Timer:
    """The run's wall-time timer as its `wall` record arms it (effects: RunStarted, RunResumed)."""
    return {
        "type": "TimerFired",
        "run_id": run_id,
        "timer_id": wall_timer_id(run_id, wall["epoch"]),
        "timer_kind": "wall_time",
        "due_ms": wall["due_ms"],
        "node": None,
        "lineage": None,
        "attempt": None,
        "dispatch_id": None,
    }


def timers_of(state: RunState | None) -> list[Timer]:
    """The TimerFired bodies of every timer the run's events have armed and not cleared,
    ordered by timer id."""
    if state is None:
        return []
    run_id: str = state["run_id"]
    out: list[Timer] = []
    wall = state["wall"]
    if wall["since_ms"] is not None and wall["due_ms"] is not None:
        out.append(wall_timer(run_id, wall))
    waits = state["waits"]
    for key, step in state["steps"].items():
        status, kind = step["status"], step["kind"]
        if status == "retry_wait":
            due = step["retry_due_ms"]
            if due is not None:
                out.append(_timer(run_id, step, "retry_backoff", due))
            continue
        if status not in _UNSETTLED:
            continue
        deadline = step["deadline_ms"]
        if kind == "sleep":
            out.append(
                _timer(run_id, step, "sleep", deadline if deadline is not None else step["scheduled_ms"])
            )
        elif kind in DISPATCHED_KINDS and "loop" not in step and deadline is not None:
            out.append(_timer(run_id, step, "node_timeout", deadline))
        wait = waits.get(key)
        if wait is not None and wait["due_ms"] is not None:
            out.append(_timer(run_id, step, "wait_timeout", wait["due_ms"]))
        if step["lease_expires_ms"] is not None and status in ("running", "stopping"):
            out.append(_timer(run_id, step, "lease_expiry", step["lease_expires_ms"]))
        stop = step.get("stop")
        if status == "stopping" and stop is not None and "due_ms" in stop:
            out.append(_timer(run_id, step, "stop_timeout", stop["due_ms"]))
    out.sort(key=lambda t: t["timer_id"])
    return out
