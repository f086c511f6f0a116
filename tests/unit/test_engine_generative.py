"""The engine against generated workflows and a generated outside world (engine_world.py).

Each example is one random definition and one random history of executor receipts, timers and
client commands, checked after every input against the invariants of docs/semantics.md, then
drained (every activation answered, every timer fired) to check that the run cannot get stuck.

Its size comes from RUNFOLD_ENGINE_FUZZ_EXAMPLES (default 500 examples, ~15 s). The soak
(`bash scripts/test.sh soak`, 20,000 examples here: tests/conftest.py's `soak` profile), or this
module alone:
    HYPOTHESIS_PROFILE=soak .venv/bin/pytest -s -q --timeout 0 tests/unit/test_engine_generative.py
prints what the generated runs did (outcomes, events, drop reasons) at the end
(RUNFOLD_ENGINE_FUZZ_SHRINK=0: report a failure as found, without shrinking it).
"""

from __future__ import annotations

import os

import pytest
from engine_world import STATS, World, definitions, run_inputs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from processors.engine import DefinitionError

EXAMPLES = int(os.environ.get("RUNFOLD_ENGINE_FUZZ_EXAMPLES", "500"))
# A soak finds failures faster than it can shrink them (a long history takes minutes): with
# RUNFOLD_ENGINE_FUZZ_SHRINK=0 it reports the first failure as found; re-run it to shrink.
PHASES = [p for p in Phase if os.environ.get("RUNFOLD_ENGINE_FUZZ_SHRINK", "1") != "0" or p != Phase.shrink]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(raw=definitions(), run_input=run_inputs(), data=st.data())
def test_generated_workflows_keep_every_invariant(raw: dict, run_input: dict, data: st.DataObject) -> None:
    try:
        world = World(raw, run_input)
    except DefinitionError:
        STATS["definitions refused"] += 1
        return
    STATS["workflows"] += 1
    world.send(world.start_message(run_input))
    steps = data.draw(st.integers(0, 80), label="random inputs")
    for _ in range(steps):
        choice = data.draw(st.sampled_from(world.choices()), label="next")
        world.act(choice, data)
    world.drain()


@pytest.fixture(scope="module", autouse=True)
def _report() -> object:
    yield
    if EXAMPLES > 1000:
        print("\ngenerated runs:")
        for name, count in sorted(STATS.items()):
            print(f"  {count:>9}  {name}")
