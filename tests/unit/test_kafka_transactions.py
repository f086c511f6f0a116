"""The commit rule (processors/kafka/transactions.py): a commit that timed out is resumed by
calling commit_transaction again, never aborted; what needs an abort, or is fatal, is raised at
once; a timeout that never ends is raised after the last attempt. The 3-node chaos scenario saw
the child executor abort a timed-out commit and stop on "Conflicting commit_transaction API
call is already in progress"."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.kafka.exits import StopRequested
from processors.kafka.transactions import (
    COMMIT_ATTEMPTS,
    GroupMetadata,
    commit_resuming,
    init_transactions_waiting,
)


class Committer:
    """Stands for the producer's commit_transaction: raises the given errors, then returns."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def commit_transaction(self, timeout: float) -> None:
        self.calls += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))


def timed_out() -> KafkaError:
    return KafkaError(KafkaError._TIMED_OUT, "Timed out, retry call to resume", retriable=True)


def test_a_commit_that_timed_out_is_resumed_until_it_returns() -> None:
    p = Committer(timed_out(), timed_out())
    retries: list[int] = []
    commit_resuming(p, 1.0, lambda err, attempt: retries.append(attempt))  # type: ignore[arg-type]
    assert p.calls == 3 and retries == [1, 2]


@pytest.mark.parametrize(
    "err",
    [
        KafkaError(KafkaError._TIMED_OUT, "needs abort", retriable=True, txn_requires_abort=True),
        KafkaError(KafkaError._FENCED, "fenced", fatal=True),
        KafkaError(KafkaError.INVALID_TXN_STATE, "not retriable"),
    ],
)
def test_what_needs_an_abort_or_is_fatal_is_raised_at_once(err: KafkaError) -> None:
    p = Committer(err, timed_out())
    retries: list[Any] = []
    with pytest.raises(KafkaException):
        commit_resuming(p, 1.0, lambda e, attempt: retries.append(attempt))  # type: ignore[arg-type]
    assert p.calls == 1 and retries == []


def test_a_timeout_that_never_ends_is_raised_after_the_last_attempt() -> None:
    p = Committer(*(timed_out() for _ in range(COMMIT_ATTEMPTS + 3)))
    with pytest.raises(KafkaException):
        commit_resuming(p, 1.0, lambda e, attempt: None)  # type: ignore[arg-type]
    assert p.calls == COMMIT_ATTEMPTS


def test_a_commit_is_resumed_past_the_attempts_while_no_broker_answers_then_until_it_returns() -> None:
    """A whole cluster lost longer than the attempts (5 x 10 s): giving up meant an abort that
    conflicts with the commit, and an exit (the 40 s outage of tests/chaos/test_chaos.py)."""
    p = Committer(*(timed_out() for _ in range(COMMIT_ATTEMPTS + 4)))
    asked: list[int] = []

    def lost() -> bool:
        asked.append(p.calls)
        return True

    retries: list[int] = []
    commit_resuming(p, 1.0, lambda e, attempt: retries.append(attempt), cluster_lost=lost)  # type: ignore[arg-type]
    assert p.calls == COMMIT_ATTEMPTS + 5 and retries == list(range(1, COMMIT_ATTEMPTS + 5))
    assert asked[0] == COMMIT_ATTEMPTS  # the cluster is looked at only once the attempts are spent


def test_a_cluster_back_gives_the_commit_a_fresh_set_of_attempts_then_raises() -> None:
    """Back from a long outage, the coordinator may still be loading: the commit gets its full
    attempts again, not the one left (review finding), and is raised after them."""
    p = Committer(*(timed_out() for _ in range(3 * COMMIT_ATTEMPTS)))
    answers = iter([False, False, True, True])  # lost, lost, back (fresh attempts), still answering
    with pytest.raises(KafkaException):
        commit_resuming(p, 1.0, lambda e, attempt: None, cluster_lost=lambda: not next(answers))  # type: ignore[arg-type]
    assert p.calls == COMMIT_ATTEMPTS + 2 + COMMIT_ATTEMPTS


