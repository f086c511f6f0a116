"""Executor metrics scraped over HTTP while a worker / the child-run executor work on the real broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import actions_for_tests  # noqa: F401  (registers test.* actions on the module-level registry)
import httpx
import pytest
from confluent_kafka import Producer
from executor_support import TERMINAL, ReceiptReader, WorkerThread, activation, produce
from processor_support import Commands, Reader, make_settings, running, setup_topology
from prometheus_client.parser import text_string_to_metric_families

from processors.executors import Worker
from processors.executors.child_executor import ChildExecutor
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
WF = "runfold.workflow/v1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scrape_until(
    port: Callable[[], int | None], done: Callable[[Samples], bool], timeout_s: float = 20
) -> Samples:
    """Counters are applied once per loop tick / committed transaction: poll until they settle."""
    end = time.monotonic() + timeout_s
    samples: Samples = {}
    while time.monotonic() < end:
        bound = port()
        if bound is not None:
            samples = scrape(bound)
            if done(samples):
                break
        time.sleep(0.1)
    return samples


def test_worker_metrics_over_http(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    acts = [activation(f"ok{i}", "test.identity", {"i": i}) for i in range(3)]
    acts += [activation("rejected", "test.reject"), activation("unknown", "no.such.action")]
    produce(kafka_settings, topic, "activations", acts)
    raw = Producer(producer_config(kafka_settings))
    raw.produce(topic, b"\x00not an activation", key=b"junk")
    assert raw.flush(15) == 0
    reader = ReceiptReader(kafka_settings)
    worker = Worker(
        name="metrics", queues=["default"], concurrency=4, metrics_port=0, metrics_host="127.0.0.1"
    )
    with WorkerThread(worker, kafka_settings) as wt:
        reader.poll_until(lambda r: sum(x["type"] in TERMINAL for x in r) >= len(acts))
        m = scrape_until(
            lambda: wt.runner.metrics_port,
            lambda s: (
                value(
                    s,
                    "runfold_worker_outcomes_total",
                    action="(unknown)",
                    outcome="failed",
                    code="UnknownReference",
                )
                == 1
                and (value(s, "runfold_worker_offsets_committed_total") or 0) >= 1
                # the broker's answer comes back on a later poll (commit callback)
                and (value(s, "runfold_worker_offset_commits_total", outcome="committed") or 0) >= 1
            ),
        )
        assert wt.stop() == 0
    reader.close()
    assert len(reader.terminal()) == len(acts)

    def activations(action: str) -> float | None:
        return value(m, "runfold_worker_activations_total", queue="default", action=action)

    assert (activations("test.identity"), activations("test.reject"), activations("(unknown)")) == (3, 1, 1)
    outcomes = {
        (dict(labels)["action"], dict(labels)["outcome"], dict(labels)["code"]): v
        for (name, labels), v in m.items()
        if name == "runfold_worker_outcomes_total"
    }
    assert outcomes == {
        ("test.identity", "completed", ""): 3,
        ("test.reject", "failed", "InvalidInput"): 1,
        ("(unknown)", "failed", "UnknownReference"): 1,
    }
    assert value(m, "runfold_worker_handler_seconds_count", action="test.identity") == 3
    assert value(m, "runfold_worker_handler_seconds_count", action="test.reject") == 1
    assert value(m, "runfold_worker_handler_seconds_count", action="(unknown)") is None  # never ran
    assert value(m, "runfold_worker_receipts_total", type="ActivationAccepted") == 4
    assert value(m, "runfold_worker_receipts_total", type="ActivationCompleted") == 3
    assert value(m, "runfold_worker_receipts_total", type="ActivationFailed") == 2
    assert value(m, "runfold_worker_dead_letters_total") == 1
    assert value(m, "runfold_worker_receipt_errors_total", outcome="lost") is None
    assert value(m, "runfold_worker_consumer_replacements_total") == 0
    assert (value(m, "runfold_worker_offset_commits_total", outcome="requested") or 0) >= 1
    assert (value(m, "runfold_worker_offset_commits_total", outcome="committed") or 0) >= 1
    assert value(m, "runfold_worker_offset_commits_total", outcome="rejected") is None
    assert value(m, "runfold_worker_in_flight") == 0
    assert (value(m, "process_resident_memory_bytes") or 0) > 0


def _parent(wid: str, child: str) -> dict[str, Any]:
    return {
        "schema": WF,
        "id": wid,
        "revision": 1,
        "state": {"out": None},
        "entry": ["child"],
        "nodes": {
            "child": {
                "kind": "workflow",
                "workflow": child,
                "revision": 1,
                "writes": {"out": {"from": "output"}},
            }
        },
    }


def _one(wid: str, action: str) -> dict[str, Any]:
    return {
        "schema": WF,
        "id": wid,
        "revision": 1,
        "state": {"out": None},
        "entry": ["a"],
        "nodes": {"a": {"kind": "action", "action": action, "writes": {"out": {"from": "output"}}}},
    }


def _late_parent() -> dict[str, Any]:
    """A parent whose child step times out after 1 s, with no retry."""
    parent = _parent("m-parent-late", "m-ok")
    parent["nodes"]["child"]["timeout_ms"] = 1000
    return parent


DEFINITIONS = [
    _one("m-ok", "test.identity"),
    _one("m-reject", "test.reject"),
    _parent("m-parent-ok", "m-ok"),
    _parent("m-parent-reject", "m-reject"),
    _late_parent(),
]


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, DEFINITIONS)
    yield s
    from topology.admin import delete_topology

    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {topic_prefix} failed: {e}")


def test_child_executor_metrics_over_http(settings: ProcessorSettings) -> None:
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    child = ChildExecutor(settings, metrics_port=0, metrics_host="127.0.0.1")
    thread = threading.Thread(target=lambda: child.run(install_signals=False), daemon=True)
    with running(settings), WorkerThread(Worker(name="m", queues=["default"]), settings):
        thread.start()
        try:
            commands.raw(settings.topics.child_activations, b"p", b"\x00not a child activation")
            commands.start("p-ok", "m-parent-ok", {})
            commands.start("p-reject", "m-parent-reject", {})
            commands.flush()
            events.wait_for(
                lambda r: all(
                    events.of(run, "RunSucceeded") or events.of(run, "RunFailed")
                    for run in ("p-ok", "p-reject")
                ),
                90,
                "both parents finished",
            )
            m = scrape_until(
                lambda: child.metrics_port,
                lambda s: (
                    value(s, "runfold_child_executor_receipts_total", status="failed") == 1
                    and value(s, "runfold_child_executor_dead_letters_total") == 1
                ),
            )
        finally:
            child.request_stop()
            thread.join(20)
    events.close()
    assert events.of("p-ok", "RunSucceeded") and events.of("p-reject", "RunFailed")
    assert value(m, "runfold_child_executor_activations_total") == 2
    assert value(m, "runfold_child_executor_cancels_total") == 0
    assert value(m, "runfold_child_executor_commands_total", type="StartRun") == 2
    assert value(m, "runfold_child_executor_commands_total", type="CancelRun") is None
    assert value(m, "runfold_child_executor_receipts_total", status="succeeded") == 1
    assert value(m, "runfold_child_executor_receipts_total", status="failed") == 1
    assert value(m, "runfold_child_executor_dead_letters_total") == 1
    assert (value(m, "runfold_child_executor_transactions_total", outcome="committed") or 0) >= 2
    assert value(m, "runfold_child_executor_children_tracked") == 0


def test_child_executor_starts_no_child_whose_deadline_passed(settings: ProcessorSettings) -> None:
    """The child executor was down until the parent's child step timed out: when it comes up,
    the queued activation is past its deadline and no child run starts; the parent failed on
    its own node timeout once the cancel that timeout sent found no child (until then its step
    is stopping: the child executor answers a cancel of no child as its stop)."""
    from processors.engine.ids import child_run_id

    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    child_id = child_run_id("p-late", "child", "", 1)
    with running(settings):
        commands.start("p-late", "m-parent-late", {})
        commands.flush()
        events.wait_for(
            lambda r: bool(events.of("p-late", "StepStopping")), 60, "the parent's step timed out"
        )
        assert not events.of("p-late", "RunFailed")  # its child's stop is not proved yet
        child = ChildExecutor(settings, metrics_port=0, metrics_host="127.0.0.1")
        thread = threading.Thread(target=lambda: child.run(install_signals=False), daemon=True)
        thread.start()
        try:
            m = scrape_until(
                lambda: child.metrics_port,
                lambda s: (
                    value(s, "runfold_child_executor_expired_total") == 1
                    and value(s, "runfold_child_executor_cancels_total") == 1
                ),
            )
            # The child's commands share its partition, so a StartRun would be folded before
            # the CancelRun, whose rejection (no such run) is the last word on the child.
            events.wait_for(lambda r: bool(events.of(child_id, "RunRejected")), 30, "the cancel of no child")
            events.wait_for(lambda r: bool(events.of("p-late", "RunFailed")), 30, "the parent failed")
        finally:
            child.request_stop()
            thread.join(20)
    events.close()
    assert events.of("p-late", "RunFailed")[0]["failure"]["code"] == "Timeout"
    assert events.of("p-late", "StepFailed")[0]["stop"] == "confirmed"
    assert [e["type"] for e in events.of(child_id)] == ["RunRejected"]
    assert events.of(child_id, "RunRejected")[0]["code"] == "NotFound"
    assert value(m, "runfold_child_executor_activations_total") == 0
    assert value(m, "runfold_child_executor_commands_total", type="StartRun") is None
