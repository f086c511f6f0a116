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
`GRACE_S` of such health, so that the caller leaves the call and goes on with a new producer;
after `MOVED_GRACE_S` when a coordinator is no longer where it was when the producer began (the
handle kept is the old one: seen after every kill -9 of a coordinator's broker).

`CoordinatorWatch` keeps a producer off such a call in the first place: after a broker
connection failed (the client's error callback), and for `SHAKEN_S` after that, it looks before
each transaction (at most every `CHECK_EVERY_S`) where the coordinators are, and says when they
moved away from where the producer found them, so that the caller replaces the producer between
two transactions (a new one's init_transactions: ~0.1-0.5 s) instead of inside one (a wait, an
abort and a replay: seconds).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

# A healthy coordinator answers AddOffsetsToTxn / TxnOffsetCommit in milliseconds; a new one
# loads its partition first (small on runfold's clusters). Longer than that, with both answering.
GRACE_S = 2.0
# Before this the call is not looked at: nearly every call returns in milliseconds.
WATCH_AFTER_S = 1.0
# A coordinator moved since the producer began: librdkafka's handle is the old one.
MOVED_GRACE_S = 0.5
_PROBE_S = 0.5
# How long after a broker connection failed the coordinators are watched: Kafka's broker session
# (9 s by default) and a controller election, a broker's restart, and its leaderships moving back
# (the preferred-leader check, leader.imbalance.check.interval.seconds, 300 s by default) are
# covered by a rolling restart's steady stream of failed connections.
SHAKEN_S = 60.0
CHECK_EVERY_S = 0.5
# Error callbacks that say a broker connection failed: its leaderships and coordinators may move.
SHAKEN_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


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
    """host:port of the transaction and group coordinators by fresh metadata requests through
    `client` (of the two internal topics only: a cluster may have thousands); None when unknown
    (no answer, no leader, an internal topic not visible)."""
    out = []
    for topic, key in (("__transaction_state", transactional_id), ("__consumer_offsets", group_id)):
        try:
            md = client.list_topics(topic, timeout=timeout_s)
        except Exception:
            return None
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


def cluster_whole(client: Any, timeout_s: float, topic: str | None = None) -> bool:
    """True when a metadata request through `client` is answered within `timeout_s` and every
    broker it names accepts connections. A cluster that answers is not enough to give up a wait:
    with two of three brokers down the survivor answers metadata, but no write reaches min ISR and
    nothing moves (the KRaft quorum is gone too, so the metadata keeps naming the lost brokers as
    alive and as leaders) until they are back; a transactional call times out there as it does
    with no broker at all. A broker the metadata names is a live one: a cluster with its
    controller quorum fences a lost broker within `broker.session.timeout.ms` and stops naming it."""
    try:
        meta = client.list_topics(topic, timeout=timeout_s)
    except (KafkaException, RuntimeError):  # RuntimeError: a client already closed
        return False
    brokers = list(meta.brokers.values())
    return bool(brokers) and all(accepts_connections(f"{b.host}:{b.port}") for b in brokers)


class StaleWait:
    """`check(elapsed_s)` for CallThread.run: a reason to give up once the call has run
    WATCH_AFTER_S and both coordinators have looked healthy for GRACE_S; else None."""

    def __init__(
        self,
        client: Any,
        transactional_id: str,
        group_id: str,
        clock: Any = time.monotonic,
        known: list[str] | None = None,
    ) -> None:
        """`known`: where the coordinators were when the producer began (CoordinatorWatch)."""
        self._client = client
        self._tid = transactional_id
        self._group = group_id
        self._clock = clock
        self._known = known
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
        moved = self._known is not None and where != self._known
        if now - self._healthy_since >= (MOVED_GRACE_S if moved else GRACE_S):
            return (
                f"no return after {elapsed_s:.1f} s while its coordinators (transaction {where[0]}, "
                f"group {where[1]}{moved_from(self._known) if moved else ''}) have answered for "
                f"{now - self._healthy_since:.1f} s"
            )
        return None


def moved_from(known: list[str] | None) -> str:
    return f"; when the producer began: {known[0]}, {known[1]}" if known else ""


class CoordinatorWatch:
    """Where one transactional producer's coordinators were when it began, and whether they
    have moved since (the module docstring). `shaken()` from the producer's error callback on a
    failed broker connection; `moved()` before each transaction."""

    def __init__(
        self, client: Any, transactional_id: str, group_id: str, clock: Any = time.monotonic
    ) -> None:
        self._client = client
        self._tid = transactional_id
        self._group = group_id
        self._clock = clock
        self.known = coordinator_addresses(client, transactional_id, group_id, 1.0)
        self.shaken_at: float | None = None  # when a broker connection last failed (within SHAKEN_S)
        self._checked_at = -CHECK_EVERY_S

    def shaken(self) -> None:
        self.shaken_at = self._clock()

    def moved(self) -> str | None:
        """A reason to replace the producer: a coordinator moved off a broker that no longer
        accepts connections, and the new ones do. None while nothing failed lately, between
        checks, while a coordinator is unknown or down (Kafka's failover to wait for), or when
        the old ones still answer."""
        now = self._clock()
        if self.shaken_at is None or now - self._checked_at < CHECK_EVERY_S:
            return None
        if now - self.shaken_at > SHAKEN_S:
            self.shaken_at = None
            return None
        self._checked_at = now
        where = coordinator_addresses(self._client, self._tid, self._group, _PROBE_S)
        if where is None or not all(accepts_connections(a) for a in where):
            return None
        if self.known is None:  # not found when it began (a cluster still starting): from now
            self.known = where
            return None
        if where == self.known:
            return None
        # From a broker that still answers, the client is told NOT_COORDINATOR and finds the new
        # one itself (the move back to a restarted node's preferred leaderships): no need.
        if all(accepts_connections(old) for old, new in zip(self.known, where, strict=True) if old != new):
            self.known = where  # the client follows such a move: the new place is the one to watch
            return None
        return (
            f"its coordinators moved off a broker that no longer answers (transaction {where[0]}, "
            f"group {where[1]}{moved_from(self.known)})"
        )
