"""Schema evolution through the fingerprint lookup: old reader <-> new writer, both ways."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas import Codec, DecodeError
from schemas.contract import SCHEMA_DIR, load_contract

TS = 1_764_400_000_000
START = {
    "type": "StartRun",
    "run_id": "r-1",
    "record_id": "rec-1",
    "ts_ms": TS,
    "definition_id": "d",
    "revision": 2,
    "input": {"topic": "kafka"},
    "parent": None,
    "bundle": None,
    "budgets": None,
    "labels": {"a": "b"},
}


def newer_commands_schema() -> dict[str, Any]:
    """v1 plus compatible changes: an optional envelope field, an optional StartRun field, a new branch."""
    schema = copy.deepcopy(load_contract()["commands"])
    fields = schema["fields"]
    fields.insert(len(fields) - 1, {"name": "trace_id", "type": ["null", "string"], "default": None})
    branches = fields[-1]["type"]
    start = next(b for b in branches if b["name"] == "StartRun")
    start["fields"].append({"name": "priority", "type": ["null", "int"], "default": None})
    branches.append(
        {
            "type": "record",
            "name": "PauseRun",
            "namespace": "runfold",
            "fields": [{"name": "reason", "type": "string", "default": ""}],
        }
    )
    return schema


@pytest.fixture(scope="module")
def v2() -> dict[str, Any]:
    return newer_commands_schema()


def test_old_reader_reads_newer_writer_ignoring_added_fields(v2: dict[str, Any]) -> None:
    new_writer = Codec(schemas={**load_contract(), "commands": v2}, history=[])
    old_reader = Codec(history=[])
    data = new_writer.encode("commands", {**START, "priority": 5, "trace_id": "t-1"})
    assert data[2:10] != old_reader.fingerprint("commands")
    with pytest.raises(DecodeError, match="unknown writer schema fingerprint"):
        old_reader.decode("commands", data)  # not yet told about the newer schema
    old_reader.add_writer_schema("commands", v2)
    assert old_reader.decode("commands", data) == START


def test_new_reader_reads_old_writer_with_defaults(v2: dict[str, Any]) -> None:
    old_writer = Codec(history=[])
    new_reader = Codec(
        schemas={**load_contract(), "commands": v2}, history=[("commands", load_contract()["commands"])]
    )
    got = new_reader.decode("commands", old_writer.encode("commands", START))
    assert got == {**START, "priority": None, "trace_id": None}
    # and the new reader still reads its own records
    own = {**START, "priority": 1, "trace_id": "t"}
    assert new_reader.decode("commands", new_reader.encode("commands", own)) == own


def test_old_reader_rejects_a_branch_it_does_not_know(v2: dict[str, Any]) -> None:
    new_writer = Codec(schemas={**load_contract(), "commands": v2}, history=[])
    old_reader = Codec(history=[("commands", v2)])
    data = new_writer.encode("commands", {"type": "PauseRun", "run_id": "r", "record_id": "x", "ts_ms": 1})
    with pytest.raises(DecodeError, match="not readable with the current reader schema"):
        old_reader.decode("commands", data)
    cancel = {
        "type": "CancelRun",
        "run_id": "r",
        "record_id": "x",
        "ts_ms": 1,
        "reason": "stop",
        "idempotency_key": None,
    }
    assert old_reader.decode("commands", new_writer.encode("commands", cancel)) == cancel


def test_history_directory_registers_old_writer_schemas(tmp_path: Path) -> None:
    """A current schema dir whose StartRun gained `priority`; the previous schema kept in history/."""
    for avsc in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(avsc, tmp_path)
    current = orjson.loads((tmp_path / "runfold.CommandEnvelope.avsc").read_bytes())
    start = next(b for b in current["fields"][-1]["type"] if b["name"] == "StartRun")
    start["fields"].append({"name": "priority", "type": ["null", "int"], "default": None})
    (tmp_path / "runfold.CommandEnvelope.avsc").write_bytes(orjson.dumps(current))
    (tmp_path / "history" / "commands").mkdir(parents=True)
    (tmp_path / "history" / "commands" / "v1.avsc").write_bytes(orjson.dumps(load_contract()["commands"]))

    new_reader = Codec(schema_dir=tmp_path)
    old_bytes = Codec(history=[]).encode("commands", START)
    assert new_reader.decode("commands", old_bytes) == {**START, "priority": None}


# The writer schemas replaced by the stopping phase (issue 27) and by agent loops (issue 25:
# AgentSpec.tools/messages), kept in schemas/history/.
V1_FINGERPRINTS = {
    "run_events": "aa225c37072e13b6",
    "receipts": "08513f8e0ee0dabc",
    "activations": "199fd866e4f4405f",
}
# ... and by idempotent commands (issue 44: the commands' idempotency_key; run events carrying it,
# and CommandDeduplicated)
V2_FINGERPRINTS = {"commands/v1": "a603db8dbef79e61", "run_events/v2": "ebcb920fa2804fb3"}


def test_the_kept_schemas_are_the_ones_on_the_wire_before_each_change() -> None:
    from schemas.contract import fingerprint64

    kept = {
        f"{path.parent.name}/{path.stem}": fingerprint64(orjson.loads(path.read_bytes())).hex()
        for path in sorted((SCHEMA_DIR / "history").glob("*/*.avsc"))
    }
    assert kept == {
        **{f"{kind}/v1": fp for kind, fp in V1_FINGERPRINTS.items()},
        **V2_FINGERPRINTS,
    }


def test_commands_and_events_written_before_idempotency_keys_decode_without_a_key() -> None:
    """A command of a producer that predates issue 44 has no idempotency_key: it decodes with
    null (its record_id is the key); an event written before has none either."""
    old = {
        "commands": orjson.loads((SCHEMA_DIR / "history" / "commands" / "v1.avsc").read_bytes()),
        "run_events": orjson.loads((SCHEMA_DIR / "history" / "run_events" / "v2.avsc").read_bytes()),
    }
    old_writer = Codec(schemas={**load_contract(), **old}, history=[])
    reader = Codec()
    signal = {
        "type": "SignalRun",
        "run_id": "r",
        "record_id": "x",
        "ts_ms": TS,
        "signal": "go",
        "payload": {"ok": True},
    }
    assert reader.decode("commands", old_writer.encode("commands", signal)) == {
        **signal,
        "idempotency_key": None,
    }
    received = {
        "type": "SignalReceived",
        "run_id": "r",
        "record_id": "r:4",
        "ts_ms": TS,
        "sequence": 4,
        "signal": "go",
        "payload": {"ok": True},
        "node": "w",
    }
    got = reader.decode("run_events", old_writer.encode("run_events", received))
    assert got == {**received, "idempotency_key": None}


def test_a_reader_that_predates_idempotency_keys_reads_keyed_records_but_not_the_new_event() -> None:
    """An old reader told the new writer schema (docs/contract.md, Schema evolution) ignores the
    key; CommandDeduplicated is a branch it does not know."""
    old = {
        "commands": orjson.loads((SCHEMA_DIR / "history" / "commands" / "v1.avsc").read_bytes()),
        "run_events": orjson.loads((SCHEMA_DIR / "history" / "run_events" / "v2.avsc").read_bytes()),
    }
    old_reader = Codec(schemas={**load_contract(), **old}, history=list(load_contract().items()))
    new_writer = Codec(history=[])
    cancel = {"type": "CancelRun", "run_id": "r", "record_id": "x", "ts_ms": TS, "reason": "stop"}
    data = new_writer.encode("commands", {**cancel, "idempotency_key": "k-1"})
    assert old_reader.decode("commands", data) == cancel
    duplicate = {
        "type": "CommandDeduplicated",
        "run_id": "r",
        "record_id": "r:duplicate:x",
        "ts_ms": TS,
        "sequence": 0,
        "command_type": "CancelRun",
        "idempotency_key": "k-1",
        "answer_sequence": 7,
        "answer_type": "RunCancelled",
    }
    with pytest.raises(DecodeError, match="not readable with the current reader schema"):
        old_reader.decode("run_events", new_writer.encode("run_events", duplicate))


def test_records_written_before_the_stopping_phase_decode_with_its_defaults() -> None:
    history = dict(
        (kind, orjson.loads((SCHEMA_DIR / "history" / kind / "v1.avsc").read_bytes()))
        for kind in V1_FINGERPRINTS
    )
    old_writer = Codec(schemas={**load_contract(), **history}, history=[])
    reader = Codec()  # the current schemas plus history/
    cancelled = {
        "type": "ActivationCancelled",
        "run_id": "r",
        "record_id": "x",
        "ts_ms": TS,
        "node": "a",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d",
        "worker_id": "w",
        "reason": "stop",
    }
    # an executor that predates `confirmed` sent ActivationCancelled only once its handler stopped
    assert reader.decode("receipts", old_writer.encode("receipts", cancelled)) == {
        **cancelled,
        "confirmed": True,
    }
    step = {"node": "a", "lineage": "", "attempt": 1, "dispatch_id": "d"}
    event = {"type": "StepCancelled", "run_id": "r", "record_id": "r:3", "ts_ms": TS, "sequence": 3, **step}
    got = reader.decode("run_events", old_writer.encode("run_events", {**event, "reason": "why"}))
    assert got["stop"] is None and got["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_micros": 0,
    }
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
    ended = {"type": "RunCancelled", "run_id": "r", "record_id": "r:4", "ts_ms": TS, "sequence": 4}
    got = reader.decode(
        "run_events", old_writer.encode("run_events", {**ended, "reason": "why", "usage": usage})
    )
    assert got["stops"] == []


def test_an_old_reader_reads_the_new_fields_of_known_messages_once_told_the_schema() -> None:
    """Old readers keep working: the added fields are ignored; only the two new event types are
    branches an old reader cannot read (docs/contract.md, Schema evolution)."""
    history = {
        kind: orjson.loads((SCHEMA_DIR / "history" / kind / "v1.avsc").read_bytes())
        for kind in V1_FINGERPRINTS
    }
    old_reader = Codec(schemas={**load_contract(), **history}, history=list(load_contract().items()))
    new_writer = Codec(history=[])
    usage = {"prompt_tokens": 1, "completion_tokens": 0, "cost_micros": 0}
    ended = {"type": "RunCancelled", "run_id": "r", "record_id": "r:4", "ts_ms": TS, "sequence": 4}
    stops = [{"node": "a", "lineage": "", "attempt": 1, "stop": "confirmed"}]
    data = new_writer.encode("run_events", {**ended, "reason": "why", "usage": usage, "stops": stops})
    assert old_reader.decode("run_events", data) == {**ended, "reason": "why", "usage": usage}


def test_activations_written_before_agent_loops_decode_without_tools() -> None:
    old = orjson.loads((SCHEMA_DIR / "history" / "activations" / "v1.avsc").read_bytes())
    old_writer = Codec(schemas={**load_contract(), "activations": old}, history=[])
    spec = {"agent": "a", "model": "m", "prompt": "p", "output_schema": None, "structured_output_attempts": 1}
    activation = {
        "type": "ActionActivation",
        "run_id": "r",
        "record_id": "x",
        "ts_ms": TS,
        "node": "a",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d",
        "definition_id": "wf",
        "root_run_id": "r",
        "kind": "agent",
        "action": "a",
        "queue": "agents",
        "input": {},
        "deadline_ms": None,
        "lease_ms": 1000,
        "heartbeat_ms": 100,
        "capabilities": [],
        "agent": spec,
    }
    decoded = Codec().decode("activations", old_writer.encode("activations", activation))
    assert decoded["agent"] == {**spec, "tools": None, "messages": None}  # a one-call agent step
