"""The test harness (processors.testing) and the real system give the same runs: the same
example definitions, run ids, inputs and signals, once in memory and once through the run
processor, a worker and the child executor on the broker; the same events (in order where the
run is sequential, as a multiset where a map fan-out runs in parallel), outputs and children."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import WorkerThread
from processor_support import Commands, Reader, make_settings, running, setup_topology
from test_executors_e2e import ChildExecutorThread

import processors.demo.actions  # registers demo.flaky and demo.search (@action)
from processors.client.definitions import load_source
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from processors.testing import WorkflowEnvironment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"
USED = ("flaky-retry", "demo-research", "summarize", "one-step")
TERMINAL = ("RunSucceeded", "RunFailed", "RunCancelled")
assert processors.demo.actions.flaky  # the import is for its registrations


def _raw(name: str) -> dict[str, Any]:
    return load_source(EXAMPLES / f"{name}.yaml")[1]


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [_raw(name) for name in USED])
    yield s
    from topology.admin import delete_topology

    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {topic_prefix} failed: {e}")


def _comparable(event: dict[str, Any]) -> tuple[str, str, str]:
    return event["type"], event.get("node") or "", event.get("lineage") or ""


def test_the_harness_and_the_processor_agree_on_the_examples(settings: ProcessorSettings) -> None:
    runs = {
        "cmp-one": ("one-step", {"text": "hi"}),
        "cmp-flaky": ("flaky-retry", {"fail_times": 2, "key": "k"}),
        "cmp-research": ("demo-research", {"topic": "exactly once"}),
    }
    approval = {"approved": True}
    with WorkflowEnvironment(*(EXAMPLES / f"{n}.yaml" for n in USED)) as env:
        harness = {
            run_id: env.run(
                defn,
                run_input,
                run_id=run_id,
                signals=[("approval", approval)] if defn == "demo-research" else (),
            )
            for run_id, (defn, run_input) in runs.items()
        }
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    worker = Worker(name="cmp", queues=["default", "agents"])
    with running(settings), WorkerThread(worker, settings), ChildExecutorThread(settings):
        # one-step first: once it ends the worker serves, so no later attempt meets a deadline
        # that passed while the worker was still joining its group (a timing, not a semantics)
        for run_id, (defn, run_input) in runs.items():
            commands.start(run_id, defn, run_input)
            commands.flush()
            if run_id == "cmp-one":
                events.wait_for(lambda r: bool(events.of("cmp-one", "RunSucceeded")), 90, "cmp-one")
        events.wait_for(lambda r: bool(events.of("cmp-research", "RunWaiting")), 90, "RunWaiting")
        commands.send(
            "commands", "cmp-research", {"type": "SignalRun", "signal": "approval", "payload": approval}
        )
        commands.flush()
        events.wait_for(
            lambda r: all(any(e["type"] in TERMINAL for e in events.of(run_id)) for run_id in runs),
            90,
            "terminal",
        )
    for run_id in runs:
        real, mine = events.of(run_id), harness[run_id]
        assert mine.status == "succeeded", mine.event_types
        assert real[-1]["type"] == "RunSucceeded", [e["type"] for e in real]
        assert real[-1]["output"] == mine.output, run_id
        if run_id == "cmp-research":  # the fan-out's attempts interleave as the worker runs them
            assert Counter(map(_comparable, real)) == Counter(map(_comparable, mine.events))
        else:
            assert [_comparable(e) for e in real] == [_comparable(e) for e in mine.events]
        assert [e["sequence"] for e in real] == [e["sequence"] for e in mine.events]
    child = harness["cmp-research"].child("write")
    assert [_comparable(e) for e in events.of(child.run_id)] == [_comparable(e) for e in child.events]
    events.close()
