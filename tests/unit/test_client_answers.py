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
