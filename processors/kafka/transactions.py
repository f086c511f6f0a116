"""The commit rule every transactional runfold process follows.

A retriable failure of `commit_transaction` (a timeout: the commit goes on in the background)
must be resumed by calling `commit_transaction` again, never aborted: an abort then fails with
"Conflicting commit_transaction API call is already in progress", and the transaction's outcome
is unknown until a call returns it. So the call is repeated, up to `attempts` times; a failure
that needs an abort, a fatal one, or the last attempt's is raised to the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

COMMIT_ATTEMPTS = 5


def commit_resuming(
    producer: Producer,
    timeout_s: float,
    on_retry: Callable[[KafkaError, int], None],
    bounded: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    attempts: int = COMMIT_ATTEMPTS,
) -> None:
    """Commit the open transaction, resuming a commit that timed out. `on_retry(error,
    attempt)` is told of each resumption; `bounded()` wraps each call (a watchdog)."""
    for attempt in range(attempts):
        try:
            with bounded():
                producer.commit_transaction(timeout_s)
            return
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if not err.retriable() or err.txn_requires_abort() or err.fatal() or attempt == attempts - 1:
                raise
            on_retry(err, attempt + 1)
