"""The open transaction's bookkeeping (one at a time per processor), and the two ways the
loop's produce() refuses a record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from processors.runtime.fold import TxnCounters
from processors.runtime.overlay import PartitionOverlay


class RecordTooLarge(Exception):
    """produce() refused a record over the client's `message.max.bytes`."""


class ProduceFailed(Exception):
    """produce() failed otherwise (e.g. `_STATE`: an earlier delivery already failed the
    transaction); the transaction must abort."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.err = err


@dataclass
class Txn:
    open: bool = False
    deadline: float = 0.0
    records: int = 0
    overlays: dict[int, PartitionOverlay] = field(default_factory=dict)
    start: dict[tuple[str, int], int] = field(default_factory=dict)  # first offset per input partition
    next: dict[tuple[str, int], int] = field(default_factory=dict)  # offset to commit per input partition
    event_offsets: dict[int, int] = field(default_factory=dict)  # max run-events offset per partition
    counters: TxnCounters = field(default_factory=TxnCounters)

    def reset(self) -> None:
        self.open = False
        self.records = 0
        self.overlays.clear()
        self.start.clear()
        self.next.clear()
        self.event_offsets.clear()
        self.counters.clear()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
