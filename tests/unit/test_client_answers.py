"""Matching a command's answer, and the answer wait's settings (no broker needed)."""

from __future__ import annotations

import pytest

from processors.client import RunClient
from processors.client.answers import Sent, answers
from processors.engine.ids import rejection_record_id
from topology.settings import KafkaSettings


def _sent(command: str, signal: str | None = None) -> Sent:
    return Sent("r", command, "cmd-1", "p.commands", 0, 7, "p.run-events", 0, 12, signal)


def test_only_this_commands_rejection_or_its_own_event_answers() -> None:
    mine = {"type": "RunRejected", "record_id": rejection_record_id("r", "cmd-1")}
    other = {"type": "RunRejected", "record_id": rejection_record_id("r", "cmd-2")}
    assert answers(_sent("CancelRun"), mine) and not answers(_sent("CancelRun"), other)
    assert answers(_sent("StartRun"), {"type": "RunAccepted"})
    assert not answers(_sent("StartRun"), {"type": "RunCancelled"})
    assert answers(_sent("CancelRun"), {"type": "RunCancelled"})
    assert answers(_sent("ResumeRun"), {"type": "RunResumed"})
    assert answers(_sent("SignalRun", "approval"), {"type": "SignalReceived", "signal": "approval"})
    assert not answers(_sent("SignalRun", "approval"), {"type": "SignalReceived", "signal": "other"})
    assert not answers(_sent("SignalRun", "approval"), {"type": "StepSucceeded"})


def test_answer_timeout_and_group_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="px")
    monkeypatch.delenv("RUNFOLD_ANSWER_TIMEOUT_S", raising=False)
    monkeypatch.delenv("RUNFOLD_GROUP_ID", raising=False)
    default = RunClient(settings)
    assert (default.answer_timeout_s, default.processor_group) == (5.0, "px-processor")
    monkeypatch.setenv("RUNFOLD_ANSWER_TIMEOUT_S", "0.5")
    monkeypatch.setenv("RUNFOLD_GROUP_ID", "my-group")
    env = RunClient(settings)
    assert (env.answer_timeout_s, env.processor_group) == (0.5, "my-group")
    assert RunClient(settings, answer_timeout_s=0, processor_group="g").answer_timeout_s == 0
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("RUNFOLD_ANSWER_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="RUNFOLD_ANSWER_TIMEOUT_S"):
            RunClient(settings)


def _keyed(command: str, key: str, signal: str | None = None) -> Sent:
    return Sent("r", command, "cmd-1", "p.commands", 0, 7, "p.run-events", 0, 12, signal, key=key)


def test_a_keyed_command_is_answered_by_the_event_or_the_repeat_answer_that_carries_its_key() -> None:
    """Issue 44: two identical signals of two senders are told apart by their keys; a repeat's
    CommandDeduplicated answers only the command of that key and type."""
    sent = _keyed("SignalRun", "k-1", "approval")
    received = {"type": "SignalReceived", "signal": "approval", "payload": True}
    assert answers(sent, {**received, "idempotency_key": "k-1"})
    assert not answers(sent, {**received, "idempotency_key": "k-2"})  # another sender's
    assert answers(sent, {**received, "idempotency_key": None})  # a processor predating keys
    repeat = {"type": "CommandDeduplicated", "idempotency_key": "k-1", "command_type": "SignalRun"}
    assert answers(sent, repeat)
    assert not answers(sent, {**repeat, "idempotency_key": "k-2"})
    assert not answers(sent, {**repeat, "command_type": "CancelRun"})
    cancel = _keyed("CancelRun", "c-1")
    assert answers(cancel, {"type": "RunCancelling", "idempotency_key": "c-1"})
    assert not answers(cancel, {"type": "RunCancelling", "idempotency_key": None})  # a failing run's
    assert answers(cancel, {"type": "RunCancelled", "idempotency_key": "c-1"})
    assert not answers(cancel, {"type": "RunCancelled", "idempotency_key": "c-0"})


def test_an_idempotency_key_the_run_would_refuse_is_refused_before_sending() -> None:
    client = RunClient(KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="px"))
    for bad in ("", "k" * 129):
        with pytest.raises(ValueError, match="idempotency_key must be a string of 1 to 128 characters"):
            client.signal("r", "go", idempotency_key=bad)
