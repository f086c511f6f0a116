"""How long a paused input partition takes to deliver again after it is resumed: librdkafka's
plain `resume()` against `processors.kafka.fetch.resume_now` (resume + a request that wakes
the leader's broker thread). The processor resumes every partition it restores, the worker
every partition it paused under backpressure.

Per round: a group consumer is assigned two partitions and pauses them (as the processor's
`on_assign` does), waits, resumes, and a record is produced `--gap` ms later; reported is the
time from that produce to the record's arrival (ms), median and max over `--rounds`.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/python benchmarks/resume_bench.py [--rounds 5] [--gap 50]

Prints one JSON object. Creates a topic per round under a `rb<hex>` prefix and deletes it.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from processors.kafka.fetch import resume_now
from topology.settings import KafkaSettings, admin_config, consumer_config, producer_config


def _round(settings: KafkaSettings, wake: bool, gap_s: float, partitions: int) -> float:
    topic = f"rb{uuid.uuid4().hex[:8]}.input"
    admin = AdminClient(admin_config(settings))
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    try:
        consumer = Consumer(consumer_config(settings, f"{topic}-group", read_committed=True))
        assigned: list[TopicPartition] = []

        def on_assign(c: Any, parts: list[TopicPartition]) -> None:
            # at a known offset, as a group with committed offsets (no offset reset to wait for)
            parts = [TopicPartition(tp.topic, tp.partition, 0) for tp in parts]
            c.assign(parts)
            c.pause(parts)
            assigned.extend(parts)

        consumer.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + 30
        while not assigned and time.monotonic() < deadline:
            consumer.poll(0.05)
        producer = Producer(producer_config(settings, linger_ms=0))
        producer.produce(topic, b"warm-up", b"k", partition=1)  # its producer id and metadata, beforehand
        producer.flush(10)
        for _ in range(20):  # paused a while, as during a restore
            consumer.poll(0.01)
        if wake:
            resume_now(consumer, assigned)
        else:
            consumer.resume(assigned)
        time.sleep(gap_s)
        sent = time.monotonic()
        producer.produce(topic, b"x", b"k", partition=0)
        producer.flush(10)
        while time.monotonic() - sent < 10:
            m = consumer.poll(0.002)
            if m is not None and m.error() is None and m.partition() == 0:
                return (time.monotonic() - sent) * 1000
        raise RuntimeError("record not received within 10 s")
    finally:
        consumer.close()
        admin.delete_topics([topic])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=50.0, help="ms between resume and the produce")
    ap.add_argument(
        "--partitions", type=int, default=2, help="partitions resumed at once (>= 2; > 2 as the worker)"
    )
    args = ap.parse_args()
    settings = KafkaSettings()
    out: dict[str, Any] = {
        "bench": "resume",
        "rounds": args.rounds,
        "gap_ms": args.gap,
        "partitions": args.partitions,
    }
    for name, wake in (("resume", False), ("resume_now", True)):
        ms = [_round(settings, wake, args.gap / 1000, max(2, args.partitions)) for _ in range(args.rounds)]
        out[name] = {
            "median_ms": round(statistics.median(ms), 1),
            "max_ms": round(max(ms), 1),
            "all_ms": [round(x, 1) for x in ms],
        }
    print(orjson.dumps(out).decode())


if __name__ == "__main__":
    main()
