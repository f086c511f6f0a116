"""How the processor reads a FENCED_INSTANCE_ID on its offsets (the decision only; the race
itself is exercised by tests/chaos/test_stalls.py with a frozen broker)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.runtime.loop import EXIT_FENCED, Processor, ProcessorStopped
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
