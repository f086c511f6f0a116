"""Liveness of the transaction loop.

A loop that stops iterating holds its partitions and its open transaction while doing
nothing, and a call stuck inside the Kafka client cannot be interrupted from Python. The
watchdog, on its own thread, notices that no iteration has begun for `limit_s`, logs where
the loop is stuck (its Python stack), and acts: the CLI exits the process so that its
supervisor restarts it. That is as safe as a `kill -9`: nothing of the open transaction is
committed and the store is only written after a commit.

A call given a timeout is watched more closely (`call`). librdkafka's
`send_offsets_to_transaction` waits for its internal request flow without a limit of its
own (the timeout is enforced inside that flow) and was seen blocked for minutes past its
timeout right after a broker restart; `begin_transaction` has no timeout at all
(librdkafka#4420). Such a call is a stall once its timeout plus `CALL_GRACE_S` has passed.

`CallThread` lets the loop stop waiting for such a call before that: the call runs on a
helper thread and the loop gives up on it after a deadline (`CallAbandoned`), leaving the
call, its thread and its client behind, never to be touched again.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

CALL_GRACE_S = 10.0
# The watchdog's own wake-ups late by more than this: the whole process was frozen (SIGSTOP, a
# paused VM, a host that starved it), not the loop stuck, and the time lost is not the loop's.
FROZEN_S = 3.0
T = TypeVar("T")


class CallAbandoned(Exception):
    """The call did not return in time; it goes on, alone, on its helper thread. `done` is set
    if it ever returns."""

    def __init__(self, message: str, done: threading.Event) -> None:
        super().__init__(message)
        self.done = done


class _Job:
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class CallThread:
    """Runs blocking calls one at a time on a helper thread, so that the caller can stop
    waiting for one that never returns. The thread of an abandoned call is left to it; the
    next call starts a new one. Costs a thread handoff per call (tens of µs)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] | None = None

    def run(
        self,
        fn: Callable[[], T],
        wait_s: float,
        meanwhile: Callable[[], object] | None = None,
        give_up: Callable[[float], str | None] | None = None,
    ) -> T:
        """fn()'s result or exception; CallAbandoned if it has not returned after wait_s.
        `meanwhile` runs on the caller's thread while fn runs (its time counts in wait_s).
        `give_up(seconds so far)`, asked about every 0.25 s while fn runs, may give a reason to
        abandon it before wait_s (coordinators.StaleWait)."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), name=self._name, daemon=True).start()
        job = _Job(fn)
        started = time.monotonic()
        self._jobs.put(job)
        try:
            if meanwhile is not None:
                meanwhile()
        finally:  # also when meanwhile raised: the caller never goes on while the call runs unwatched
            while not job.done.wait(max(0.0, min(0.25, wait_s - (time.monotonic() - started)))):
                elapsed = time.monotonic() - started
                why = f"no return after {wait_s:.0f} s" if elapsed >= wait_s else None
                if why is None and give_up is not None:
                    why = give_up(elapsed)
                if why is not None:
                    self._jobs.put(None)  # that thread is the call's now; it ends if the call ever does
                    self._jobs = None
                    raise CallAbandoned(why, job.done)
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                job.result = job.fn()
            except BaseException as e:  # handed to the caller, which re-raises it
                job.error = e
            job.done.set()


def send_offsets_flushing(
    calls: CallThread,
    producer: Any,
    offsets: list[Any],
    group: Any,
    timeout_s: float,
    wait_s: float,
    give_up: Callable[[float], str | None] | None = None,
) -> float:
    """`send_offsets_to_transaction` on `calls`' thread while this thread flushes the
    transaction's records. librdkafka sends one ProduceRequest per partition and the broker
    serves a connection's requests one at a time, so the flush is most of a commit; the
    offsets go to the coordinators on their own connections, so the two overlap, and
    `commit_transaction` has only EndTxn left. CallAbandoned after `wait_s`.

    A transaction that already failed (fenced, or a delivery refused) makes confluent-kafka's
    flush serve a delivery report with the transaction's KafkaException already set, and it
    raises SystemError caused by it. Such a transaction cannot commit: the caller must see the
    error that says why, so it aborts or stops as for any failed transaction. The offsets call's
    own error wins (fenced, coordinator trouble), except when it only reports the transaction's
    state (`_STATE`, "Erroneous state": a delivery failed first); then the flush's error, which
    names the delivery's (e.g. MSG_SIZE_TOO_LARGE, whose input the caller must find and park,
    where a plain abort would replay the same batch into the same refusal).

    Returns the seconds the flush took (a slow commit's log says which of the two waited)."""
    flush_errors: list[Exception] = []
    flushed_s = [0.0]

    def flush() -> None:
        t0 = time.perf_counter()
        try:
            producer.flush(timeout_s)
        except Exception as e:
            flush_errors.append(e)
        flushed_s[0] = time.perf_counter() - t0

    def flush_error() -> KafkaException | Exception | None:
        if not flush_errors:
            return None
        cause = flush_errors[0].__cause__ or flush_errors[0].__context__
        return cause if isinstance(cause, KafkaException) else flush_errors[0]

    try:
        calls.run(
            lambda: producer.send_offsets_to_transaction(offsets, group, timeout_s),
            wait_s,
            meanwhile=flush,
            give_up=give_up,
        )
    except KafkaException as e:
        delivery = flush_error()
        if e.args[0].code() == KafkaError._STATE and isinstance(delivery, KafkaException):
            raise delivery from e
        raise
    error = flush_error()
    if error is not None:
        raise error
    return flushed_s[0]


class Watchdog:
    def __init__(
        self,
        limit_s: float,
        on_stall: Callable[[float, str], None],
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = 1.0,
    ) -> None:
        self.limit_s = limit_s
        self._on_stall = on_stall
        self._clock = clock
        self._interval_s = interval_s
        self._last = clock()
        self._call: tuple[str, float] | None = None  # (name, deadline) of the watched call in progress
        self._thread_id: int | None = None  # the loop's thread, whose stack is reported
        self._reported_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticked = clock()

    def beat(self) -> None:
        """The loop began an iteration."""
        self._last = self._clock()

    @contextmanager
    def call(self, name: str, timeout_s: float) -> Iterator[None]:
        """The loop is inside `name`, which should return within `timeout_s`."""
        self._call = (name, self._clock() + timeout_s + CALL_GRACE_S)
        try:
            yield
        finally:
            self._call = None

    def start(self) -> None:
        """Watch the calling thread (the loop's)."""
        self._thread_id = threading.get_ident()
        self.beat()
        self._thread = threading.Thread(target=self._run, name="runfold-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _stall(self) -> tuple[float, float, str | None]:
        """(last beat, seconds stalled or 0.0, the call past its deadline if any)."""
        last, call, now = self._last, self._call, self._clock()
        overdue = call[0] if call is not None and now >= call[1] else None
        return last, now - last if now - last >= self.limit_s or overdue is not None else 0.0, overdue

    def stalled_s(self) -> float:
        """How long the loop has been stalled (0.0 when it is not): what `/health` reports, so
        a liveness probe can restart a processor that is embedded and cannot exit by itself."""
        return self._stall()[1]

    def check(self) -> bool:
        """Report a stall once per stall (again only after the loop moved on); True when reported."""
        last, stalled_s, overdue = self._stall()
        if not stalled_s or self._reported_at == last:
            return False
        self._reported_at = last
        where = f"{overdue} did not return within its timeout\n" if overdue is not None else ""
        self._on_stall(stalled_s, where + self.stack())
        return True

    def stack(self) -> str:
        frame = sys._current_frames().get(self._thread_id) if self._thread_id is not None else None
        return "".join(traceback.format_stack(frame)) if frame is not None else "(loop thread not found)"

    def tick(self) -> bool:
        """One wake-up of the watchdog thread: first forgive the time the whole process was
        frozen (its own wake-up came that much late), then `check`."""
        now = self._clock()
        lost = now - self._ticked - self._interval_s
        self._ticked = now
        if lost > FROZEN_S:
            self._last += lost
            call = self._call
            if call is not None:
                self._call = (call[0], call[1] + lost)
        return self.check()

    def _run(self) -> None:
        self._ticked = self._clock()
        while not self._stop.wait(self._interval_s):
            self.tick()
