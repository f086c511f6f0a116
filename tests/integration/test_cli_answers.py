"""Commands answer where they are typed: `runfold runs start|signal|cancel|resume` and the SDK
wait for the processor's answer to that command (matched on its record id) against a real
broker and processor, with the exit codes and messages asserted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running
from test_cli import APPROVAL, Cli

from processors.client import RunClient, RunRejected
from processors.client.errors import AnswerTimeout, CommandRejected
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STRICT = """schema: runfold.workflow/v1
id: strict
revision: 1
input_schema: {type: object, required: [topic], properties: {topic: {type: string}}}
entry: [a]
nodes: {a: {kind: action, action: echo}}
"""


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


@pytest.fixture
def cli(settings: ProcessorSettings, tmp_path: Path) -> Cli:
    c = Cli(settings)
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "approval.yaml").write_text(APPROVAL)
    (tmp_path / "defs" / "strict.yaml").write_text(STRICT)
    c("defs", "register", "examples/definitions/one-step.yaml", str(tmp_path / "defs"))
    return c


@pytest.fixture
def system(settings: ProcessorSettings, cli: Cli) -> Iterator[None]:
    with running(settings), WorkerThread(Worker(name="answers-test"), settings):
        yield


def test_rejected_commands_exit_6_with_code_and_reason(cli: Cli, system: None) -> None:
    # a start whose input fails the definition's schema: rejected at once, not "started"
    bad = cli("runs", "start", "strict", "--input", '{"no_topic": 1}', "--run-id", "bad-1", code=6)
    assert "started" not in bad.stdout
    assert "StartRun to run 'bad-1' rejected: InvalidInput" in bad.stderr and "topic" in bad.stderr
    as_json = cli.json("runs", "start", "strict", "--input", "{}", "--run-id", "bad-2", code=6)
    assert (as_json["ok"], as_json["code"], as_json["command"], as_json["run_id"]) == (
        False,
        "InvalidInput",
        "StartRun",
        "bad-2",
    )
    assert as_json["error_type"] == "CommandRejected" and "topic" in as_json["reason"]
    # get shows the rejection (not "not found"); watch shows it and ends at once
    got = cli.json("runs", "get", "bad-1")
    assert got["status"] == "rejected" and got["failure"]["code"] == "InvalidInput"
    t0 = time.monotonic()
    watched = cli.json("runs", "watch", "bad-1", "--timeout", "60", code=6)
    assert watched["type"] == "RunRejected" and time.monotonic() - t0 < 20
    piped = cli("runs", "watch", "bad-1", "--timeout", "60", code=6)  # not a terminal: lines, then the table
    assert "RunRejected" in piped.stdout and "InvalidInput" in piped.stdout
    # signal to an unknown run: NotFound
    unknown = cli("runs", "signal", "no-such-run", "approval", "--payload", "{}", code=6)
    assert "SignalRun to run 'no-such-run' rejected: NotFound" in unknown.stderr
    # a waiting run: resume is refused (Conflict); an unknown signal name too
    waiting = cli.json("runs", "start", "approval")
    assert waiting["answer"] == "accepted" and waiting["event"] == "RunAccepted" and waiting["sequence"] == 1
    rid = waiting["run_id"]
    resumed = cli.json("runs", "resume", rid, code=6)
    assert resumed["code"] == "Conflict" and "only a paused or failed run resumes" in resumed["reason"]
    assert "ResumeRun to run" in cli("runs", "resume", rid, code=6).stderr
    assert cli.json("runs", "signal", rid, "nope", code=6)["code"] == "InvalidInput"
    # the signal it waits for is taken; then the finished run refuses another
    approve = (
        "runs",
        "signal",
        rid,
        "approval",
        "--payload",
        '{"approved": true}',
        "--idempotency-key",
        "ok-1",
    )
    took = cli.json(*approve)
    assert took["answer"] == "accepted" and took["event"] == "SignalReceived"
    assert cli.json("runs", "watch", rid, "--timeout", "30")[-1]["type"] == "RunSucceeded"
    # the same signal again with its key (a retry): its first answer, not a Conflict
    again = cli.json(*approve)
    assert (again["answer"], again["event"], again["sequence"]) == (
        "accepted",
        "SignalReceived",
        took["sequence"],
    )
    late = cli("runs", "signal", rid, "approval", "--payload", "{}", code=6)
    assert "Conflict" in late.stderr and "run already succeeded" in late.stderr
    assert cli.json("runs", "cancel", rid, code=6)["reason"] == "run already succeeded"


def test_cancel_twice_and_a_duplicate_start_answer_unchanged(cli: Cli, system: None) -> None:
    started = cli("runs", "start", "approval", "--run-id", "twice")
    assert "started twice" in started.stdout and "RunAccepted" in started.stdout
    again = cli.json("runs", "start", "approval", "--run-id", "twice")
    assert again["ok"] and again["answer"] == "unchanged" and again["event"] is None
    first = cli.json("runs", "cancel", "twice", "--reason", "no")
    assert first["answer"] == "accepted" and first["event"] == "RunCancelled"
    second = cli("runs", "cancel", "twice")
    assert "nothing to do" in second.stdout and "already cancelled" in second.stdout


def test_no_processor_no_answer_exits_5_within_the_wait(cli: Cli) -> None:
    t0 = time.monotonic()
    out = cli("runs", "start", "one-step", "--input", '{"text": "x"}', "--answer-timeout", "2", code=5)
    took = time.monotonic() - t0
    assert "no answer came within 2s" in out.stderr and "is a processor running" in out.stderr
    assert took < 15, took
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # one line, never wrapped
    sent = cli.json("runs", "start", "one-step", "--input", '{"text": "x"}', "--no-wait")
    assert sent["ok"] and sent["answer"] == "sent"


def test_sdk_raises_typed_errors(settings: ProcessorSettings, cli: Cli) -> None:
    with RunClient(settings, timeout_s=10, answer_timeout_s=2) as client:
        with pytest.raises(AnswerTimeout) as late:
            client.start("one-step", {"text": "x"}, run_id="sdk-late")
        assert late.value.command == "StartRun" and late.value.run_id == "sdk-late"
        assert client.start("one-step", {"text": "y"}, answer_timeout=0)  # fire and forget
        with running(settings):
            with pytest.raises(CommandRejected) as err:
                client.start("strict", {"no_topic": 1}, run_id="sdk-bad")
            assert isinstance(err.value, RunRejected)
            assert (err.value.code, err.value.command, err.value.run_id) == (
                "InvalidInput",
                "StartRun",
                "sdk-bad",
            )
            assert err.value.record_id and "topic" in err.value.reason
            rid = client.start("approval", {})
            assert client.last_answer is not None and client.last_answer.outcome == "accepted"
            with pytest.raises(CommandRejected, match="Conflict"):
                client.resume(rid)
            answer = client.cancel(rid)
            assert answer is not None and answer.event_type == "RunCancelled"
            assert client.cancel(rid).outcome == "unchanged"  # type: ignore[union-attr]
            with pytest.raises(CommandRejected, match="NotFound"):
                client.signal("sdk-nobody", "approval", {})


def test_runs_list_title_counts_what_it_shows(cli: Cli, system: None) -> None:
    for i in range(4):
        cli("runs", "start", "approval", "--run-id", f"listed-{i}")  # answered: its snapshot is written
    out = cli("runs", "list", "--limit", "3").stdout
    assert "3 shown of 4" in out and out.count("listed-") == 3, out
    assert "0 shown of 4, 0 matching" in cli("runs", "list", "--limit", "3", "--status", "cancelled").stdout
