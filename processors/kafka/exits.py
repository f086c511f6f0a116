"""How a long-running runfold process ends (`ExitCode`: the processor, a worker, the child
executor, `runfold index run`, `runfold ui`, one vocabulary, docs/runtime.md "Exit codes"), why
the run processor stops, and the start-up calls a stop request cuts short."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import IntEnum
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")


class ExitCode(IntEnum):
    """The exit code of every long-running process, and what its supervisor should do. (The
    one-shot commands, `runfold runs start` and the like, have their own: processors/cli/common.py.)"""

    OK = 0  # stopped on request (SIGTERM/SIGINT)
    FATAL = 1  # an error no retry in-process mends (a fatal Kafka error, a store failure, a crash): restart
    CONFIG = 2  # cannot start as configured (settings, a port, topics, no cluster answering): fix, then start
    FENCED = 3  # another instance took its id: do not restart in a loop
    STUCK = 4  # stuck inside a Kafka client call (watchdog), or too many such calls left behind: restart


# Errors that mean another instance with our transactional id or static member id runs.
FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.FENCED_INSTANCE_ID,
    }
)


class ProcessorStopped(Exception):
    """The loop cannot go on (fenced, fatal Kafka error, bad topology, store failure); `code`
    is the process's exit code."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stopping:
    """A service's stop request, and the error that ends it when it cannot go on, shared by its
    parts. A part that finds out inside a librdkafka callback (a rebalance, an error callback),
    where an exception would be lost, records it here; the loop raises it at its next step."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event or threading.Event()
        self.fatal: ProcessorStopped | None = None

    def fail(self, e: ProcessorStopped) -> None:
        self.fatal = e
        self.event.set()


class StopRequested(Exception):
    """SIGTERM/SIGINT arrived while start-up still waited for the cluster: a clean stop."""


# A start-up call waits this long at most before the stop request is looked at again. The
# signal handler itself only runs between two calls: librdkafka holds the main thread meanwhile.
_SLICE_S = 1.0
KEEP_WAITING = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


def until_stopped(call: Callable[[float], T], stop: threading.Event, timeout_s: float) -> T:
    """`call(t)` in slices of at most a second, repeated while the cluster is not answering yet,
    until it returns, `timeout_s` has passed or `stop` is set (StopRequested). Without slices a
    Ctrl-C during start-up waited the whole 30 s call out. Only for calls librdkafka lets resume
    after a timeout (metadata, init_transactions). At the deadline the error raised is the last
    one that says more than "timed out" (a resumed init_transactions forgets why the previous
    slice's attempt failed, and a slice's own timeout says nothing), else the last."""
    deadline = time.monotonic() + timeout_s
    telling: KafkaException | None = None
    while True:
        if stop.is_set():
            raise StopRequested
        began = time.monotonic()
        try:
            return call(max(0.05, min(_SLICE_S, deadline - began)))
        except KafkaException as e:
            err = e.args[0]
            if not (err.retriable() or err.code() in KEEP_WAITING):
                raise
            if err.code() != KafkaError._TIMED_OUT:
                telling = e
            if time.monotonic() >= deadline - 0.05:
                raise (telling or e) from None
        # an error at once (connection refused) is not retried faster than the slice
        stop.wait(max(0.0, min(_SLICE_S - (time.monotonic() - began), deadline - time.monotonic())))
