"""RunEventConsumer against a real broker: committed events only, in order per run, offsets
committed after handling (at-least-once: an unacknowledged event is delivered again)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from processors.downstream import RunEventConsumer
from schemas import Codec
from topology.admin import create_topology
from topology.catalog import topic_names
from topology.settings import KafkaSettings, producer_config, transactional_producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _ev(kind: str, run_id: str, seq: int, **body: object) -> dict:
    return {
        "type": kind,
        "run_id": run_id,
        "sequence": seq,
        "ts_ms": 1_700_000_000_000 + seq,
        "record_id": f"{run_id}#{seq}",
        **body,
    }


def _run(run_id: str) -> list[dict]:
    return [
        _ev("RunStarted", run_id, 1, superstep=1),
        _ev("RunStarted", run_id, 2, superstep=2),
        _ev(
            "RunCancelled",
            run_id,
            3,
            reason="x",
            usage={"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0},
        ),
    ]


def _drain(consumer: RunEventConsumer, want: int, max_polls: int = 200) -> list[dict]:
    out: list[dict] = []
    for _ in range(max_polls):
        ev = consumer.poll(0.5)
        if ev is not None:
            out.append(ev)
        if len(out) >= want:
            break
    return out


def test_committed_only_in_order_and_at_least_once(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    codec = Codec.default()
    topic = topic_names(kafka_settings).run_events
    producer = Producer(producer_config(kafka_settings))
    for i in range(4):
        for ev in _run(f"r{i}"):
            producer.produce(topic, codec.encode("run_events", ev), ev["run_id"].encode())
    producer.produce(topic, b"not avro", b"junk")  # skipped, never fatal
    assert producer.flush(10) == 0
    txn = Producer(transactional_producer_config(kafka_settings, f"{kafka_settings.topic_prefix}-abort"))
    txn.init_transactions(15)
    txn.begin_transaction()
    for ev in _run("aborted"):
        txn.produce(topic, codec.encode("run_events", ev), b"aborted")
    txn.flush(10)
    txn.abort_transaction(15)

    group = f"{kafka_settings.topic_prefix}-billing"
    with RunEventConsumer(group, kafka_settings) as consumer:
        seen = _drain(consumer, 12)
        assert len(seen) == 12
        assert "aborted" not in {e["run_id"] for e in seen}
        for i in range(4):
            assert [e["sequence"] for e in seen if e["run_id"] == f"r{i}"] == [1, 2, 3]
        assert _drain(consumer, 1, max_polls=4) == []  # (this poll acknowledged the last event)
        # the junk record sits on its own partition, read in no fixed order relative to the others
        for _ in range(20):
            if consumer.skipped:
                break
            assert consumer.poll(0.5) is None
        assert consumer.skipped == 1
    # a new event, handled but not acknowledged when its consumer closes (a crash mid-handling) ...
    late = _ev("RunStarted", "late", 1, superstep=1)
    producer.produce(topic, codec.encode("run_events", late), b"late")
    assert producer.flush(10) == 0
    with RunEventConsumer(group, kafka_settings) as consumer:
        assert [e["run_id"] for e in _drain(consumer, 1, max_polls=40)] == ["late"]
    # ... is delivered again to the group (at-least-once), and only it
    with RunEventConsumer(group, kafka_settings) as consumer:
        assert [e["record_id"] for e in _drain(consumer, 2, max_polls=12)] == ["late#1"]
        consumer.ack()
    with RunEventConsumer(group, kafka_settings) as consumer:
        assert _drain(consumer, 1, max_polls=10) == []
    # the `run` loop acknowledges as it goes and filters by type
    terminal: list[str] = []
    with RunEventConsumer(f"{group}-2", kafka_settings, types={"RunCancelled"}) as consumer:
        consumer.run(lambda ev: terminal.append(ev["run_id"]), max_events=4)
    assert sorted(terminal) == ["r0", "r1", "r2", "r3"]
