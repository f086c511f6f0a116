"""A confluent-kafka transactional round trip on the real broker, with runfold's client configs."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
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


def test_offsets_sent_under_a_stale_generation_are_refused(kafka_settings: KafkaSettings) -> None:
    """The processor keeps its consumer's group metadata per generation (GroupMetadata) and
    forgets it at rebalances; this is the broker-side check that makes a stale one harmless:
    offsets sent with the metadata of a generation the group has left are refused, and the
    same call with the current metadata commits."""
    create_topology(kafka_settings)
    topic = TopicNames(kafka_settings.topic_prefix).commands
    group = f"{kafka_settings.topic_prefix}-stale"
    cfg = {**consumer_config(kafka_settings, group), "session.timeout.ms": 10_000}

    def assigned(c: Consumer) -> int:
        return len(c.assignment())

    first = Consumer(cfg)
    first.subscribe([topic])
    deadline = time.monotonic() + 30
    while assigned(first) == 0 and time.monotonic() < deadline:
        first.poll(0.2)
    assert assigned(first) > 0, "the first member never got partitions"
    stale = first.consumer_group_metadata()
    whole = assigned(first)

    second = Consumer(cfg)  # joins: the group moves to a new generation
    second.subscribe([topic])
    deadline = time.monotonic() + 40
    while (assigned(first) == whole or assigned(second) == 0) and time.monotonic() < deadline:
        first.poll(0.2)
        second.poll(0.2)
    assert 0 < assigned(first) < whole and assigned(second) > 0, "no rebalance happened"
    tp = first.assignment()[0]

    producer = Producer(transactional_producer_config(kafka_settings, f"tx-stale-{uuid.uuid4().hex[:6]}"))
    producer.init_transactions(30)
    producer.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        producer.send_offsets_to_transaction([TopicPartition(tp.topic, tp.partition, 1)], stale, 30)
        producer.commit_transaction(30)
    assert refused.value.args[0].code() in (
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
    ), refused.value
    assert not refused.value.args[0].fatal(), refused.value  # the producer lives on: abort, retry
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition(tp.topic, tp.partition, 1)], first.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)
    committed = first.committed([TopicPartition(tp.topic, tp.partition)], 10)
    assert committed[0].offset == 1
    first.close()
    second.close()
