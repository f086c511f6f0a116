"""A hostile review of docs/client.md's promises that need no broker: which event answers a
command when another service acts on the same run, the run id a start refuses, and the CLI's
one-line usage errors and `--json` shapes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from processors.cli import runs as runs_cli
from processors.cli.common import parse_json_arg
from processors.client import RunClient
from processors.client.answers import CommandAnswer, Sent, await_answer, same_content
from processors.client.errors import CommandRejected, InvalidArgument
from processors.engine.ids import rejection_record_id
from topology.settings import KafkaSettings


class _Msg:
    def __init__(self, key: bytes, value: dict[str, Any]) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> dict[str, Any]:
        return self._value


class _Reader:
    """The run's events as `PartitionReader.read` yields them, then idle polls (None)."""

    def __init__(self, events: list[dict[str, Any]], idle: int = 200) -> None:
        self.events, self.idle = events, idle

    def read(self, start: Any, follow: bool, deadline: Any) -> Iterator[_Msg | None]:
        for ev in self.events:
            yield _Msg(b"r", ev)
        for _ in range(self.idle):  # 10 ms a poll, as the reader's idle polls take their time
            time.sleep(0.01)
            yield None


class _Offsets:
    group = "p-processor"

    def __init__(self, committed: int | None) -> None:
        self.value = committed

    def committed(self, topic: str, partition: int) -> int | None:
        return self.value


def _sent(command: str, content: dict[str, Any], signal: str | None = None) -> Sent:
    return Sent("r", command, "cmd-1", "p.commands", 0, 7, "p.run-events", 0, 12, signal, content)


START = {"definition_id": "one-step", "revision": None, "input": {"who": 1}}


def _accepted(input: Any, seq: int = 1) -> dict[str, Any]:
    return {
        "type": "RunAccepted",
        "sequence": seq,
        "definition_id": "one-step",
        "revision": 1,
        "input": input,
    }


def _await(sent: Sent, events: list[dict[str, Any]], committed: int | None = None) -> CommandAnswer:
    decode: Any = lambda v: v  # noqa: E731  (the fake reader yields decoded events)
    reader: Any = _Reader(events)
    offsets: Any = _Offsets(committed)
    return await_answer(sent, reader, decode, offsets, 2.0, "p")


def test_another_services_run_accepted_does_not_answer_my_conflicting_start() -> None:
    """docs/client.md: `start` raises CommandRejected Conflict "for the same run id with another
    definition or input". Another service's RunAccepted of the same run id, written after my
    send, came first and was taken as my answer: my start "succeeded" while it was rejected."""
    conflict = {
        "type": "RunRejected",
        "sequence": 0,
        "record_id": rejection_record_id("r", "cmd-1"),
        "code": "Conflict",
        "reason": "run r exists with another input",
    }
    with pytest.raises(CommandRejected) as err:
        _await(_sent("StartRun", START), [_accepted({"who": 2}), conflict])
    assert err.value.code == "Conflict"
    # my own RunAccepted (key order free) answers at once
    answer = _await(
        _sent("StartRun", {**START, "input": {"b": 1, "a": [1, 2.5]}}), [_accepted({"a": [1, 2.5], "b": 1})]
    )
    assert (answer.outcome, answer.event_type, answer.sequence) == ("accepted", "RunAccepted", 1)


def test_a_signal_answer_is_the_signal_with_my_payload() -> None:
    sent = _sent("SignalRun", {"payload": {"approved": True}}, signal="approval")
    theirs = {"type": "SignalReceived", "sequence": 4, "signal": "approval", "payload": {"approved": False}}
    mine = {**theirs, "sequence": 5, "payload": {"approved": True}}
    assert not same_content(sent, theirs) and same_content(sent, mine)
    assert _await(sent, [theirs, mine]).sequence == 5
    rejected = {
        "type": "RunRejected",
        "sequence": 0,
        "record_id": rejection_record_id("r", "cmd-1"),
        "code": "Conflict",
        "reason": "run already succeeded",
    }
    with pytest.raises(CommandRejected, match="run already succeeded"):
        _await(sent, [theirs, rejected])


