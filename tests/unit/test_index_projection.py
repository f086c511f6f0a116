"""The run index's projection agrees with the engine's fold on every generated history.

The engine's generative world (engine_world.py) drives random definitions through random
executor behaviour, timers and client commands; every event it emits is folded both by the
engine's `evolve` and by the index's projection. After every event the projection must give the
same run status as `processors.engine.run_status`, the same usage ledger and the same step
records (status, attempt, superstep, timings, failure). Then the projection is written to an
SQLite index and read back: the same rows.

Size: RUNFOLD_INDEX_FUZZ_EXAMPLES (default 150 examples).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from engine_world import World, definitions, run_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine import DefinitionError, evolve, run_status
from processors.index.projection import RunRow, Skip, accept, apply
from processors.index.store import Batch, RunFilter, SQLiteIndex

EXAMPLES = int(os.environ.get("RUNFOLD_INDEX_FUZZ_EXAMPLES", "150"))


def assert_agrees(run: RunRow, state: dict[str, Any], after: str) -> None:
    where = f"after {after} (sequence {state['sequence']})"
    assert run.status() == run_status(state), where
    assert run.phase == state["status"], where
    assert (run.sequence, run.updated_ms, run.superstep) == (
        state["sequence"],
        state["updated_ms"],
        state["superstep"],
    ), where
    ledger = state["usage"]
    assert (
        run.ledger_steps,
        run.retries,
        run.agents,
        run.prompt_tokens,
        run.completion_tokens,
        run.cost_micros,
    ) == (
        ledger["steps"],
        ledger["retries"],
        ledger["agents"],
        ledger["prompt_tokens"],
        ledger["completion_tokens"],
        ledger["cost_micros"],
    ), where
    assert set(run.steps) == set(state["steps"]), where
    assert {k for k, s in run.steps.items() if s.waiting} == set(state["waits"]), where
    for key, expected in state["steps"].items():
        got = run.steps[key]
        failure = expected.get("failure") or {}
        assert (
            got.status,
            got.attempt,
            got.first_attempt,
            got.superstep,
            got.kind,
            got.scheduled_ms,
            got.started_ms,
            got.finished_ms,
            got.failure_code,
            got.prompt_tokens,
            got.cost_micros,
        ) == (
            expected["status"],
            expected["attempt"],
            expected["first_attempt"],
            expected["superstep"],
            expected["kind"],
            expected["scheduled_ms"],
            expected["started_ms"],
            expected["finished_ms"],
            failure.get("code"),
            expected["usage"]["prompt_tokens"],
            expected["usage"]["cost_micros"],
        ), f"step {key} {where}"
    failure = state.get("failure") or {}
    assert run.failure_code == failure.get("code"), where


def fold_both(log: list[dict[str, Any]]) -> RunRow | None:
    state: dict[str, Any] | None = None
    run: RunRow | None = None
    for event in log:
        event = orjson.loads(orjson.dumps(event))  # as read back from the topic
        state = evolve(state, event)
        if event["type"] == "RunAccepted":
            run = accept(event)
        else:
            assert run is not None
            apply(run, event)
        assert state is not None
        assert_agrees(run, state, event["type"])
    return run


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(raw=definitions(), run_input=run_inputs(), data=st.data())
def test_projection_agrees_with_evolve_and_run_status(
    raw: dict, run_input: dict, data: st.DataObject
) -> None:
    try:
        world = World(raw, run_input)
    except DefinitionError:
        return
    world.send(world.start_message(run_input))
    for _ in range(data.draw(st.integers(0, 60), label="random inputs")):
        world.act(data.draw(st.sampled_from(world.choices()), label="next"), data)
    world.drain()
    run = fold_both(world.log)
    if run is None:
        return
    # the rows written to the database and read back are the same projection
    with tempfile.TemporaryDirectory() as tmp:
        index = SQLiteIndex(Path(tmp) / "i.sqlite")
        index.write(Batch(runs=[run], new_runs=[run], offsets={("t", 0): 1}))
        run.dirty_steps.clear()
        loaded = index.load_runs([run.run_id])[run.run_id]
        loaded.dirty_steps.clear()
        assert loaded == run
        row = index.get(run.run_id)
        assert row is not None and row["status"] == run.status()
        assert index.search(RunFilter(status=(run.status(),))).runs[0]["run_id"] == run.run_id
        index.close()


def test_an_event_for_a_step_never_scheduled_is_refused_not_guessed() -> None:
    accepted = {
        "type": "RunAccepted",
        "run_id": "r",
        "sequence": 1,
        "ts_ms": 1,
        "definition_id": "d",
        "revision": 1,
        "bundle_hash": "h",
        "labels": {"team": "a"},
        "budgets": {},
    }
    run = accept(accepted)
    with pytest.raises(Skip, match="never scheduled"):
        apply(
            run,
            {
                "type": "StepStarted",
                "run_id": "r",
                "sequence": 2,
                "ts_ms": 2,
                "node": "x",
                "lineage": "",
                "worker_id": "w",
            },
        )
    with pytest.raises(Skip, match="unknown run event type"):
        apply(run, {"type": "RunExploded", "run_id": "r", "sequence": 2, "ts_ms": 2})
    assert run.sequence == 1 and run.status() == "queued"
