"""Produce one Avro StartRun to <prefix>.commands and read it back, decoded, with a read_committed consumer."""

from __future__ import annotations

import time
import uuid

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from schemas import Codec
from topology.catalog import TopicNames
from topology.settings import consumer_config, load_settings, producer_config


def main() -> None:
    settings = load_settings()
    topic = TopicNames(settings.topic_prefix).commands
    codec = Codec.default()
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    msg = {
        "type": "StartRun",
        "run_id": run_id,
        "record_id": uuid.uuid4().hex,
        "ts_ms": int(time.time() * 1000),
        "definition_id": "research-brief",
        "input": {"topic": "kafka"},
        "labels": {"source": "demo"},
    }
    value = codec.encode("commands", msg)

    delivered: list[tuple[int, int]] = []

    def on_delivery(err: object, m: object) -> None:
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        delivered.append((m.partition(), m.offset()))  # type: ignore[attr-defined]

    producer = Producer(producer_config(settings))
    producer.produce(topic, key=run_id.encode(), value=value, on_delivery=on_delivery)
    producer.flush(30)
    partition, offset = delivered[0]
    print(
        f"produced {msg['type']} run_id={run_id} ({len(value)} Avro bytes) -> {topic}[{partition}]@{offset}"
    )

    consumer = Consumer(consumer_config(settings, f"demo-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        record = None
        for _ in range(40):
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                break
        if record is None or record.error() is not None:
            raise SystemExit(f"could not read the record back from {topic}[{partition}]@{offset}")
        decoded = codec.decode("commands", record.value())
    finally:
        consumer.close()
    print(f"read back key={record.key().decode()}:")
    print(orjson.dumps(decoded, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    assert decoded["run_id"] == run_id and decoded["input"] == msg["input"], "round trip changed the message"


if __name__ == "__main__":
    main()
