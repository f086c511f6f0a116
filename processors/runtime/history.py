"""A run's events that a store restored from run-state does not hold, read from run-events.

A store seeded from `<p>.run-state` snapshots (assignment.py) holds each run's state, not the
events before the run-events offset E0 it folded from (`PartitionStore.events_from`): keeping
them would mean reading the whole log, what the seeding avoids. `GET /runs/<id>/events` reads
those from the topic on demand: from the first record whose timestamp can be the run's
`RunAccepted` (its `accepted_ms`, less the most a ts_ms may lead its record's timestamp and a
minute of clock skew) up to E0, this run's records only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processors.kafka import watermarks
from processors.runtime.admission import TS_FUTURE_MS

_SKEW_MS = 60_000
_READ_S = 30.0  # at most this long per request


def run_events_before(
    consumer_config: dict[str, Any],
    topic: str,
    partition: int,
    run_id: str,
    since: int,
    until_offset: int,
    accepted_ms: int,
    limit: int,
    decode: Callable[[bytes], dict[str, Any]],
) -> list[tuple[int, bytes]]:
    """(sequence, bytes) of `run_id`'s events with sequence > since at offsets below
    `until_offset`, in order, at most `limit`."""
    import time

    consumer = Consumer(consumer_config)
    key = run_id.encode()
    out: list[tuple[int, bytes]] = []
    try:
        probe = TopicPartition(topic, partition, max(accepted_ms - TS_FUTURE_MS - _SKEW_MS, 0))
        # the admin client's ListOffsets, not the consumer's offsets_for_times: that one aborts
        # the process while brokers fail over (processors/kafka/watermarks.py)
        start = watermarks.Offsets.like(consumer_config).for_time(probe, probe.offset, 10.0)
        if start < 0:  # no record that late: every record is older, read them all
            start = OFFSET_BEGINNING
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + _READ_S
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return out
                    continue
                offset = msg.offset()
                if offset is not None and offset >= until_offset:
                    return out
                value = msg.value()
                if msg.key() != key or value is None:
                    continue
                sequence = int(decode(value)["sequence"])
                if sequence > since:
                    out.append((sequence, value))
                    if len(out) >= limit:
                        return out
        return out
    finally:
        consumer.close()
