"""How the processor reads a FENCED_INSTANCE_ID on its offsets (the decision only; the race
itself is exercised by tests/chaos/test_stalls.py with a frozen broker)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from processors.kafka.exits import ExitCode, ProcessorStopped, StopRequested
from processors.kafka.transactions import RENEW_AGAIN_AFTER_S, Renewals
from processors.runtime import producers as producers_module
from processors.runtime.loop import Processor
from processors.runtime.settings import ProcessorSettings


def _processor(monkeypatch: pytest.MonkeyPatch) -> tuple[Processor, list[str]]:
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1"))
    aborted: list[str] = []
    monkeypatch.setattr(proc.txn, "abort", aborted.append)
    return proc, aborted


def _fenced_instance() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID, "Static consumer fenced"))


def test_stale_membership_right_after_our_own_session_loss_aborts_and_rejoins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, aborted = _processor(monkeypatch)
    proc.membership._session_lost_at = (
        time.monotonic() - 4
    )  # on_lost 4 s ago (broker frozen past the session)
    proc.failures.txn_failed(_fenced_instance(), "commit")
    assert len(aborted) == 1 and "commit" in aborted[0]
    assert (
        proc.membership.consumer_failed is not None
        and proc.membership.consumer_failed.code() == KafkaError.FENCED_INSTANCE_ID
    )


def test_stale_membership_without_a_session_loss_rejoins_too_but_not_again_and_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seen after a broker restart: the consumer rejoined under a new member id and the offsets
    # named the old one. Another instance with our id would have fenced our producers first
    # (the abort would stop us), so this rejoins; refused 3 times with no commit between: fenced.
    proc, aborted = _processor(monkeypatch)  # _session_lost_at: never
    for n in range(1, 4):
        proc.membership.consumer_failed = None
        proc.failures.txn_failed(_fenced_instance(), "commit")
        assert (
            len(aborted) == n and proc.membership.consumer_failed is not None and proc.membership.rejoin_stale
        )
    with pytest.raises(ProcessorStopped) as stopped:
        proc.failures.txn_failed(_fenced_instance(), "commit")
    assert stopped.value.code == ExitCode.FENCED and "instance_id" in str(stopped.value)
    assert len(aborted) == 3


def _offline_producers() -> list[Producer | None]:
    """Real clients with no broker behind them: poll(0) serves callbacks offline."""
    return [Producer({"bootstrap.servers": "127.0.0.1:9"}), Producer({"bootstrap.servers": "127.0.0.1:9"})]


class _Renewed(Exception):
    pass


def test_a_producer_that_failed_fatally_while_idle_is_replaced_before_its_next_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, _ = _processor(monkeypatch)
    # it never reaches begin_transaction here
    proc.producers._producers = _offline_producers()
    proc.producers.slot = 1
    fatal = KafkaError(KafkaError._FATAL, "idempotent producer: unrecoverable", fatal=True)
    proc.producers.on_error(1, fatal)
    assert proc.producers.failed == [None, fatal]

    def renew(err: KafkaError, stage: str) -> None:
        raise _Renewed(stage, err.str())

    monkeypatch.setattr(proc.producers, "renew", renew)
    with pytest.raises(_Renewed, match="failed while idle"):
        proc.txn.begin()
    proc.producers.renewals.renewed()  # the other producer was just replaced: a second failure stops
    with pytest.raises(ProcessorStopped) as stopped:
        proc.txn.begin()
    assert stopped.value.code == ExitCode.FATAL and "unrecoverable" in str(stopped.value)
    # a fatal error RENEW_AGAIN_AFTER_S after the last renewal is a new fault: renewed again
    # (an idle processor commits nothing between two faults of a rolling restart)
    assert proc.producers.renewals.renewed_at is not None
    proc.producers.renewals.renewed_at -= RENEW_AGAIN_AFTER_S + 1
    with pytest.raises(_Renewed, match="failed while idle"):
        proc.txn.begin()


def test_a_fenced_error_callback_stops_instead_of_replacing(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, _ = _processor(monkeypatch)
    proc.producers.on_error(0, KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    assert proc.producers.failed == [None, None]
    assert (
        proc.stopping.fatal is not None
        and proc.stopping.fatal.code == ExitCode.FENCED
        and proc.stop_event.is_set()
    )


def test_a_producer_that_saw_every_broker_down_is_replaced_once_the_cluster_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, _ = _processor(monkeypatch)
    proc.producers._producers = _offline_producers()
    proc.producers.on_error(0, KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert proc.producers.cut_off == [True, False] and proc.producers.failed == [None, None]
    replaced: list[str] = []
    monkeypatch.setattr(proc.producers, "replace", lambda why, reason, **kw: replaced.append(reason))
    monkeypatch.setattr(proc.producers, "cluster_answers", lambda: False)
    with pytest.raises(ProcessorStopped):  # still down: the old one goes on (offline, it cannot begin)
        proc.txn.begin()
    assert replaced == []
    monkeypatch.setattr(proc.producers, "cluster_answers", lambda: True)
    with pytest.raises(ProcessorStopped):
        proc.txn.begin()
    assert replaced == ["cluster_unreachable"]


class _AbortTimesOut:
    def __init__(self, code: int = KafkaError._TIMED_OUT) -> None:
        self.purged = False
        self.code = code

    def abort_transaction(self, timeout: float) -> None:
        raise KafkaException(
            KafkaError(
                self.code, "Timed out waiting for operation to finish, retry call to resume", retriable=True
            )
        )

    def purge(self) -> None:
        self.purged = True


def test_an_abort_that_times_out_replaces_the_producer_and_rewinds_instead_of_stopping() -> None:
    from confluent_kafka import Consumer

    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1", alternate_producers=False))
    stuck, fresh = _AbortTimesOut(), object()
    proc.producers._producers = [stuck, None]  # type: ignore[list-item]
    proc.producers.new = lambda slot: fresh  # type: ignore[assignment,method-assign,return-value]
    proc.txn.input = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
    proc.txn.open, proc.txn.start = True, {("t.commands", 0): 5}
    proc.txn.abort("commit: timed out")
    assert proc.producers.current is fresh and stuck.purged
    assert proc.txn.open is False and proc.txn.start == {}
    assert proc.metrics.producers_replaced.labels("abort_timed_out")._value.get() == 1
    assert proc.metrics.transactions.labels("aborted")._value.get() == 1
    # not a fatal renewal: a later fence still means another instance
    assert not proc.producers.renewals.recent
    proc.txn.input.close()


def test_an_abort_refused_while_a_timed_out_commit_is_still_in_progress_stops_without_replaying() -> None:
    # librdkafka answers a retriable _CONFLICT: the commit may still land, so replaying the
    # input on a new producer could emit its outputs twice; stopping restores from the log.
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1", alternate_producers=False))
    conflict = _AbortTimesOut(KafkaError._CONFLICT)
    proc.producers._producers = [conflict, None]  # type: ignore[list-item]
    proc.producers.new = lambda slot: object()  # type: ignore[assignment,method-assign,return-value]
    proc.txn.input = object()  # type: ignore[assignment]
    proc.txn.open = True
    with pytest.raises(ProcessorStopped) as stopped:
        proc.txn.abort("commit: timed out 5 times")
    assert stopped.value.code == ExitCode.FATAL and proc.producers.current is conflict and not conflict.purged
    assert proc.metrics.producers_replaced.labels("abort_timed_out")._value.get() == 0


def test_a_producer_queue_that_stays_full_aborts_and_replays_the_batch_a_record_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from processors.runtime.txn import ProduceFailed

    proc, aborted = _processor(monkeypatch)
    # offline, with room for two records: the third cannot get in, even after waiting
    proc.producers._producers = [
        Producer({"bootstrap.servers": "127.0.0.1:9", "queue.buffering.max.messages": 2}),
        None,
    ]
    proc.producers.slot = 0
    proc.txn.produce("t", b"v", b"k")
    proc.txn.produce("t", b"v", b"k")
    with pytest.raises(ProduceFailed) as full:
        proc.txn.produce("t", b"v", b"k")
    assert full.value.err.code() == KafkaError._QUEUE_FULL
    proc.txn.start, proc.txn.next = {("t.commands", 0): 10}, {("t.commands", 0): 15}  # 5 inputs folded
    proc.failures.produce_failed(full.value.err, "produce")
    assert len(aborted) == 1 and "queue full" in aborted[0]  # not a crash: an abort ...
    assert proc.failures.isolate_left == 5  # ... and the same batch is not replayed whole


def test_renewals_are_recent_until_a_commit_or_the_interval_has_passed() -> None:
    now = [100.0]
    renewals = Renewals(lambda: now[0])
    assert not renewals.recent  # never renewed
    renewals.renewed()
    assert renewals.recent
    now[0] += RENEW_AGAIN_AFTER_S - 0.1
    assert renewals.recent  # a second fatal error this soon stops
    now[0] += 0.1
    assert not renewals.recent  # a new fault
    renewals.renewed()
    renewals.committed()
    assert not renewals.recent  # a commit between: a new fault too


class _InitWaits:
    """A producer whose init_transactions fails as librdkafka does while no broker answers,
    `failures` times, then succeeds."""

    def __init__(self, failures: int, code: int = KafkaError._TRANSPORT) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def __call__(self, config: dict[str, object]) -> _InitWaits:
        return self

    def init_transactions(self, timeout: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code, "all brokers down", retriable=True))


def _replacing(
    monkeypatch: pytest.MonkeyPatch, fake: _InitWaits, answers: bool
) -> tuple[Processor, list[int]]:
    proc, _ = _processor(monkeypatch)
    monkeypatch.setattr(producers_module, "Producer", fake)
    monkeypatch.setattr(producers_module, "connect_first", lambda *_: None)
    monkeypatch.setattr(producers_module, "CoordinatorWatch", lambda *_: None)
    monkeypatch.setattr(producers_module, "cluster_answers", lambda *_: answers)
    monkeypatch.setattr(producers_module, "cluster_whole", lambda *_: answers)
    monkeypatch.setattr(producers_module, "WAIT_ROUND_S", 0.05)  # a wait's round, not 10 s
    beats: list[int] = []
    monkeypatch.setattr(proc.producers, "alive", lambda: beats.append(1))
    proc.producers._producers = _offline_producers()
    return proc, beats


def test_a_producer_replaced_while_no_broker_answers_waits_for_the_cluster_instead_of_exiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _InitWaits(failures=4)
    proc, beats = _replacing(monkeypatch, fake, answers=False)
    proc.producers.replace("its coordinators moved", "coordinator_moved")  # was: exit 1 after one 30 s try
    assert proc.producers.current is fake and fake.calls > 4
    assert beats  # the loop's watchdog is told the wait is not a stall


def test_a_replacement_waits_out_a_cluster_that_answers_below_quorum(monkeypatch: pytest.MonkeyPatch) -> None:
    # brokers answer, but with two of three lost no transaction coordinator can be elected:
    # issue 48's processors exited 1 here ("Coordinator not available") after ~70 s
    fake = _InitWaits(failures=6, code=KafkaError.COORDINATOR_NOT_AVAILABLE)
    proc, beats = _replacing(monkeypatch, fake, answers=True)
    proc.producers.replace("it failed fatally", "fatal")
    assert proc.producers.current is fake and fake.calls == 7
    assert beats


def test_a_replacement_refused_stops_with_1(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Refused(_InitWaits):
        def init_transactions(self, timeout: float) -> None:
            self.calls += 1
            raise KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "refused"))

    proc, beats = _replacing(monkeypatch, _Refused(failures=99), answers=True)
    with pytest.raises(ProcessorStopped) as stopped:
        proc.producers.replace("it failed fatally", "fatal")
    assert stopped.value.code == ExitCode.FATAL and "init_transactions failed" in str(stopped.value)
    assert beats == []


def test_a_stop_request_ends_the_wait_for_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, _ = _replacing(monkeypatch, _InitWaits(failures=10**6), answers=False)
    proc.producers._stop.set()
    with pytest.raises(StopRequested):
        proc.producers.replace("its coordinators moved", "coordinator_moved")
