"""Where a transaction's coordinators are (Kafka's partitionFor), and StaleWait: a
send_offsets_to_transaction is given up early only while both coordinators answer."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.kafka import coordinators
from processors.kafka.coordinators import StaleWait, java_string_hash, partition_for
from processors.kafka.watchdog import CallAbandoned, CallThread


def test_java_string_hash_matches_java() -> None:
    # "…".hashCode() as printed by Java 17 (java H.java)
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("runfold-processor-p1") == 360249341
    assert java_string_hash("ü€") == 16176
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0  # Kafka's Utils.abs(MIN_VALUE) is 0


@given(st.text(max_size=60), st.integers(1, 200))
def test_partition_for_is_in_range(key: str, partitions: int) -> None:
    assert 0 <= partition_for(key, partitions) < partitions


@dataclass
class _Broker:
    host: str
    port: int


@dataclass
class _Partition:
    leader: int


@dataclass
class _Topic:
    partitions: dict[int, _Partition]


@dataclass
class _Metadata:
    brokers: dict[int, _Broker]
    topics: dict[str, _Topic] = field(default_factory=dict)


class _Client:
    """list_topics answers that every coordinator partition is led by broker 1 at `port`."""

    def __init__(self, port: int) -> None:
        self.port = port

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        parts = {i: _Partition(1) for i in range(8)}
        return _Metadata(
            {1: _Broker("127.0.0.1", self.port)},
            {"__transaction_state": _Topic(parts), "__consumer_offsets": _Topic(parts)},
        )


def test_gives_up_only_after_the_grace_with_both_coordinators_answering() -> None:
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen(16)
        clock = [0.0]
        wait = StaleWait(_Client(live.getsockname()[1]), "t-processor-p1", "t-processor", lambda: clock[0])
        assert wait.check(0.5) is None  # too early to look
        assert wait.check(1.0) is None  # healthy from now
        clock[0] = coordinators.GRACE_S - 0.1
        assert wait.check(2.0) is None
        clock[0] = coordinators.GRACE_S
        why = wait.check(3.0)
        assert why is not None and "have answered for" in why


def test_never_gives_up_while_a_coordinator_is_down() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: connections are refused
        clock = [0.0]
        wait = StaleWait(_Client(dead), "t-processor-p1", "t-processor", lambda: clock[0])
        for t in range(1, 30):
            clock[0] = float(t)
            assert wait.check(float(t)) is None


def test_call_thread_abandons_when_give_up_says_so_and_not_before() -> None:
    release = threading.Event()
    calls = CallThread("test")
    started = time.monotonic()
    asked: list[float] = []

    def give_up(elapsed: float) -> str | None:
        asked.append(elapsed)
        return "stale" if elapsed >= 0.6 else None

    with pytest.raises(CallAbandoned, match="stale"):
        calls.run(release.wait, 30.0, give_up=give_up)
    assert 0.6 <= time.monotonic() - started < 3.0 and len(asked) >= 2
    release.set()
    assert calls.run(lambda: 7, 1.0, give_up=lambda _e: "never asked once it returned") == 7
    calls.close()


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def test_stale_wait_gives_up_sooner_when_a_coordinator_moved_since_the_producer_began() -> None:
    with _listening() as live:
        port = live.getsockname()[1]
        clock = [0.0]
        known = ["127.0.0.1:1", f"127.0.0.1:{port}"]  # the transaction coordinator was elsewhere
        wait = StaleWait(_Client(port), "t-processor-p1", "t-processor", lambda: clock[0], known=known)
        assert wait.check(1.0) is None
        clock[0] = coordinators.MOVED_GRACE_S
        why = wait.check(1.5)
        assert why is not None and "when the producer began: 127.0.0.1:1" in why
        same = StaleWait(
            _Client(port), "t-processor-p1", "t-processor", lambda: clock[0], known=[f"127.0.0.1:{port}"] * 2
        )
        clock[0] = 10.0
        assert same.check(1.0) is None
        clock[0] = 10.0 + coordinators.MOVED_GRACE_S
        assert same.check(1.5) is None  # not moved: the full grace


def test_coordinator_watch_says_moved_only_after_a_broker_was_lost_and_the_new_ones_answer() -> None:
    with _listening() as third, socket.socket() as dead:
        first, second = _listening(), _listening()
        old, mid = first.getsockname()[1], second.getsockname()[1]
        dead.bind(("127.0.0.1", 0))  # bound, never listening: refused
        client = _Client(old)
        clock = [100.0]
        watch = coordinators.CoordinatorWatch(client, "t-processor-p1", "t-processor", lambda: clock[0])
        assert watch.known == [f"127.0.0.1:{old}"] * 2
        client.port = mid
        assert watch.moved() is None  # nothing failed: not looked at (no metadata request per transaction)
        watch.shaken()
        assert watch.moved() is None  # moved, but from a broker that still answers: the client follows,
        assert watch.known == [f"127.0.0.1:{mid}"] * 2  # and the new place is the one watched from now
        clock[0] += coordinators.CHECK_EVERY_S
        second.close()  # that broker is lost
        client.port = dead.getsockname()[1]
        assert watch.moved() is None  # moved to a broker that does not answer yet: Kafka's failover
        clock[0] += coordinators.CHECK_EVERY_S / 2
        client.port = third.getsockname()[1]
        assert watch.moved() is None  # between two checks
        clock[0] += coordinators.CHECK_EVERY_S
        why = watch.moved()
        assert why is not None and "no longer answers" in why and f"127.0.0.1:{mid}" in why
        client.port = mid
        clock[0] += coordinators.CHECK_EVERY_S
        assert watch.moved() is None  # where it was: nothing to do (a broker that does not answer yet)
        client.port = third.getsockname()[1]
        clock[0] += coordinators.SHAKEN_S + 1
        assert watch.moved() is None and watch.shaken_at is None  # long after the last failure
        first.close()


def test_stale_wait_after_a_followed_move_uses_the_full_grace() -> None:
    """Review finding: a move the client followed left `known` at the old place, so every later
    send_offsets of that producer was abandoned after MOVED_GRACE_S instead of GRACE_S."""
    with _listening() as a, _listening() as b:
        client = _Client(a.getsockname()[1])
        watch = coordinators.CoordinatorWatch(client, "t-processor-p1", "t-processor", lambda: 0.0)
        client.port = b.getsockname()[1]
        watch.shaken()
        assert watch.moved() is None
        clock = [0.0]
        wait = StaleWait(client, "t-processor-p1", "t-processor", lambda: clock[0], known=watch.known)
        assert wait.check(1.0) is None
        clock[0] = coordinators.MOVED_GRACE_S + 0.1
        assert wait.check(1.6) is None  # not treated as moved: the full grace
        clock[0] = coordinators.GRACE_S
        assert wait.check(3.0) is not None


def test_coordinator_watch_learns_where_they_are_when_they_were_unknown_at_the_start() -> None:
    class _Silent:
        def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
            raise RuntimeError("no answer")

    with _listening() as live:
        clock = [0.0]
        watch = coordinators.CoordinatorWatch(_Silent(), "t-processor-p1", "t-processor", lambda: clock[0])
        assert watch.known is None
        watch._client = _Client(live.getsockname()[1])
        watch.shaken()
        assert watch.moved() is None and watch.known == [f"127.0.0.1:{live.getsockname()[1]}"] * 2
