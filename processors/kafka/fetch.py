"""Waits in librdkafka a client need not sit out: resuming a paused partition (`resume_now`),
a new producer's first producer id (`connect_first`), and a partial batch (`first_then_buffered`).

`Consumer.resume()` is served by the main thread, but the partition's fetches are sent by
its leader's broker thread, which only looks at it again when something wakes it: with
nothing else to do, up to ~1 s later (the same in confluent-kafka-go#630's log). Every
partition the processor restores is paused until it is ready, and the worker pauses under
backpressure, so each resume cost that much latency. A request through the broker's thread
wakes it at once (`resume_now`).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException, TopicPartition

_WAKE_TIMEOUT_S = 0.5


def resume_now(consumer: Any, partitions: list[TopicPartition]) -> None:
    """`consumer.resume(partitions)`, then wake the fetchers: a metadata request per topic, whose
    answer makes the broker thread that sent it look at its partitions again. It used to be a
    ListOffsets request to each leader (`get_watermark_offsets(..., cached=False)`), which woke
    the leader's thread for sure but aborts the process while brokers fail over
    (processors/kafka/watermarks.py); a seek to the partition's own position does not wake it
    (a fetcher already active). On one broker the metadata request goes to the leader (4-7 ms
    to deliver instead of 0.2-0.6 s, `benchmarks/resume_bench.py`); on a cluster it reaches a
    broker the client picks, and a leader not woken starts at its own pace (within ~1 s). A
    cluster that does not answer ends the wake-ups."""
    consumer.resume(partitions)
    try:
        for topic in dict.fromkeys(tp.topic for tp in partitions):
            consumer.list_topics(topic, timeout=_WAKE_TIMEOUT_S)
    except KafkaException:
        return


def first_then_buffered(consumer: Any, n: int, timeout_s: float) -> list[Any]:
    """Up to `n` records: wait up to `timeout_s` for the first, then take what is already
    buffered. `consume(n, t)` waits for n records or the whole t, holding a partial batch back
    (+t on every hop at low load; 200 ms in the client's follower and the definitions catch-up)."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(n - 1, 0)]


def connect_first(producer: Any, topic: str) -> None:
    """Connect a new producer before its first use. A transactional producer's
    init_transactions called at once finds no broker up yet ("No brokers available for
    Transactions") and retries 500 ms later: about every other one took 507 ms instead of ~55
    (507, 507, 506 ms of 9 calls; with a metadata request first, 64-76 ms in 9 of 9). An
    idempotent producer's first record waits for its producer id the same way (the client's
    first command: 504 ms in 1 of 4, with the request first 1-2 ms in 6 of 6). Best effort: a
    cluster that does not answer is the first real call's to report. `topic`: one the producer
    writes (a metadata request for every topic of a large cluster would cost more)."""
    try:
        producer.list_topics(topic, timeout=1.0)
    except KafkaException:
        return
