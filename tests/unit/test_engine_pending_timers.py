"""`timers_of(state)` equals the timers the run's events arm and clear (their `effects`, folded
in order as a restore from the log folds them), after every event of generated runs
(engine_world: generated definitions, executors, timers, cancels, signals, resumes)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from engine_world import World, definitions, run_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine import DefinitionError, effects, evolve
from processors.engine.pending import timers_of

EXAMPLES = int(os.environ.get("RUNFOLD_PENDING_TIMER_EXAMPLES", "150"))


def folded_timers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timers after folding `events` as Folder.fold_committed does (no TimerFired input
    ever clears one here: those are not events), checked against timers_of at every step."""
    state = None
    timers: dict[str, dict[str, Any]] = {}
    for i, event in enumerate(events):
        state = evolve(state, event)
        if state is None:
            continue
        fx = effects(state, event)
        for timer_id in fx.clear_timers:
            timers.pop(timer_id, None)
        for body in fx.set_timers:
            timers[body["timer_id"]] = {**body, "run_id": state["run_id"]}
        expected = [timers[k] for k in sorted(timers)]
        got = timers_of(state)
        assert got == expected, f"after event {i} ({event['type']}): {got} != {expected}"
    return [timers[k] for k in sorted(timers)]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(raw=definitions(), run_input=run_inputs(), data=st.data())
def test_timers_of_a_state_are_the_timers_its_events_left_armed(
    raw: dict[str, Any], run_input: Any, data: st.DataObject
) -> None:
    try:
        world = World(raw, run_input)
    except DefinitionError:
        return
    world.send(world.start_message(run_input))
    for _ in range(data.draw(st.integers(0, 60), label="random inputs")):
        world.act(data.draw(st.sampled_from(world.choices()), label="next"), data)
    if data.draw(st.booleans(), label="drain"):
        world.drain()
    folded_timers(world.log)


def test_no_state_has_no_timers() -> None:
    assert timers_of(None) == []


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled", "paused"])
def test_a_stopped_run_keeps_no_wall_timer(status: str) -> None:
    state = {
        "run_id": "r",
        "status": status,
        "wall": {"epoch": 1, "used_ms": 5, "since_ms": None, "due_ms": 99},
        "steps": {},
        "waits": {},
    }
    assert timers_of(state) == []