def test_a_cluster_lost_past_the_bound_or_a_stop_ends_the_wait() -> None:
    now = [0.0]
    p = Committer(*(timed_out() for _ in range(100)))

    def lost() -> bool:
        now[0] += 60.0  # each resumption a minute later
        return True

    with pytest.raises(KafkaException):
        commit_resuming(p, 1.0, lambda e, a: None, cluster_lost=lost, max_wait_s=300.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert p.calls == COMMIT_ATTEMPTS + 6  # the first lost answer starts the clock: 5 minutes more
    stopped = Committer(*(timed_out() for _ in range(100)))
    with pytest.raises(KafkaException):  # the caller's cluster_lost says False once a stop is asked
        commit_resuming(stopped, 1.0, lambda e, a: None, cluster_lost=lambda: False)  # type: ignore[arg-type]
    assert stopped.calls == COMMIT_ATTEMPTS


class _Initer:
    """init_transactions failing as librdkafka does while no broker answers, then succeeding."""

    def __init__(self, failures: int, code: int = KafkaError._TRANSPORT, retriable: bool = True) -> None:
        self.failures, self.code, self.retriable, self.calls = failures, code, retriable, 0

    def init_transactions(self, timeout: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code, "all brokers down", retriable=self.retriable))


def test_a_producer_waits_for_a_cluster_down_or_below_quorum_however_long() -> None:
    # no broker answers (_TRANSPORT), then brokers answer but the transaction coordinator cannot
    # be elected (two of three lost): both are waited for, round after round (issue 48)
    p = _Initer(failures=25)
    waits: list[int] = []
    init_transactions_waiting(p, threading.Event(), 0.01, lambda e, n: waits.append(n))  # type: ignore[arg-type]
    assert p.calls == 26 and waits == list(range(1, 26))
    below_quorum = _Initer(failures=25, code=KafkaError.COORDINATOR_NOT_AVAILABLE)
    init_transactions_waiting(below_quorum, threading.Event(), 0.01, lambda e, n: None)  # type: ignore[arg-type]
    assert below_quorum.calls == 26


def test_a_producer_refused_or_stopped_does_not_wait() -> None:
    fatal = _Initer(failures=9, code=KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, retriable=False)
    with pytest.raises(KafkaException):
        init_transactions_waiting(fatal, threading.Event(), 0.01, lambda e, n: None)  # type: ignore[arg-type]
    assert fatal.calls == 1
    stop = threading.Event()
    stop.set()
    with pytest.raises(StopRequested):
        init_transactions_waiting(_Initer(failures=9), stop, 0.01, lambda e, n: None)  # type: ignore[arg-type]


class _Member:
    """A consumer whose group metadata changes at each ask (as a new generation's would)."""

    def __init__(self) -> None:
        self.asked = 0

    def consumer_group_metadata(self) -> tuple[int, int]:
        self.asked += 1
        return (id(self), self.asked)


def test_group_metadata_is_asked_once_per_generation_and_consumer() -> None:
    meta, member = GroupMetadata(), _Member()
    first = meta.of(member)
    assert meta.of(member) is first and meta.of(member) is first and member.asked == 1
    meta.forget()  # a rebalance callback or an abort
    assert meta.of(member) != first and member.asked == 2
    replacement = _Member()  # membership replaced the consumer: never the old one's metadata
    assert meta.of(replacement) == (id(replacement), 1) and replacement.asked == 1


def test_an_abort_forgets_the_group_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets refused for a stale generation fail the commit, whose abort must make the next
    commit ask afresh (else every later transaction would be refused the same way)."""
    from processors.runtime.loop import Processor
    from processors.runtime.settings import ProcessorSettings

    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1", alternate_producers=False))
    member = _Member()
    proc.txn.input = member  # type: ignore[assignment]
    proc.txn.group_metadata.of(member)
    proc.txn.open = False  # nothing to abort at the coordinator: only the bookkeeping runs
    proc.producers._producers = [object(), None]  # type: ignore[list-item]
    proc.txn.abort("send_offsets_to_transaction: ILLEGAL_GENERATION")
    proc.txn.group_metadata.of(member)
    assert member.asked == 2
