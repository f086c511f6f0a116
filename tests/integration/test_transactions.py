"""A confluent-kafka transactional round trip on the real broker, with runfold's client configs."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer
from processor_support import assign_from_start

from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, consumer_config, transactional_producer_config

pytestmark = pytest.mark.integration


def _read_all(settings: KafkaSettings, topic: str, read_committed: bool, expect_at_least: int) -> list[bytes]:
    consumer = Consumer(consumer_config(settings, f"g-{uuid.uuid4().hex[:8]}", read_committed=read_committed))
    assign_from_start(consumer, [topic])
    values: list[bytes] = []
    idle = 0
    try:
        # Stop after the expected records and two idle polls, or after 40 polls at most.
        for _ in range(40):
            msgs = consumer.consume(num_messages=100, timeout=0.5)
            if not msgs:
                idle += 1
                if len(values) >= expect_at_least and idle >= 2:
                    break
                continue
            idle = 0
            for m in msgs:
                assert m.error() is None, m.error()
                values.append(m.value())
    finally:
        consumer.close()
    return values


def test_committed_is_visible_aborted_is_not(kafka_settings: KafkaSettings) -> None:
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).commands
    producer = Producer(transactional_producer_config(kafka_settings, f"tx-{kafka_settings.topic_prefix}"))
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=f"run-{i}".encode(), value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=f"run-{i}".encode(), value=f"aborted-{i}".encode())
    producer.flush(30)  # the aborted records really reach the log
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, key=b"run-0", value=b"committed-last")
    producer.commit_transaction(30)

    committed = _read_all(kafka_settings, topic, read_committed=True, expect_at_least=6)
    assert sorted(committed) == sorted([f"committed-{i}".encode() for i in range(5)] + [b"committed-last"])

    everything = _read_all(kafka_settings, topic, read_committed=False, expect_at_least=11)
    assert sorted(v for v in everything if v.startswith(b"aborted")) == [
        f"aborted-{i}".encode() for i in range(5)
    ]
