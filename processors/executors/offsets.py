"""Per-partition low-watermark tracking for out-of-order completion.

Records of a partition arrive in offset order but finish in any order (handlers run
concurrently). The committable offset of a partition is one past the highest offset such
that it and every earlier tracked offset are done: committing it never skips a record
whose receipt is not yet acknowledged by the broker.
"""

from __future__ import annotations

from collections import deque

TopicPartition = tuple[str, int]


class PartitionWatermark:
    __slots__ = ("_done", "_pending", "committable")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # offsets in arrival (= offset) order
        self._done: set[int] = set()
        self.committable: int | None = None  # next offset to commit (last contiguous done + 1)

    def add(self, offset: int) -> None:
        if self._pending and offset <= self._pending[-1]:
            raise ValueError(f"offset {offset} arrived after {self._pending[-1]}; offsets must increase")
        self._pending.append(offset)

    def done(self, offset: int) -> bool:
        """Mark `offset` done; True when the committable offset moved."""
        self._done.add(offset)
        moved = False
        pending, done = self._pending, self._done
        while pending and pending[0] in done:
            first = pending.popleft()
            done.discard(first)
            self.committable = first + 1
            moved = True
        return moved

    @property
    def in_flight(self) -> int:
        return len(self._pending)


class OffsetTracker:
    """All partitions of one consumer; `take_commits()` returns what moved since the last call."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, PartitionWatermark] = {}
        self._dirty: set[TopicPartition] = set()

    def add(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = PartitionWatermark()
        part.add(offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is not None and part.done(offset):
            self._dirty.add(tp)

    def take_commits(self, only: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Committable offsets that moved since they were last taken (of `only`, when given)."""
        chosen = self._dirty if only is None else self._dirty & set(only)
        out: dict[TopicPartition, int] = {}
        for tp in chosen:
            part = self._parts.get(tp)
            if part is not None and part.committable is not None:
                out[tp] = part.committable
        self._dirty -= set(chosen)
        return out

    def forget(self, tps: list[TopicPartition]) -> None:
        """Drop revoked partitions: their uncommitted records go to the next owner."""
        for tp in tps:
            self._parts.pop(tp, None)
            self._dirty.discard(tp)

    def partitions(self) -> list[TopicPartition]:
        return list(self._parts)

    def in_flight(self) -> int:
        return sum(p.in_flight for p in self._parts.values())
