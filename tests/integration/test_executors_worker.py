"""The action worker against the real broker: activations produced here, receipts read back."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import actions_for_tests  # noqa: F401  (registers test.* actions on the module-level registry)
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from executor_support import (
    TERMINAL,
    ReceiptReader,
    WorkerThread,
    activation,
    cancel_notice,
    committed_offsets,
    produce,
    spawn_worker,
)

from processors.executors import Worker
from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, consumer_config, producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
HERE = Path(__file__).resolve().parent


def _types(records: list[dict], dispatch: str) -> list[str]:
    return [r["type"] for r in records if r["dispatch_id"] == dispatch]


def _end_offsets(settings: KafkaSettings, topic: str) -> dict[int, int]:
    """End offsets of the partitions that hold records (-1001 = nothing committed, for empty ones)."""
    consumer = Consumer(consumer_config(settings, f"probe-{uuid.uuid4().hex[:6]}"))
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(settings.partitions)
        }
        return {p: (end if end > 0 else -1001) for p, end in ends.items()}
    finally:
        consumer.close()


def test_outcomes_receipts_and_committed_offsets(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    names = TopicNames(kafka_settings.topic_prefix)
    topic = names.activations("default")
    acts = [activation(f"r{i}", "test.identity", {"i": i}) for i in range(30)]
    acts += [
        activation("r-unknown", "no.such.action"),
        activation("r-reject", "test.reject"),
        activation("r-boom", "test.boom"),
        activation("r-sync", "test.slow", {"ms": 50}),
        activation(
            "r-agent",
            "",
            None,
            kind="agent",
            agent={
                "agent": "planner",
                "model": "small",
                "prompt": "plan kafka research",
                "output_schema": {
                    "type": "object",
                    "required": ["steps"],
                    "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
                },
                "structured_output_attempts": 2,
            },
        ),
    ]
    produce(kafka_settings, topic, "activations", acts)
    reader = ReceiptReader(kafka_settings)
    worker = Worker(name="it", queues=["default"], concurrency=8)
    with WorkerThread(worker, kafka_settings) as wt:
        records = reader.poll_until(lambda r: sum(x["type"] in TERMINAL for x in r) >= len(acts))
        assert wt.stop() == 0
    terminal = reader.terminal()
    assert len(terminal) == len(acts)
    for act in acts[:30]:
        rec = terminal[act["dispatch_id"]]
        assert rec["type"] == "ActivationCompleted" and rec["run_id"] == act["run_id"]
        assert rec["output"]["key"] == act["dispatch_id"] and rec["output"]["input"] == act["input"]
        assert rec["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "cost_micros": 3}
        assert _types(records, act["dispatch_id"]) == ["ActivationAccepted", "ActivationCompleted"]
    by_run = {r["run_id"]: r for r in terminal.values()}
    assert (by_run["r-unknown"]["code"], by_run["r-unknown"]["retryable"]) == ("UnknownReference", False)
    assert (by_run["r-reject"]["code"], by_run["r-reject"]["retryable"]) == ("InvalidInput", False)
    assert (by_run["r-boom"]["code"], by_run["r-boom"]["retryable"]) == ("ExecutionFailed", True)
    assert "ValueError" in by_run["r-boom"]["message"]
    assert by_run["r-sync"]["output"]["slept"] == 50
    agent = by_run["r-agent"]
    assert agent["type"] == "ActivationCompleted" and isinstance(agent["output"]["steps"], list)
    assert agent["usage"]["prompt_tokens"] > 0 and agent["usage"]["cost_micros"] > 0
    # every activation's offset is committed once its receipt was acknowledged
    assert committed_offsets(
        kafka_settings, worker.settings.group_id(kafka_settings.topic_prefix), topic
    ) == _end_offsets(kafka_settings, topic)
    reader.close()


def test_cancel_reaches_a_running_handler_within_one_heartbeat(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    running = activation("r-long", "test.slow", {"ms": 60_000}, heartbeat_ms=1000)
    blocked = activation("r-queued", "test.slow", {"ms": 60_000})
    reader = ReceiptReader(kafka_settings)
    producer = Producer(
        producer_config(kafka_settings)
    )  # warm (producer id, connection) before the clock runs
    with WorkerThread(Worker(name="it", queues=["default"], concurrency=1), kafka_settings) as wt:
        produce(kafka_settings, topic, "activations", [running, blocked], producer)
        reader.poll_until(lambda r: "ActivationHeartbeat" in _types(r, running["dispatch_id"]), 20)
        assert "ActivationAccepted" not in _types(
            reader.records, blocked["dispatch_id"]
        )  # waits for the slot
        sent = time.monotonic()
        produce(
            kafka_settings, topic, "activations", [cancel_notice(blocked), cancel_notice(running)], producer
        )
        reader.poll_until(
            lambda r: "ActivationCancelled" in _types(r, running["dispatch_id"]), 10, step_s=0.02
        )
        latency = time.monotonic() - sent
        reader.poll_until(lambda r: "ActivationCancelled" in _types(r, blocked["dispatch_id"]), 10)
        assert wt.stop() == 0
    assert latency < 1.0, f"cancellation took {latency:.2f}s, more than one heartbeat interval"
    assert _types(reader.records, blocked["dispatch_id"]) == ["ActivationCancelled"]  # never ran
    assert reader.terminal()[blocked["dispatch_id"]]["reason"].startswith("before start")
    reader.close()


def test_deadline_fails_with_retryable_timeout(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    act = activation("r-deadline", "sleep", {"ms": 30_000}, deadline_ms=int(time.time() * 1000) + 800)
    late = activation("r-late", "echo", {}, deadline_ms=int(time.time() * 1000) - 1)
    reader = ReceiptReader(kafka_settings)
    with WorkerThread(Worker(name="it", queues=["default"]), kafka_settings) as wt:
        produce(kafka_settings, topic, "activations", [act, late])
        reader.poll_until(lambda r: len(reader.terminal()) >= 2, 20)
        assert wt.stop() == 0
    for dispatch in (act["dispatch_id"], late["dispatch_id"]):
        rec = reader.terminal()[dispatch]
        assert (rec["type"], rec["code"], rec["retryable"]) == ("ActivationFailed", "Timeout", True)
    reader.close()


def test_kill_9_mid_action_redelivers_to_the_next_worker(kafka_settings: KafkaSettings) -> None:
    """Without the processor: the uncommitted activation is redelivered to the group's next member."""
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    act = activation("r-kill", "test.slow", {"ms": 3000})
    reader = ReceiptReader(kafka_settings)
    first = spawn_worker(kafka_settings, "first")
    try:
        produce(kafka_settings, topic, "activations", [act])
        reader.poll_until(lambda r: "ActivationAccepted" in _types(r, act["dispatch_id"]), 40)
        assert _types(reader.records, act["dispatch_id"]) == ["ActivationAccepted"]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = spawn_worker(kafka_settings, "second")
        try:
            reader.poll_until(lambda r: act["dispatch_id"] in reader.terminal(), 60)
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
    accepted = [r for r in reader.records if r["type"] == "ActivationAccepted"]
    assert len({r["worker_id"] for r in accepted}) == 2 and all(
        w.startswith(("first", "second")) for w in (r["worker_id"] for r in accepted)
    )
    done = reader.terminal()[act["dispatch_id"]]
    assert done["type"] == "ActivationCompleted" and done["worker_id"].startswith("second")
    assert done["output"]["key"] == act["dispatch_id"]  # same attempt, same idempotency key
    reader.close()


def test_sigterm_drains_in_flight_work(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    act = activation("r-drain", "test.slow", {"ms": 1500})
    reader = ReceiptReader(kafka_settings)
    proc = spawn_worker(kafka_settings, "drainer")
    try:
        produce(kafka_settings, topic, "activations", [act])
        reader.poll_until(lambda r: "ActivationAccepted" in _types(r, act["dispatch_id"]), 40)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.poll_until(lambda r: act["dispatch_id"] in reader.terminal(), 10)
    assert reader.terminal()[act["dispatch_id"]]["type"] == "ActivationCompleted"
    group = f"{kafka_settings.topic_prefix}-worker-default"
    assert committed_offsets(kafka_settings, group, topic) == _end_offsets(kafka_settings, topic)
    reader.close()
