"""Issue 27 with a real broker, processor and worker: "cancelled" means stopped.

A handler that counts its executions and records their time spans (stopping_actions.py) takes
a while to stop once cancelled. Under cancels, node timeouts and retries: no two attempts of
one step overlap in time while their worker is alive, and no handler is still running when its
run's RunCancelled is committed, except one reported stop_unconfirmed. (Before the stopping
phase the cancel settled at once and a timed-out attempt's retry started while it drained:
both checks failed.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stopping_actions
from executor_support import WorkerThread
from processor_support import Commands, Reader, make_settings, running, setup_topology

from processors.executors import Worker
from processors.executors.settings import WorkerSettings
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
WF = "runfold.workflow/v1"


def _definition(wid: str, **node: Any) -> dict[str, Any]:
    return {
        "schema": WF,
        "id": wid,
        "revision": 1,
        "state": {"out": None},
        "entry": ["a"],
        "nodes": {
            "a": {
                "kind": "action",
                "action": "test.spans",
                "map": {"from": "input", "pointer": "/items"},
                "input": {"from": "item"},
                "heartbeat_ms": 300,
                "lease_ms": 3000,
                "on_failure": "continue",
                **node,
            }
        },
    }


# three items, each running 30 s unless cancelled, stopping 400 ms after the cancel
CANCELLED = _definition("stop-cancel")
# each attempt times out at 2.5 s and drains 800 ms; retried after 50 ms: overlap without the phase
TIMED_OUT = _definition("stop-timeout", timeout_ms=2500, retry={"max_attempts": 3, "backoff_ms": 50})
LONG = {"ms": 30_000, "stop_ms": 400}


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [CANCELLED, TIMED_OUT])
    yield s
    from topology.admin import delete_topology

    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {topic_prefix} failed: {e}")


def _worker(settings: ProcessorSettings, grace_ms: int = 5000) -> WorkerThread:
    worker = Worker(
        name="stop", settings=WorkerSettings(queues=["default"], concurrency=16, cancel_grace_ms=grace_ms)
    )
    return WorkerThread(worker, settings)


def _spans(run_id: str) -> dict[tuple[str, str], list[tuple[int, int, int]]]:
    out: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for run, node, lineage, attempt, start, end in list(stopping_actions.SPANS):
        if run == run_id:
            out.setdefault((node, lineage), []).append((attempt, start, end))
    return {key: sorted(value, key=lambda span: span[1]) for key, value in out.items()}


def _no_overlap(run_id: str) -> int:
    executions = 0
    for key, spans in _spans(run_id).items():
        executions += len(spans)
        for (a1, _s1, e1), (a2, s2, _e2) in itertools.pairwise(spans):
            assert s2 >= e1, f"{run_id} {key}: attempt {a2} started at {s2} while attempt {a1} ran until {e1}"
    return executions


def test_cancel_waits_for_every_handler_to_stop(settings: ProcessorSettings) -> None:
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    runs = [f"cancel-{i}" for i in range(4)]
    with running(settings), _worker(settings):
        for run in runs:
            commands.start(run, "stop-cancel", {"items": [LONG, LONG, LONG]})
        commands.flush()
        events.wait_for(lambda r: all(len(events.of(x, "StepStarted")) == 3 for x in runs), 60, "started")
        for run in runs:
            commands.cancel(run, "stop now")
        commands.flush()
        events.wait_for(lambda r: all(events.of(x, "RunCancelled") for x in runs), 60, "RunCancelled")
    for run in runs:
        [ended] = events.of(run, "RunCancelled")
        spans = [span for spans in _spans(run).values() for span in spans]
        assert len(spans) == 3 and _no_overlap(run) == 3  # each item ran once
        # committed after the receipt that was made once the last handler had returned
        assert max(end for _a, _s, end in spans) <= ended["ts_ms"]
        assert [s["stop"] for s in ended["stops"]] == ["confirmed"] * 3
        assert events.of(run, "RunCancelling") and not events.of(run, "RunSucceeded")
    events.close()


def test_a_timed_out_attempt_is_retried_only_after_it_stopped(settings: ProcessorSettings) -> None:
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    run = "timeout-1"
    with running(settings), _worker(settings):
        commands.start(run, "stop-timeout", {"items": [{"ms": 20_000, "stop_ms": 800}] * 2})
        commands.flush()
        events.wait_for(lambda r: bool(events.of(run, "RunSucceeded")), 90, "the run ends")
    # every started attempt ran once, each after the previous one stopped (an attempt the worker
    # took after its deadline fails without running: the first ones, while the worker warms up)
    assert _no_overlap(run) == len(events.of(run, "StepStarted")) >= 4
    failed = events.of(run, "StepFailed")
    assert len(failed) == 6 and {e["failure"]["code"] for e in failed} == {"Timeout", "RetryExhausted"}
    # never assumed (the worker lived); None: the worker's own Timeout, sent once its handler
    # stopped, came before the processor's node timeout fired
    assert {e["stop"] for e in failed} <= {"failed", "confirmed", None}
    scheduled = {(e["lineage"], e["attempt"]): e["ts_ms"] for e in events.of(run, "StepScheduled")}
    for e in failed:  # a retry is scheduled only after the previous attempt's evidence
        nxt = scheduled.get((e["lineage"], e["attempt"] + 1))
        assert nxt is None or nxt >= e["ts_ms"]
    events.close()


def test_a_handler_that_cannot_stop_is_reported_stop_unconfirmed(settings: ProcessorSettings) -> None:
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    run = "stuck-1"
    with running(settings), _worker(settings, grace_ms=300):
        commands.start(run, "stop-cancel", {"items": [{"ms": 30_000, "stop_ms": 4000}]})
        commands.flush()
        events.wait_for(lambda r: bool(events.of(run, "StepStarted")), 60, "started")
        commands.cancel(run, "stop now")
        commands.flush()
        events.wait_for(lambda r: bool(events.of(run, "RunCancelled")), 30, "RunCancelled")
        [ended] = events.of(run, "RunCancelled")
        assert [s["stop"] for s in ended["stops"]] == ["stop_unconfirmed"]
        # the exception the rule allows, and the only one: it is still running, and said so
        assert [key for key in stopping_actions.RUNNING if key[0] == run]
    events.close()
