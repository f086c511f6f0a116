"""Client pieces that need no broker: views, display folds, definition sources, CLI helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from processors.cli.common import (
    EXIT_BROKER,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REJECTED,
    EXIT_TIMEOUT,
    exit_code_for,
    parse_json_arg,
    parse_pairs,
)
from processors.client import (
    BrokerUnavailable,
    InvalidDefinition,
    RunfoldError,
    RunfoldTimeout,
    RunNotFound,
    RunRejected,
    UnknownDefinition,
)
from processors.client.definitions import load_source
from processors.client.progress import RunBoard, StepBoard
from processors.client.views import RunView, view_from_query, view_from_snapshot

USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "cost_micros": 5}
ONE_STEP = Path(__file__).resolve().parents[2] / "examples" / "definitions" / "one-step.yaml"


def ev(event_type: str, seq: int, **body: object) -> dict:
    return {
        "type": event_type,
        "run_id": "r",
        "sequence": seq,
        "ts_ms": 1000 + seq,
        "record_id": f"r{seq}",
        **body,
    }


def step(
    event_type: str, seq: int, node: str = "n", lineage: str = "", attempt: int = 1, **body: object
) -> dict:
    return ev(event_type, seq, node=node, lineage=lineage, attempt=attempt, dispatch_id="d", **body)


def test_views_from_snapshot_query_and_terminal_event() -> None:
    state = {
        "run_id": "r",
        "sequence": 7,
        "definition_id": "d",
        "revision": 2,
        "output": {"x": 1},
        "failure": None,
        "usage": {**USAGE, "steps": 3},
        "steps": {"a": {"status": "succeeded", "attempt": 1}},
    }
    snap = {
        "run_id": "r",
        "sequence": 7,
        "ts_ms": 5,
        "status": "succeeded",
        "definition_id": "d",
        "revision": 2,
        "state_digest": "abc",
        "state": state,
    }
    v = view_from_snapshot(snap)
    assert (v.status, v.sequence, v.definition_id, v.revision, v.output, v.usage, v.terminal) == (
        "succeeded",
        7,
        "d",
        2,
        {"x": 1},
        USAGE,
        True,
    )
    assert v.steps()["a"]["status"] == "succeeded" and "state" not in v.to_dict()
    assert view_from_snapshot(snap, with_state=False).state is None
    q = view_from_query(
        "r", {"run_id": "r", "partition": 0, "status": "waiting", "sequence": 7, "state": state}
    )
    assert (q.status, q.source, q.terminal) == ("waiting", "query", False)
    t = RunView.from_terminal_event(
        ev("RunFailed", 9, usage=USAGE, failure={"code": "Timeout", "message": "m"}), "d", 2
    )
    assert (t.status, t.failure["code"], t.definition_id, t.source) == ("failed", "Timeout", "d", "events")


def test_step_board_folds_retries_map_waits_budget_and_outcome() -> None:
    b = StepBoard("r")
    events = [
        ev("RunAccepted", 1, definition_id="d", revision=1),
        ev("RunStarted", 2, superstep=1),
        step("StepScheduled", 3, kind="action", superstep=1),
        step("StepStarted", 4, worker_id="w1"),
        step("StepFailed", 5, failure={"code": "ExecutionFailed", "message": "boom"}, usage=USAGE),
        step("StepRetryScheduled", 6, next_attempt=2, due_ms=9, timer_id="t"),
        step("StepScheduled", 7, attempt=2, kind="action", superstep=1),
        step("StepSucceeded", 8, attempt=2, output=1),
        step("StepScheduled", 9, node="m", lineage="10", kind="action", superstep=2),
        step("StepScheduled", 10, node="m", lineage="2", kind="action", superstep=2),
        ev("BudgetWarning", 11, dimension="max_steps", used=4, limit=5),
        ev("RunWaiting", 12, node="m", lineage="2", signal="approval"),
    ]
    for e in events:
        b.apply(e)
    assert b.status == "waiting" and b.definition == "d@1" and b.sequence == 12 and b.superstep == 2
    rows = b.rows()
    assert [r.label for r in rows] == ["n", "m[10]", "m[2]"]  # in the order they were scheduled
    n = rows[0]
    assert (n.status, n.attempt, n.worker, n.detail) == ("succeeded", 2, "w1", "")
    assert rows[-1].status == "waiting"
    assert any("max_steps 4/5" in note for note in b.notes)
    b.apply(ev("RunSucceeded", 13, output={"ok": 1}, usage=USAGE))
    assert (b.status, b.output, b.usage) == ("succeeded", {"ok": 1}, USAGE)


def test_run_board_counts_statuses_retries_and_rejections() -> None:
    board = RunBoard()
    for e in [
        ev("RunAccepted", 1, definition_id="d", revision=1),
        ev("RunStarted", 2),
        step("StepRetryScheduled", 3, next_attempt=2, due_ms=1, timer_id="t"),
        step("StepSucceeded", 4),
        ev("RunSucceeded", 5, usage=USAGE),
    ]:
        board.apply(e)
    board.apply({**ev("RunRejected", 0, code="InvalidInput", reason="bad"), "run_id": "x"})
    assert board.counts() == {"succeeded": 1, "rejected": 1}
    r = board.runs["r"]
    assert (r["definition"], r["retries"], r["steps_done"], r["usage"]) == ("d", 1, 1, USAGE)


def test_definition_sources_and_invalid_ones(tmp_path: Path) -> None:
    name, raw = load_source(ONE_STEP)
    assert name == str(ONE_STEP) and raw["id"] == "one-step"
    assert load_source(str(ONE_STEP))[1] == raw
    assert load_source({"id": "x", "revision": 2})[0] == "definition x@2"
    assert load_source(ONE_STEP.read_text())[1] == raw  # YAML text
    bad = tmp_path / "dup.yaml"
    bad.write_text("id: a\nid: b\n")
    with pytest.raises(InvalidDefinition, match=r"dup\.yaml.*duplicate key.*\[syntax\]"):
        load_source(bad)
    with pytest.raises(InvalidDefinition, match=r"missing\.yaml.*cannot read.*\[io\]"):
        load_source(tmp_path / "missing.yaml")


def test_cli_helpers_and_exit_codes(tmp_path: Path) -> None:
    assert parse_pairs(["a=1", "b=x=y"], "--label") == {"a": "1", "b": "x=y"}
    assert parse_pairs(["max_steps=5"], "--budget", as_int=True) == {"max_steps": 5}
    with pytest.raises(typer.BadParameter, match="key=value"):
        parse_pairs(["oops"], "--label")
    with pytest.raises(typer.BadParameter, match="integer"):
        parse_pairs(["max_steps=many"], "--budget", as_int=True)
    f = tmp_path / "in.json"
    f.write_text('{"topic": "kafka"}')
    assert parse_json_arg(f"@{f}", "--input") == {"topic": "kafka"}
    assert parse_json_arg(None, "--input") is None
    with pytest.raises(typer.BadParameter, match="not valid JSON"):
        parse_json_arg("{nope", "--input")
    assert exit_code_for(BrokerUnavailable("x")) == EXIT_BROKER
    assert exit_code_for(UnknownDefinition("d", None)) == EXIT_NOT_FOUND
    assert exit_code_for(RunNotFound("x")) == EXIT_NOT_FOUND
    assert exit_code_for(RunfoldTimeout("x")) == EXIT_TIMEOUT
    assert exit_code_for(RunRejected("r", "InvalidInput", "bad")) == EXIT_REJECTED
    assert exit_code_for(RunfoldError("x")) == EXIT_FAILED


def test_error_messages_say_what_and_where() -> None:
    assert (
        str(UnknownDefinition("d", 3, [1, 2]))
        == "definition 'd' revision 3 is not registered (registered revisions: 1, 2)"
    )
    err = RunRejected("r-1", "InvalidInput", "input.topic: is required")
    assert (err.run_id, err.code) == ("r-1", "InvalidInput") and "r-1" in str(err)


class _Delivered:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class _ScriptedProducer:
    """A librdkafka producer whose first instance never reports a delivery (the stuck-handle
    case), and whose later ones acknowledge each record at once."""

    made: list[_ScriptedProducer] = []

    def __init__(self, config: dict) -> None:
        self.stuck = not _ScriptedProducer.made
        self.callbacks: list = []
        _ScriptedProducer.made.append(self)

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery) -> None:
        self.callbacks.append(on_delivery)

    def poll(self, timeout: float) -> int:
        if self.stuck:
            return 0
        for cb in self.callbacks:
            cb(None, _Delivered(len(self.callbacks) - 1))
        self.callbacks.clear()
        return 1

    def flush(self, timeout: float) -> int:
        return len(self.callbacks)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(KafkaError._TRANSPORT))  # as no broker at 127.0.0.1:1 would


def test_a_send_that_gets_no_answer_leaves_its_producer_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from processors.client import RunClient
    from processors.client import client as client_module
    from topology.settings import KafkaSettings

    _ScriptedProducer.made = []
    monkeypatch.setattr(client_module, "Producer", _ScriptedProducer)
    monkeypatch.setattr(client_module, "_STUCK_GRACE_S", 0.2)
    client = RunClient(KafkaSettings(bootstrap_servers="127.0.0.1:1"), timeout_s=0.1)
    with pytest.raises(RunfoldTimeout, match="may still be written; the next call uses a new connection"):
        client.produce("t", "run-1", b"v")
    assert client._producer is None  # the stuck one is let go (destroyed off the caller's thread)
    assert client.produce("t", "run-1", b"v") == (0, 0)  # a new producer, not the stuck one
    assert len(_ScriptedProducer.made) == 2 and client._producer is _ScriptedProducer.made[1]
    assert _ScriptedProducer.made[0].callbacks  # its record was never answered
    client.close()


def test_a_command_for_a_run_id_with_a_control_character_is_refused_before_it_is_sent() -> None:
    from processors.client import RunClient
    from topology.settings import KafkaSettings

    client = RunClient(KafkaSettings(bootstrap_servers="127.0.0.1:1"), timeout_s=0.1)
    with pytest.raises(ValueError, match=r"printable text; it contains the control character '\\x1f'"):
        client.cancel("a\x1fb")
    assert client._producer is None  # nothing was produced, no connection made
    client.close()
