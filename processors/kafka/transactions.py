"""The commit and renewal rules every transactional runfold process follows.

A retriable failure of `commit_transaction` (a timeout: the commit goes on in the background)
must be resumed by calling `commit_transaction` again, never aborted: an abort then fails with
"Conflicting commit_transaction API call is already in progress", and the transaction's outcome
is unknown until a call returns it. So the call is repeated, up to `attempts` times, and for as
long as no broker answers at all (a whole cluster lost: only its return can tell the outcome; a
process that gave up here had to exit, since replaying the input could emit the outputs twice);
a failure that needs an abort, a fatal one, or the last attempt's while the cluster answers is
raised to the caller.

A fatal producer error that is not another instance's fence (the coordinator was lost and its
successor aborted the transaction and bumped the epoch: INVALID_TXN_STATE, PRODUCER_FENCED after
a freeze) is mended by a new producer; a second one soon after, with nothing committed between,
is not passing, and the process stops (`Renewals`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

COMMIT_ATTEMPTS = 5
# A fatal producer error again this soon after a replacement, with no commit between, stops the
# process. "Once between two commits" was the rule before; the 3-node chaos scenario saw it stop
# a child executor that had nothing to commit between two faults of a rolling restart, and a
# processor whose commit after a renewal fails in the same fault has the same gap.
RENEW_AGAIN_AFTER_S = 30.0


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
) -> None:
    """Commit the open transaction, resuming a commit that timed out. `on_retry(error,
    attempt)` is told of each resumption; `bounded()` wraps each call (a watchdog);
    `cluster_lost()` is asked once the attempts are spent: True (no broker answers) resumes on."""
    attempt = 0
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
            if attempt >= attempts and not cluster_lost():
                raise
            on_retry(err, attempt)