def test_an_event_read_back_otherwise_is_mine_once_the_processor_took_my_command() -> None:
    """No rejection of mine and the group's offset past my command: the only RunAccepted is
    mine even if its input reads back differently (a float for an integer past 2^64)."""
    answer = _await(
        _sent("StartRun", {**START, "input": {"n": 1}}), [_accepted({"n": 1.0000001})], committed=8
    )
    assert (answer.outcome, answer.event_type) == ("accepted", "RunAccepted")
    # resume: RunResumed carries my reason (cut to 1,000 characters)
    long = "x" * 1500
    assert same_content(_sent("ResumeRun", {"reason": long}), {"type": "RunResumed", "reason": long[:1000]})
    assert not same_content(
        _sent("ResumeRun", {"reason": "mine"}), {"type": "RunResumed", "reason": "theirs"}
    )


def test_start_refuses_an_empty_run_id_instead_of_making_one_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/client.md: InvalidArgument for "an empty or unprintable run id", before anything is
    sent. `start(run_id="")` (a script's `--run-id "$ORDER_ID"` with the variable unset) made a
    new random id instead, so each retry started another run."""
    client = RunClient(KafkaSettings(bootstrap_servers="127.0.0.1:1"), timeout_s=0.1)
    monkeypatch.setattr(client.definitions, "require", lambda *a, **k: None)
    monkeypatch.setattr(client, "partition_of", lambda run_id: 0)
    sent: list[Any] = []

    def produce(*a: Any) -> tuple[int, int]:
        sent.append(a)
        return (0, 0)

    monkeypatch.setattr(client, "produce", produce)
    monkeypatch.setattr(
        client, "_reader", type("R", (), {"end_offset": lambda *a: 0, "close": lambda s: None})()
    )
    with pytest.raises(InvalidArgument, match="run_id must be a non-empty string"):
        client.start("one-step", {}, run_id="", answer_timeout=0)
    with pytest.raises(InvalidArgument, match="control character"):
        client.start("one-step", {}, run_id="a\nb", answer_timeout=0)
    assert sent == []
    assert client.start("one-step", {}, answer_timeout=0).startswith("run-")  # None: generated
    assert len(sent) == 1
    client._reader = None
    client.close()


def test_cli_refuses_an_input_file_that_is_not_utf8_in_one_line(tmp_path: Path) -> None:
    """docs/client.md: a usage error exits 2 with a one-line message; `--input @file` of a file
    that is not UTF-8 raised UnicodeDecodeError (a traceback, exit 1)."""
    bad = tmp_path / "input.json"
    bad.write_bytes(b'{"text": "\xff"}')
    with pytest.raises(typer.BadParameter, match="--input is not valid JSON"):
        parse_json_arg(f"@{bad}", "--input")
    good = tmp_path / "good.json"
    good.write_bytes('{"ключ": 18446744073709551615}'.encode())
    assert parse_json_arg(f"@{good}", "--input") == {"ключ": 2**64 - 1}
    result = CliRunner().invoke(
        runs_cli.runs_app, ["start", "one-step", "--input", f"@{bad}", "--bootstrap", "127.0.0.1:1"]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


class _SentOnly:
    """A client whose commands are written, not waited for (--no-wait)."""

    last_answer = None
    last_record_id = "rec-42"

    def __enter__(self) -> _SentOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def cancel(
        self,
        run_id: str,
        reason: str,
        answer_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        return None


def test_no_wait_json_has_the_documented_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/client.md: with --json, `{"ok", "run_id", "command", "record_id", "answer" ("accepted" |
    "unchanged" | "sent"), "event", "sequence", "detail"}`. The "sent" line had no record_id (the
    one id that finds the command's answer later), event, sequence or detail."""
    import orjson

    monkeypatch.setattr(runs_cli, "make_client", lambda *a, **k: _SentOnly())
    result = CliRunner().invoke(runs_cli.runs_app, ["cancel", "run-1", "--no-wait", "--json"])
    assert result.exit_code == 0, result.output
    line = orjson.loads(result.output.strip().splitlines()[-1])
    assert set(line) == {"ok", "run_id", "command", "record_id", "answer", "event", "sequence", "detail"}
    assert (line["answer"], line["record_id"], line["command"]) == ("sent", "rec-42", "CancelRun")
