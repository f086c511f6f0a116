"""Which partition a run id lives in: Kafka's Java default partitioner (murmur2).

The partition that owns a run is `(murmur2(utf8(run_id)) & 0x7fffffff) % partitions`, the
Java client's default for a keyed record. Every runfold producer sets
`partitioner=murmur2_random` (librdkafka's name for it), but other clients differ by
default: every librdkafka-based client (Go, .NET, Python, Rust, @confluentinc/kafka-javascript)
uses CRC32 (`consistent_random`), sarama FNV-1a, kafka-go round-robin. So the processor
does not trust the partition a command or receipt arrived on: `PartitionOwners` answers
"which partition owns this key?" on the input path (processors/runtime/admission.py), and a
record that landed elsewhere is forwarded to its owner (docs/contract.md, "Partitioning").
Queries and the client use `partition_for` to find a run's events and snapshots.
"""

from __future__ import annotations

import struct

PARTITIONER = "murmur2_random"

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_WORDS = [struct.Struct(f"<{n}I") for n in range(64)]  # unpackers for keys up to 252 bytes


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    n = end >> 2
    words = _WORDS[n].unpack_from(data) if n < 64 else struct.unpack_from(f"<{n}I", data)
    for k in words:
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    extra = length & 3
    if extra == 3:
        h ^= data[end + 2] << 16
    if extra >= 2:
        h ^= data[end + 1] << 8
    if extra >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for a non-null key."""
    data = key.encode() if isinstance(key, str) else key
    return (murmur2(data) & 0x7FFFFFFF) % partitions


class PartitionOwners:
    """`partition_for` over a fixed partition count, memoised: a run's receipts outnumber its
    commands, and a dict hit (~50 ns) is a hundredth of hashing a 36-byte id (~3 us). The memo
    is dropped whole when it reaches `limit` keys, so it stays bounded without bookkeeping."""

    __slots__ = ("_memo", "limit", "partitions")

    def __init__(self, partitions: int, limit: int = 100_000) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, not {partitions}")
        self.partitions = partitions
        self.limit = limit
        self._memo: dict[bytes, int] = {}

    def __call__(self, key: bytes) -> int:
        p = self._memo.get(key)
        if p is None:
            if len(self._memo) >= self.limit:
                self._memo.clear()
            p = self._memo[key] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return p
