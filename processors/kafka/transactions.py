"""The commit and renewal rules every transactional runfold process follows.

A retriable failure of `commit_transaction` (a timeout: the commit goes on in the background)
must be resumed by calling `commit_transaction` again, never aborted: an abort then fails with
"Conflicting commit_transaction API call is already in progress", and the transaction's outcome
is unknown until a call returns it. So the call is repeated, up to `attempts` times, and while
no broker answers at all (or one the metadata names is down: `coordinators.cluster_whole`, the
callers' test), for as long as CLUSTER_LOSS_WAIT_S (no bound) more (a whole cluster lost: only its
return can tell the outcome; a process that gave up here had to exit, since replaying the input
could emit the outputs twice); a failure that needs an abort, a fatal one, or the last attempt's
while the cluster answers is raised to the caller. A producer replaced while no broker answers
waits for the cluster the same way (`init_transactions_waiting`), with no bound: nothing is in
doubt yet.

A fatal producer error that is not another instance's fence (the coordinator was lost and its
successor aborted the transaction and bumped the epoch: INVALID_TXN_STATE, PRODUCER_FENCED after
a freeze) is mended by a new producer; a second one soon after, with nothing committed between,
is not passing, and the process stops (`Renewals`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from processors.kafka.exits import KEEP_WAITING, until_stopped

COMMIT_ATTEMPTS = 5
# A fatal producer error again this soon after a replacement, with no commit between, stops the
# process. "Once between two commits" was the rule before; the 3-node chaos scenario saw it stop
# a child executor that had nothing to commit between two faults of a rolling restart, and a
# processor whose commit after a renewal fails in the same fault has the same gap.
RENEW_AGAIN_AFTER_S = 30.0
# How long a commit in doubt waits for a cluster that is not whole (no broker answers, or one it
# names is down), past its attempts: however long it takes (issue 48: no process gives up
# because of an outage; it was 300 s, then exit 1). Only a stop request ends the wait.
CLUSTER_LOSS_WAIT_S = math.inf


class GroupMetadata:
    """A consumer's group metadata (member id, generation, instance id) for
    `send_offsets_to_transaction`, asked of librdkafka once per generation instead of once per
    commit: each ask is a round trip to librdkafka's main thread (12 us on an idle host, ~0.26
    ms at 190 one-step runs/s on 2 cores, where it was 12 % of the processor loop's samples).
    The owner forgets it at every rebalance callback and after every abort. One that went
    stale all the same (a generation that moved without a callback) makes the coordinator
    refuse the offsets (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID): the transaction aborts, which
    forgets it, and the next commit asks afresh; never a commit under a wrong generation."""

    def __init__(self) -> None:
        self._consumer: Any = None
        self._metadata: Any = None

    def of(self, consumer: Any) -> Any:
        """`consumer.consumer_group_metadata()`, asked once until forgotten or another consumer."""
        if self._metadata is None or consumer is not self._consumer:
            self._metadata = consumer.consumer_group_metadata()
            self._consumer = consumer
        return self._metadata

    def forget(self) -> None:
        self._consumer = self._metadata = None


class Renewals:
    """When a transactional producer may be replaced after a fatal error that is not a fence:
    not while `recent` (one was replaced less than RENEW_AGAIN_AFTER_S ago, nothing committed
    since)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.renewed_at: float | None = None  # clock time of the last renewal, until a commit

    def renewed(self) -> None:
        self.renewed_at = self._clock()

    def committed(self) -> None:
        self.renewed_at = None

    @property
    def recent(self) -> bool:
        return self.renewed_at is not None and self._clock() - self.renewed_at < RENEW_AGAIN_AFTER_S


def commit_resuming(
    producer: Producer,
    timeout_s: float,
    on_retry: Callable[[KafkaError, int], None],
    bounded: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    attempts: int = COMMIT_ATTEMPTS,
    cluster_lost: Callable[[], bool] = lambda: False,
    max_wait_s: float = CLUSTER_LOSS_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Commit the open transaction, resuming a commit that timed out. `on_retry(error,
    attempt)` is told of each resumption; `bounded()` wraps each call (a watchdog).
    `cluster_lost()` is asked once the attempts are spent: True (no broker answers; the caller
    says False once it is asked to stop) resumes on, for at most `max_wait_s`; once the cluster
    answers again the commit gets a fresh set of attempts."""
    attempt = 0  # counted while the cluster answers
    resumed = 0
    lost_since: float | None = None
    while True:
        try:
            with bounded():
                producer.commit_transaction(timeout_s)
            return
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if not err.retriable() or err.txn_requires_abort() or err.fatal():
                raise
            attempt += 1
            if attempt >= attempts:
                if cluster_lost():
                    if lost_since is None:
                        lost_since = clock()
                    elif clock() - lost_since > max_wait_s:
                        raise
                    attempt = attempts - 1  # not counted while nobody answers
                elif lost_since is not None:
                    lost_since, attempt = None, 0  # back: a fresh set of attempts
                else:
                    raise
            resumed += 1
            on_retry(err, resumed)


# How long each round of a waiting init_transactions lasts: what it waits for is said once a round.
WAIT_ROUND_S = 10.0


def init_transactions_waiting(
    producer: Producer,
    stop: threading.Event,
    round_s: float,
    on_wait: Callable[[KafkaError, int], None],
    bounded: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> None:
    """`init_transactions` of a new producer (at start-up, or replacing one while running), in
    rounds of `round_s`, for as long as the cluster cannot serve it: no broker answers, or some
    do but the transaction coordinator is not available (two brokers of three lost: the
    transaction state's partitions have no leader or too few in-sync replicas; a coordinator
    still loading). `on_wait(error, rounds)` after each such round. Nothing is in doubt before it
    returns, so there is no reason to give up however long that lasts (issue 48: a processor
    gave up after 70 s of a quorum loss and served again only when restarted by hand). A fatal
    or non-retriable error (a fence, an authorization refused) is raised; a stop request raises
    StopRequested."""
    rounds = 0
    while True:
        try:
            with bounded():
                until_stopped(producer.init_transactions, stop, round_s)
            return
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if not (err.retriable() or err.code() in KEEP_WAITING) or err.fatal():
                raise
            rounds += 1
            on_wait(err, rounds)
