"""The coordinates of a consumed record. librdkafka's `Message` types its topic, partition,
offset, key and value as optional because an error event (end of partition, a broker error)
has none; a record has its coordinates, so code that holds a record asks here once instead
of re-checking for None at every use."""

from __future__ import annotations

from confluent_kafka import Message


def coordinates(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a record; ValueError for an error event."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"an error event, not a record: {msg.error()}")
    return topic, partition, offset
