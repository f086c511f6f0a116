"""Where each run's latest snapshot is in `<p>.run-state`, kept up to date incrementally.

A client that calls `get`/`wait` many times must not re-read a whole compacted
partition per call. The index keeps, per partition, the read position and for
each run id the offset and timestamp of its latest snapshot record (a few dozen
bytes per run, not the snapshot). A lookup reads only the records appended since
the previous lookup, then fetches the one record it needs by offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Message

from processors.client.reader import PartitionReader
from processors.kafka.records import coordinates


@dataclass
class _Partition:
    position: int = OFFSET_BEGINNING
    latest: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # key -> (offset, timestamp ms)


class SnapshotIndex:
    def __init__(self, reader: PartitionReader, topic: str, timeout_s: float) -> None:
        self._reader = reader
        self._topic = topic
        self._timeout_s = timeout_s
        self._partitions: dict[int, _Partition] = {}

    def catch_up(self, partition: int) -> _Partition:
        part = self._partitions.setdefault(partition, _Partition())
        deadline = time.monotonic() + self._timeout_s * 4
        for msg in self._reader.read({(self._topic, partition): part.position}, deadline=deadline):
            if msg is None:
                continue
            _, _, offset = coordinates(msg)
            key = msg.key()
            if key is not None:
                if msg.value() is None:  # a tombstone deletes the run's snapshot
                    part.latest.pop(key, None)
                else:
                    part.latest[key] = (offset, msg.timestamp()[1])
            part.position = offset + 1
        return part

    def latest(self, run_id: str, partition: int) -> Message | None:
        """The run's latest committed snapshot record, or None."""
        key = run_id.encode()
        where = self.catch_up(partition).latest.get(key)
        if where is None:
            return None
        deadline = time.monotonic() + self._timeout_s
        for msg in self._reader.read({(self._topic, partition): where[0]}, deadline=deadline):
            if msg is not None and coordinates(msg)[2] >= where[0]:
                if msg.key() == key and msg.value() is not None:
                    return msg
                break  # compacted away meanwhile: fall back to a fresh scan
        self._partitions.pop(partition, None)
        fresh = self.catch_up(partition).latest.get(key)
        if fresh is None:
            return None
        for msg in self._reader.read({(self._topic, partition): fresh[0]}, deadline=deadline):
            if msg is not None and coordinates(msg)[2] >= fresh[0]:
                return msg if msg.key() == key and msg.value() is not None else None
        return None
