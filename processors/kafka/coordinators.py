"""Where a transaction's coordinators are, and whether they answer: the signal that a
`send_offsets_to_transaction` still waiting waits on nothing.

The call needs two coordinators: the transaction coordinator (AddOffsetsToTxn), the leader of
the `__transaction_state` partition its transactional id hashes to, and the group coordinator
(TxnOffsetCommit), the leader of the group's `__consumer_offsets` partition (Kafka's
`partitionFor`: `Utils.abs(key.hashCode()) % partitions`). While a coordinator's broker is
down, waiting is right: Kafka moves the partition once its controller fences the broker
(`broker.session.timeout.ms`, 9 s by default). Once both coordinators, by fresh metadata, are on
brokers that accept connections, a call that still does not return waits on a handle librdkafka
kept from before a move (librdkafka#5456, #5511): seen after every clean broker restart of a
rolling restart, where it cost the full timeout + 5 s (15 s) before. `StaleWait` says so after
`GRACE_S` of such health, so that the caller leaves the call and goes on with a new producer.
"""

from __future__ import annotations

import socket
import time
from typing import Any

# A healthy coordinator answers AddOffsetsToTxn / TxnOffsetCommit in milliseconds; a new one
# loads its partition first (small on runfold's clusters). Longer than that, with both answering.
GRACE_S = 2.0
# Before this the call is not looked at: nearly every call returns in milliseconds.
WATCH_AFTER_S = 1.0
_PROBE_S = 0.5


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's coordinator partition for a transactional id or group id."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def coordinator_addresses(
    client: Any, transactional_id: str, group_id: str, timeout_s: float
) -> list[str] | None:
    """host:port of the transaction and group coordinators by a fresh metadata request through
    `client`; None when unknown (no answer, no leader, an internal topic not visible)."""
    try:
        md = client.list_topics(timeout=timeout_s)
    except Exception:
        return None
    out = []
    for topic, key in (("__transaction_state", transactional_id), ("__consumer_offsets", group_id)):
        t = md.topics.get(topic)
        if t is None or not t.partitions:
            return None
        part = t.partitions.get(partition_for(key, len(t.partitions)))
        broker = md.brokers.get(part.leader) if part is not None else None
        if broker is None:
            return None
        out.append(f"{broker.host}:{broker.port}")
    return out


def accepts_connections(address: str, timeout_s: float = _PROBE_S) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class StaleWait:
    """`check(elapsed_s)` for CallThread.run: a reason to give up once the call has run
    WATCH_AFTER_S and both coordinators have looked healthy for GRACE_S; else None."""

    def __init__(
        self,
        client: Any,
        transactional_id: str,
        group_id: str,
        clock: Any = time.monotonic,
    ) -> None:
        self._client = client
        self._tid = transactional_id
        self._group = group_id
        self._clock = clock
        self._healthy_since: float | None = None
        self._where: list[str] | None = None

    def check(self, elapsed_s: float) -> str | None:
        if elapsed_s < WATCH_AFTER_S:
            return None
        where = coordinator_addresses(self._client, self._tid, self._group, _PROBE_S)
        now = self._clock()
        if where is None or not all(accepts_connections(a) for a in where):
            self._healthy_since = None  # a coordinator is down or moving: Kafka's failover to wait for
            return None
        if where != self._where or self._healthy_since is None:
            self._where, self._healthy_since = where, now
        if now - self._healthy_since >= GRACE_S:
            return (
                f"no return after {elapsed_s:.1f} s while its coordinators (transaction {where[0]}, "
                f"group {where[1]}) have answered for {now - self._healthy_since:.1f} s"
            )
        return None
