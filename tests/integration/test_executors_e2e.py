"""End to end with the run processor: real workers (threads and `kill -9`-able processes),
the child-run executor and test code sending commands and signals."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import WorkerThread, spawn_worker
from processor_support import Commands, Reader, make_settings, running, setup_topology

from processors.executors import Worker
from processors.executors.child_executor import ChildExecutor
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
HERE = Path(__file__).resolve().parent
WF = "runfold.workflow/v1"

QUERIES = {
    "type": "object",
    "required": ["queries"],
    "properties": {"queries": {"type": "array", "items": {"type": "string"}, "minItems": 5, "maxItems": 5}},
}
RESEARCH = {
    "schema": WF,
    "id": "e2e-research",
    "revision": 1,
    "state": {"plan": None, "notes": [], "brief": None, "approved": False},
    "reducers": {"notes": "append"},
    "entry": ["plan"],
    "nodes": {
        "plan": {
            "kind": "agent",
            "agent": "planner",
            "model": "small",
            "output_schema": QUERIES,
            "prompt": {"system": "Plan five searches.", "user": {"from": "input", "pointer": "/topic"}},
            "structured_output_attempts": 2,
            "writes": {"plan": {"from": "output"}},
        },
        "search": {
            "kind": "action",
            "action": "echo",
            "map": {"from": "state", "pointer": "/plan/queries"},
            "input": {"query": {"from": "item"}},
            "writes": {"notes": {"from": "output"}},
        },
        "write": {
            "kind": "workflow",
            "workflow": "e2e-summarize",
            "revision": 1,
            "input": {"notes": {"from": "state", "pointer": "/notes"}},
            "writes": {"brief": {"from": "output"}},
        },
        "review": {
            "kind": "wait",
            "signal": "approval",
            "timeout_ms": 60_000,
            "writes": {"approved": {"from": "signal", "pointer": "/approved"}},
        },
    },
    "routes": {"plan": ["search"], "search": ["write"], "write": ["review"]},
}
SUMMARIZE = {
    "schema": WF,
    "id": "e2e-summarize",
    "revision": 1,
    "state": {"summary": None},
    "output": {"from": "state", "pointer": "/summary"},
    "entry": ["sum"],
    "nodes": {
        "sum": {"kind": "action", "action": "test.identity", "writes": {"summary": {"from": "output"}}}
    },
}


def _one(wid: str, action: str, input: Any, **node: Any) -> dict[str, Any]:
    return {
        "schema": WF,
        "id": wid,
        "revision": 1,
        "state": {"out": None},
        "entry": ["a"],
        "nodes": {
            "a": {
                "kind": "action",
                "action": action,
                "input": {"from": "literal", "value": input},
                "writes": {"out": {"from": "output"}},
                **node,
            }
        },
    }


SLOW_LEASED = _one(
    "e2e-slow",
    "test.slow",
    {"ms": 2500},
    lease_ms=2000,
    heartbeat_ms=500,
    retry={"max_attempts": 3, "backoff_ms": 100},
)
REJECT = _one("e2e-reject", "test.reject", {}, retry={"max_attempts": 3, "backoff_ms": 100})
LONG = _one("e2e-long", "test.slow", {"ms": 60_000}, heartbeat_ms=2000, lease_ms=10_000)
PARENT_OF_LONG = {
    "schema": WF,
    "id": "e2e-parent",
    "revision": 1,
    "state": {"out": None},
    "entry": ["child"],
    "nodes": {
        "child": {
            "kind": "workflow",
            "workflow": "e2e-long",
            "revision": 1,
            "writes": {"out": {"from": "output"}},
        }
    },
}


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [RESEARCH, SUMMARIZE, SLOW_LEASED, REJECT, LONG, PARENT_OF_LONG])
    yield s
    from topology.admin import delete_topology

    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {topic_prefix} failed: {e}")


class ChildExecutorThread:
    def __init__(self, settings: ProcessorSettings) -> None:
        self.executor = ChildExecutor(settings)
        self.thread = threading.Thread(target=lambda: self.executor.run(install_signals=False), daemon=True)

    def __enter__(self) -> ChildExecutor:
        self.thread.start()
        return self.executor

    def __exit__(self, *exc: object) -> None:
        self.executor.request_stop()
        self.thread.join(20)


def _events(settings: ProcessorSettings) -> Reader:
    return Reader(settings, [settings.topics.run_events], "run_events")


def test_agent_map_child_workflow_and_signal(settings: ProcessorSettings) -> None:
    import actions_for_tests  # noqa: F401  (test.identity for the child workflow)

    events, commands = _events(settings), Commands(settings)
    worker = Worker(name="e2e", queues=["default", "agents"])
    with running(settings), WorkerThread(worker, settings), ChildExecutorThread(settings) as child:
        commands.start("brief-1", "e2e-research", {"topic": "exactly once kafka workflows"})
        commands.flush()
        events.wait_for(
            lambda r: any(e["type"] == "RunWaiting" for e in events.of("brief-1")), 90, "RunWaiting"
        )
        commands.send(
            "commands", "brief-1", {"type": "SignalRun", "signal": "approval", "payload": {"approved": True}}
        )
        commands.flush()
        events.wait_for(
            lambda r: bool(events.of("brief-1", "RunSucceeded") or events.of("brief-1", "RunFailed")),
            60,
            "terminal",
        )
    assert not events.of("brief-1", "RunFailed"), events.of("brief-1", "RunFailed")
    out = events.of("brief-1", "RunSucceeded")[0]["output"]
    assert len(out["plan"]["queries"]) == 5 and out["approved"] is True
    assert sorted(n["query"] for n in out["notes"]) == sorted(out["plan"]["queries"])
    assert out["brief"]["input"] == {"notes": out["notes"]} and out["brief"]["run"] == "brief-1/write"
    child_events = events.of("brief-1/write")
    assert (
        child_events[0]["type"] == "RunAccepted" and child_events[0]["parent"]["parent_run_id"] == "brief-1"
    )
    assert child.counts["started"] == 1 and child.counts["finished"] == 1
    usage = events.of("brief-1", "RunSucceeded")[0]["usage"]
    assert usage["prompt_tokens"] > 0 and usage["cost_micros"] > 0
    mapped = {e["lineage"] for e in events.of("brief-1", "StepSucceeded") if e["node"] == "search"}
    assert mapped == {"0", "1", "2", "3", "4"}
    events.close()


def test_kill_9_worker_lease_expires_and_new_attempt_succeeds(settings: ProcessorSettings) -> None:
    events, commands = _events(settings), Commands(settings)
    with running(settings):
        first = spawn_worker(settings, "doomed")
        second = None
        try:
            commands.start("kill-1", "e2e-slow", {})
            commands.flush()
            events.wait_for(lambda r: bool(events.of("kill-1", "StepStarted")), 60, "StepStarted")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            events.wait_for(
                lambda r: bool(events.of("kill-1", "StepRetryScheduled")), 30, "lease expiry retry"
            )
            second = spawn_worker(settings, "rescuer")
            events.wait_for(
                lambda r: bool(events.of("kill-1", "RunSucceeded") or events.of("kill-1", "RunFailed")),
                60,
                "terminal",
            )
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
    failed = [e for e in events.of("kill-1", "StepFailed")]
    assert failed and failed[0]["failure"]["code"] == "Timeout" and failed[0]["attempt"] == 1
    started = events.of("kill-1", "StepStarted")
    assert started[0]["worker_id"].startswith("doomed") and started[-1]["worker_id"].startswith("rescuer")
    done = events.of("kill-1", "RunSucceeded")[0]["output"]["out"]
    assert done["attempt"] == 2 and done["key"] == started[-1]["dispatch_id"] != started[0]["dispatch_id"]
    events.close()


def test_non_retryable_error_fails_without_retries(settings: ProcessorSettings) -> None:
    events, commands = _events(settings), Commands(settings)
    with running(settings), WorkerThread(Worker(name="e2e", queues=["default"]), settings):
        import actions_for_tests  # noqa: F401

        commands.start("reject-1", "e2e-reject", {})
        commands.flush()
        events.wait_for(
            lambda r: bool(events.of("reject-1", "RunFailed") or events.of("reject-1", "RunSucceeded")),
            60,
            "terminal",
        )
    assert events.of("reject-1", "RunFailed")
    assert not events.of("reject-1", "StepRetryScheduled")
    assert [e["attempt"] for e in events.of("reject-1", "StepScheduled")] == [1]
    assert events.of("reject-1", "StepFailed")[0]["failure"]["code"] == "InvalidInput"
    events.close()


def test_cancel_run_reaches_the_handler_within_one_heartbeat(settings: ProcessorSettings) -> None:
    import actions_for_tests  # noqa: F401

    events, commands = _events(settings), Commands(settings)
    receipts = Reader(settings, [settings.topics.receipts], "receipts")
    with running(settings), WorkerThread(Worker(name="e2e", queues=["default"]), settings):
        commands.start("cancel-1", "e2e-long", {})
        commands.flush()
        events.wait_for(lambda r: bool(events.of("cancel-1", "StepStarted")), 60, "StepStarted")
        sent = time.monotonic()
        commands.cancel("cancel-1", "user changed their mind")
        commands.flush()
        receipts.wait_for(
            lambda r: bool(receipts.of("cancel-1", "ActivationCancelled")), 20, "ActivationCancelled"
        )
        latency = time.monotonic() - sent
        events.wait_for(lambda r: bool(events.of("cancel-1", "RunCancelled")), 20, "RunCancelled")
    assert latency < 2.0, f"cancellation reached the handler after {latency:.2f}s (heartbeat interval 2s)"
    assert not events.of("cancel-1", "RunSucceeded")
    events.close()
    receipts.close()


def test_cancelling_a_parent_cancels_its_running_child(settings: ProcessorSettings) -> None:
    import actions_for_tests  # noqa: F401

    events, commands = _events(settings), Commands(settings)
    with (
        running(settings),
        WorkerThread(Worker(name="e2e", queues=["default"]), settings),
        ChildExecutorThread(settings) as child,
    ):
        commands.start("parent-1", "e2e-parent", {})
        commands.flush()
        events.wait_for(lambda r: bool(events.of("parent-1/child", "StepStarted")), 60, "child step started")
        commands.cancel("parent-1", "stop everything")
        commands.flush()
        events.wait_for(
            lambda r: bool(
                events.of("parent-1", "RunCancelled") and events.of("parent-1/child", "RunCancelled")
            ),
            30,
            "parent and child cancelled",
        )
    assert events.of("parent-1/child", "StepCancelled") or events.of("parent-1/child", "StepFailed")
    assert child.counts["cancelled"] == 1 and not events.of("parent-1/child", "RunSucceeded")
    events.close()
