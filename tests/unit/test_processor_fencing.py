"""How the processor reads a FENCED_INSTANCE_ID on its offsets (the decision only; the race
itself is exercised by tests/chaos/test_stalls.py with a frozen broker)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from processors.runtime.loop import EXIT_FATAL, EXIT_FENCED, Processor, ProcessorStopped
from processors.runtime.settings import ProcessorSettings


def _processor(monkeypatch: pytest.MonkeyPatch) -> tuple[Processor, list[str]]:
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1"))
    aborted: list[str] = []
    monkeypatch.setattr(proc, "_abort", aborted.append)
    return proc, aborted


def _fenced_instance() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID, "Static consumer fenced"))


def test_stale_membership_right_after_our_own_session_loss_aborts_and_rejoins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, aborted = _processor(monkeypatch)
    proc._session_lost_at = time.monotonic() - 4  # on_lost 4 s ago (broker frozen past the session)
    proc._txn_failed(_fenced_instance(), "commit")
    assert len(aborted) == 1 and "commit" in aborted[0]
    assert proc._consumer_failed is not None and proc._consumer_failed.code() == KafkaError.FENCED_INSTANCE_ID


def test_without_a_recent_session_loss_it_is_another_instance_with_our_id(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, aborted = _processor(monkeypatch)  # _session_lost_at: never
    with pytest.raises(ProcessorStopped) as stopped:
        proc._txn_failed(_fenced_instance(), "commit")
    assert stopped.value.code == EXIT_FENCED and "instance_id" in str(stopped.value)
    assert aborted == [] and proc._consumer_failed is None


class _Renewed(Exception):
    pass


def test_a_producer_that_failed_fatally_while_idle_is_replaced_before_its_next_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, _ = _processor(monkeypatch)
    # a real client (poll(0) serves callbacks offline); it never reaches begin_transaction here
    proc._producers = [Producer({"bootstrap.servers": "127.0.0.1:9"}), Producer({"bootstrap.servers": "127.0.0.1:9"})]
    proc._slot = 1
    fatal = KafkaError(KafkaError._FATAL, "idempotent producer: unrecoverable", fatal=True)
    proc._on_producer_error(1, fatal)
    assert proc._producer_failed == [None, fatal]

    def renew(err: KafkaError, stage: str) -> None:
        raise _Renewed(stage, err.str())

    monkeypatch.setattr(proc, "_renew_producer", renew)
    with pytest.raises(_Renewed, match="failed while idle"):
        proc._begin()
    proc._producer_renewed = True  # the other producer was just replaced: a second failure stops
    with pytest.raises(ProcessorStopped) as stopped:
        proc._begin()
    assert stopped.value.code == EXIT_FATAL and "unrecoverable" in str(stopped.value)


def test_a_fenced_error_callback_stops_instead_of_replacing(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, _ = _processor(monkeypatch)
    proc._on_producer_error(0, KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    assert proc._producer_failed == [None, None]
    assert proc._fatal is not None and proc._fatal.code == EXIT_FENCED and proc.stop_event.is_set()
