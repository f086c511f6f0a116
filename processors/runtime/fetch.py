"""Two librdkafka timers a client need not wait for: resuming a paused partition
(`resume_now`), and a new producer's first producer id (`connect_first`).

`Consumer.resume()` is served by the main thread, but the partition's fetches are sent by
its leader's broker thread, which only looks at it again when something wakes it: with
nothing else to do, up to ~1 s later (the same in confluent-kafka-go#630's log). Every
partition the processor restores is paused until it is ready, and the worker pauses under
backpressure, so each resume cost that much latency. A request to the leader (ListOffsets,
answered in ~1 ms) wakes its thread at once: a record produced 50 ms after the resume arrives
2-6 ms later instead of 0.2-0.8 s (`benchmarks/resume_bench.py`).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException, TopicPartition

_WAKE_TIMEOUT_S = 0.5


def resume_now(consumer: Any, partitions: list[TopicPartition]) -> None:
    """`consumer.resume(partitions)`, then wake each one's fetcher. A leader that does not
    answer (a broker down) ends the wake-ups: the fetchers then start at their own pace."""
    consumer.resume(partitions)
    for tp in partitions:
        try:
            consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=_WAKE_TIMEOUT_S,
                                           cached=False)
        except KafkaException:
            return


def connect_first(producer: Any) -> None:
    """Connect a new producer before its first use. A transactional producer's
    init_transactions called at once finds no broker up yet ("No brokers available for
    Transactions") and retries 500 ms later: about every other one took 507 ms instead of ~55
    (507, 507, 506 ms of 9 calls; with a metadata request first, 64-76 ms in 9 of 9). An
    idempotent producer's first record waits for its producer id the same way (the client's
    first command: 504 ms in 1 of 4, with the request first 1-2 ms in 6 of 6). Best effort: a
    cluster that does not answer is the first real call's to report."""
    try:
        producer.list_topics(timeout=1.0)
    except KafkaException:
        return
