"""The commit rule (processors/kafka/transactions.py): a commit that timed out is resumed by
calling commit_transaction again, never aborted; what needs an abort, or is fatal, is raised at
once; a timeout that never ends is raised after the last attempt. The 3-node chaos scenario saw
the child executor abort a timed-out commit and stop on "Conflicting commit_transaction API
call is already in progress"."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.kafka.transactions import COMMIT_ATTEMPTS, commit_resuming


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


def test_once_the_cluster_answers_again_a_commit_that_still_times_out_is_raised() -> None:
    p = Committer(*(timed_out() for _ in range(COMMIT_ATTEMPTS + 10)))
    answers = iter([False, False, True])  # lost, lost, back
    with pytest.raises(KafkaException):
        commit_resuming(p, 1.0, lambda e, attempt: None, cluster_lost=lambda: not next(answers))  # type: ignore[arg-type]
    assert p.calls == COMMIT_ATTEMPTS + 2
