"""Adversarial review: docs/messages.md and docs/contract.md against the schema files, the codec,
the engine's vocabulary and what the engine emits (no broker). Each test quotes the promise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from engine_harness import RunHarness, definition

from processors.engine import dump_state, evolve
from processors.engine.evolve import EVENT_TYPES
from processors.engine.ids import child_run_id, dispatch_id
from processors.engine.vocabulary import (
    ACTIVATION_MESSAGES,
    CHILD_MESSAGES,
    COMMANDS,
    FAILURE_CODES,
    RECEIPTS,
    RUN_STATUSES,
    STEP_STATUSES,
    STOP_CAUSES,
    STOP_HOWS,
)
from processors.kafka.partitioning import PartitionOwners, murmur2, partition_for
from schemas import TOPIC_KINDS, Codec, DecodeError, EncodeError
from schemas.contract import STANDALONE_DIR, TOPIC_RECORDS, fingerprint64, load_contract, read_history

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = (ROOT / "docs" / "messages.md").read_text(encoding="utf-8")
CONTRACT = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
CODEC = Codec()
TS = 1_764_400_000_000
DOC_TOPIC = {  # contract.md's topic names -> codec topic kinds
    "commands": "commands",
    "receipts": "receipts",
    "activations": "activations",
    "child-activations": "child_activations",
    "run-events": "run_events",
    "run-state": "run_state",
    "definitions": "definitions",
    "dead-letters": "dead_letters",
}


# ----------------------------------------------------------------------------- helpers


def zigzag(n: int) -> bytes:
    """Avro int/long: zig-zag, then base-128 varint (Avro spec, written from the spec alone)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def avro_str(s: str) -> bytes:
    data = s.encode()
    return zigzag(len(data)) + data


def read_long(buf: bytes, pos: int) -> tuple[int, int]:
    shift = z = 0
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), pos


def read_str(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = read_long(buf, pos)
    return buf[pos : pos + n].decode(), pos + n


def doc_fingerprints() -> dict[str, str]:
    """contract.md, "Framing": the fingerprint table (topic -> hex of the 8 bytes on the wire)."""
    section = CONTRACT.split("## Framing", 1)[1].split("With Schema Registry", 1)[0]
    rows = re.findall(r"^\| ([a-z-]+) \| `([0-9a-f]{16})` \|$", section, flags=re.M)
    return {DOC_TOPIC[topic]: fp for topic, fp in rows}


def type_text(t: Any) -> str:
    """A schema type in messages.md's notation (json, ?T, map<T>, array<T>, record short names)."""
    if isinstance(t, str):
        return t.rpartition(".")[2]
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        assert len(rest) == 1, t
        return ("?" if "null" in t else "") + type_text(rest[0])
    kind = t["type"]
    if t.get("logicalType") == "json":
        return "json"
    if kind in ("record", "error", "enum", "fixed"):
        return str(t["name"]).rpartition(".")[2]
    if kind == "array":
        return f"array<{type_text(t['items'])}>"
    if kind == "map":
        return f"map<{type_text(t['values'])}>"
    return type_text(kind)


def schema_records() -> dict[str, dict[str, Any]]:
    """Every named record defined in the standalone schemas, by short name."""
    out: dict[str, dict[str, Any]] = {}

    def walk(t: Any) -> None:
        if isinstance(t, list):
            for b in t:
                walk(b)
        elif isinstance(t, dict):
            if t.get("type") in ("record", "error"):
                out.setdefault(t["name"].rpartition(".")[2], t)
                for f in t["fields"]:
                    walk(f["type"])
            elif t.get("type") == "array":
                walk(t["items"])
            elif t.get("type") == "map":
                walk(t["values"])
            elif isinstance(t.get("type"), (dict, list)):
                walk(t["type"])

    for schema in load_contract().values():
        walk(schema)
    return out


STEP_IDENTITY = ["node: string", "lineage: string", "attempt: int", "dispatch_id: string"]


def split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<{[(":
            depth += 1
        elif ch in ">}])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def doc_fields(text: str) -> list[tuple[str, str, str | None]]:
    """(name, type, default) of every `name: type [= default]` in a doc table cell or braces."""
    out: list[tuple[str, str, str | None]] = []
    if "step identity" in text:
        text = ", ".join(f"`{f}`" for f in STEP_IDENTITY) + ", " + text
    for seg in re.findall(r"`([^`]*)`", text):
        for piece in split_top(seg):
            m = re.fullmatch(r"([a-z_]+): ([A-Za-z?<>]+)(?: = (.+))?", piece.strip())
            if m:
                out.append((m.group(1), m.group(2), m.group(3)))
    return out


def documented_messages() -> dict[str, list[tuple[str, str, str | None]]]:
    """Record name -> its documented fields, from messages.md's tables and `Name {...}` bullets."""
    docs: dict[str, list[tuple[str, str, str | None]]] = {}
    for name, cell in re.findall(r"^\| ([A-Z][A-Za-z]+) \| (.+) \|$", MESSAGES, flags=re.M):
        if name not in ("StartRun",) or "definition_id" in cell:
            docs[name] = doc_fields(cell)
    for name, body in re.findall(r"`([A-Z][A-Za-z]+) \{([^}]*)\}`", MESSAGES):
        docs[name] = doc_fields("`" + body + "`")
    for name, body in re.findall(r"^- `([A-Z][A-Za-z]+) \{(.*?)\}`", MESSAGES, flags=re.M | re.S):
        docs[name] = doc_fields("`" + body.replace("\n", " ") + "`")
    return docs


def strip_attributes(t: Any) -> Any:
    """The schema without doc, default and logicalType attributes (a json field: plain string)."""
    if isinstance(t, list):
        return [strip_attributes(b) for b in t]
    if isinstance(t, dict):
        if t.get("logicalType") == "json":
            return "string"
        return {k: strip_attributes(v) for k, v in t.items() if k not in ("doc", "default", "logicalType")}
    return t


def assert_subset(sent: Any, got: Any) -> None:
    """`got` holds everything `sent` held (decoding adds omitted optional fields, never changes one)."""
    if isinstance(sent, dict) and isinstance(got, dict):
        for key, value in sent.items():
            assert key in got, key
            assert_subset(value, got[key])
    else:
        assert sent == got


DEFAULT_TEXT = {"{}": {}, '""': "", "0": 0, "false": False, "true": True, "null": None}


# ------------------------------------------------------------------ fingerprints and framing


def test_documented_fingerprint_table_is_what_the_codec_writes() -> None:
    """docs/contract.md, "Framing: how a value is laid out": "The fingerprints of the current
    schemas, as the 8 bytes on the wire in hex" (one row per topic)."""
    documented = doc_fingerprints()
    assert set(documented) == set(TOPIC_KINDS)
    on_wire = {kind: CODEC.fingerprint(kind).hex() for kind in TOPIC_KINDS}
    standalone = {
        kind: fingerprint64(orjson.loads((STANDALONE_DIR / f"{TOPIC_RECORDS[kind]}.avsc").read_bytes())).hex()
        for kind in TOPIC_KINDS
    }
    assert on_wire == standalone
    wrong = {k: (documented[k], on_wire[k]) for k in TOPIC_KINDS if documented[k] != on_wire[k]}
    assert not wrong, f"doc fingerprint != wire fingerprint (doc, wire): {wrong}"


def test_a_receipt_framed_by_the_doc_with_the_standalone_schema_is_read() -> None:
    """docs/contract.md, "Framing" and "The schema files": a value is `C3 01 | 8 bytes:
    CRC-64-AVRO fingerprint ... | Avro binary body`, with the fingerprint from the table;
    `schemas/standalone/` "Start from these". An executor following both writes an
    ActivationCancelled (union branch 4) with `confirmed: false`: it must be read as written."""
    body = (
        zigzag(1)  # schema_version
        + avro_str("rec-1")
        + avro_str("r-1")
        + zigzag(TS)
        + zigzag(4)  # ActivationCancelled
        + avro_str("n")
        + avro_str("")
        + zigzag(1)
        + avro_str("ab" * 16)
        + avro_str("w1")
        + avro_str("stop")
        + b"\x00"  # confirmed: false
    )
    data = b"\xc3\x01" + bytes.fromhex(doc_fingerprints()["receipts"]) + body
    try:
        got = CODEC.decode("receipts", data)
    except DecodeError as exc:
        pytest.fail(f"dead-lettered: {exc}")
    assert got["type"] == "ActivationCancelled"
    assert got["confirmed"] is False


def test_a_command_built_by_hand_from_the_doc_decodes() -> None:
    """docs/contract.md, "Framing": `C3 01 | 8 bytes: CRC-64-AVRO fingerprint of the writer
    schema, little-endian | Avro binary body`; "What a producer fills": schema_version 1,
    record_id, run_id, ts_ms (milliseconds), body (CancelRun: reason, idempotency_key: null)."""
    body = zigzag(1) + avro_str("rec-1") + avro_str("r-é") + zigzag(TS) + zigzag(1) + avro_str("stop")
    body += zigzag(0)  # the union's null branch
    data = b"\xc3\x01" + bytes.fromhex(doc_fingerprints()["commands"]) + body
    assert CODEC.decode("commands", data) == {
        "type": "CancelRun",
        "run_id": "r-é",
        "record_id": "rec-1",
        "ts_ms": TS,
        "reason": "stop",
        "idempotency_key": None,
    }


@pytest.mark.parametrize(
    ("kind", "msg", "index", "tail"),
    [
        ("commands", {"type": "SignalRun", "signal": "go", "payload": {"a": 1}}, 2, ["go", '{"a":1}', 0]),
        ("run_events", {"type": "RunStarted", "superstep": 7, "sequence": 2}, 2, [7]),
    ],
)
def test_a_codec_record_parses_by_hand_as_the_doc_describes(
    kind: str, msg: dict[str, Any], index: int, tail: list[Any]
) -> None:
    """docs/contract.md, "Framing": `C3 01 | fingerprint (the table's 8 bytes) | Avro binary
    body`; messages.md "Envelopes": schema_version, record_id, run_id, ts_ms, (run events:
    sequence), body."""
    data = CODEC.encode(kind, {"run_id": "r-1", "record_id": "x", "ts_ms": TS, **msg})
    assert data[:2] == b"\xc3\x01"
    assert data[2:10].hex() == doc_fingerprints()[kind]
    pos = 10
    version, pos = read_long(data, pos)
    record_id, pos = read_str(data, pos)
    run_id, pos = read_str(data, pos)
    ts_ms, pos = read_long(data, pos)
    assert (version, record_id, run_id, ts_ms) == (1, "x", "r-1", TS)
    if kind == "run_events":
        sequence, pos = read_long(data, pos)
        assert sequence == msg["sequence"]
    branch, pos = read_long(data, pos)
    assert branch == index
    for expected in tail:
        value: Any
        value, pos = read_long(data, pos) if isinstance(expected, int) else read_str(data, pos)
        assert value == expected
    assert pos == len(data)


def test_standalone_files_are_the_codec_schemas_and_fingerprint_ignores_doc_default_logical_type() -> None:
    """docs/contract.md, "The schema files": one self-contained file per topic "which parses
    alone ... and gives the fingerprint above"; "The Parsing Canonical Form drops doc, default
    and logicalType, so the fingerprint depends on neither"."""
    for kind in TOPIC_KINDS:
        on_disk = orjson.loads((STANDALONE_DIR / f"{TOPIC_RECORDS[kind]}.avsc").read_bytes())
        assert on_disk == CODEC.schema(kind)
        stripped = strip_attributes(on_disk)
        assert b"logicalType" not in orjson.dumps(stripped) and b'"default"' not in orjson.dumps(stripped)
        assert fingerprint64(stripped) == CODEC.fingerprint(kind)


def test_the_five_envelopes_reference_exactly_the_documented_shared_types() -> None:
    """docs/contract.md, "The schema files": "CommandEnvelope and ChildActivationEnvelope use
    ParentRef, ActivationEnvelope uses AgentSpec, ReceiptEnvelope uses Failure and Usage,
    RunEventEnvelope uses Failure, ParentRef and Usage"; the four shared types "reference nothing"."""
    shared = {"runfold.Usage", "runfold.Failure", "runfold.ParentRef", "runfold.AgentSpec"}
    root = ROOT / "schemas"
    uses: dict[str, set[str]] = {}
    for path in root.glob("runfold.*.avsc"):
        text = path.read_text()
        uses[path.stem] = {s for s in shared if f'"{s}"' in text or f'"{s.split(".")[1]}"' in text} - {
            path.stem
        }
    assert uses["runfold.CommandEnvelope"] == {"runfold.ParentRef"}
    assert uses["runfold.ChildActivationEnvelope"] == {"runfold.ParentRef"}
    assert uses["runfold.ActivationEnvelope"] == {"runfold.AgentSpec"}
    assert uses["runfold.ReceiptEnvelope"] == {"runfold.Failure", "runfold.Usage"}
    assert uses["runfold.RunEventEnvelope"] == {"runfold.Failure", "runfold.ParentRef", "runfold.Usage"}
    for name in shared:
        assert uses[name] == set()
    for name in ("runfold.RunStateSnapshot", "runfold.DefinitionRecord", "runfold.DeadLetter"):
        assert uses[name] == set()


# ------------------------------------------------------------------------ schema evolution


def example(kind: str, record_type: str) -> dict[str, Any]:
    from test_codec import EXAMPLES

    return {**EXAMPLES[kind][record_type], "type": record_type}


@pytest.mark.parametrize(("kind", "old"), read_history(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_history_schema_is_read_by_the_current_reader(kind: str, old: dict[str, Any]) -> None:
    """docs/contract.md, "Schema evolution": "The processor knows the current schemas and the
    older ones kept in schemas/history/<topic kind>/" and changes are compatible within
    schema_version 1 (new fields optional or defaulted, new messages new branches)."""
    writer = Codec(schemas={**load_contract(), kind: old}, history=[])
    current = load_contract()[kind]
    for record_type in writer.record_types(kind):
        msg = example(kind, record_type)
        got = CODEC.decode(kind, writer.encode(kind, msg))
        assert got["type"] == record_type
        for key, value in got.items():
            if key in msg and _has_field(old, record_type, key):
                assert value == msg[key], (record_type, key)
            elif key not in msg or not _has_field(old, record_type, key):
                assert _field_default(current, record_type, key) == value, (record_type, key)


def _branch(schema: dict[str, Any], record_type: str) -> dict[str, Any]:
    fields = schema["fields"]
    if fields[-1]["name"] != "body":
        return schema
    for b in fields[-1]["type"]:
        if isinstance(b, dict) and b["name"].rpartition(".")[2] == record_type:
            return b
    raise KeyError(record_type)


def _has_field(schema: dict[str, Any], record_type: str, key: str) -> bool:
    names = {f["name"] for f in schema["fields"]} | {
        f["name"] for f in _branch(schema, record_type)["fields"]
    }
    return key in names or key == "type"


def _field_default(schema: dict[str, Any], record_type: str, key: str) -> Any:
    for f in _branch(schema, record_type)["fields"]:
        if f["name"] == key:
            return f["default"]
    raise KeyError(key)


# --------------------------------------------------------------- messages.md vs the schemas


def test_every_documented_message_field_matches_the_schema() -> None:
    """docs/messages.md (Shared records, Commands, Receipts, Activations, Run events,
    Single-record topics): every record's fields, with `?T` = `["null", T]` default null and
    `= x` a schema default; "Change it here first, then in the .avsc"."""
    records = schema_records()
    documented = documented_messages()
    problems = []
    for name, fields in documented.items():
        if name not in records:
            problems.append(f"{name}: documented, no schema record")
            continue
        schema_fields = {f["name"]: f for f in records[name]["fields"]}
        doc_names = [f for f, _, _ in fields]
        body_names = [n for n in schema_fields if n != "schema_version"]
        if [n for n in doc_names if n != "schema_version"] != body_names:
            problems.append(f"{name}: doc fields {doc_names} != schema {body_names}")
        for field, typ, default in fields:
            if field not in schema_fields:
                continue
            sf = schema_fields[field]
            if type_text(sf["type"]) != typ:
                problems.append(f"{name}.{field}: doc {typ}, schema {type_text(sf['type'])}")
            if typ.startswith("?") and sf.get("default", "<none>") is not None:
                problems.append(f"{name}.{field}: optional without default null")
            if default is not None and sf.get("default", "<none>") != DEFAULT_TEXT.get(default, default):
                problems.append(
                    f"{name}.{field}: doc default {default}, schema {sf.get('default', '<none>')}"
                )
    undocumented = (
        set(records)
        - set(documented)
        - {
            "CommandEnvelope",
            "ReceiptEnvelope",
            "ActivationEnvelope",
            "ChildActivationEnvelope",
            "RunEventEnvelope",
        }
    )
    assert not undocumented, f"schema records missing from messages.md: {sorted(undocumented)}"
    assert not problems, "\n".join(problems)


def test_non_optional_fields_with_a_default_are_the_documented_omittable_ones() -> None:
    """docs/messages.md, "Python representation": "Non-optional fields with a schema default may
    be omitted by producers: labels ({}), usage (all zeros), capabilities ([]),
    CancelRun/ResumeRun.reason (""), Failure.retryable (false)." The list names them all."""
    sentence = MESSAGES.split("may be omitted by producers:", 1)[1].split("Decoding always", 1)[0]
    listed: set[str] = set()
    for prefix, last in re.findall(r"((?:`\w+`/)*)`([\w.]+)`\s+\(", sentence):
        record, _, name = last.rpartition(".")
        others = re.findall(r"`(\w+)`/", prefix)
        listed |= {f"{r}.{name}" for r in [*others, record]} if record else {name}
    assert {"labels", "CancelRun.reason", "ResumeRun.reason", "Failure.retryable"} <= listed, listed
    listed |= {"schema_version", "prompt_tokens", "completion_tokens", "cost_micros"}  # said elsewhere
    found = set()
    for name, record in schema_records().items():
        for f in record["fields"]:
            if "default" in f and not (isinstance(f["type"], list) and "null" in f["type"]):
                qualified = f"{name}.{f['name']}"
                found.add(qualified if qualified in listed or f["name"] not in listed else f["name"])
    assert found - listed == set(), f"defaulted, not listed as omittable: {sorted(found - listed)}"


def test_envelope_branches_are_the_documented_and_the_vocabulary_ones() -> None:
    """docs/messages.md, "Envelopes (one value schema per topic)": the union branches of each
    envelope; processors/engine/vocabulary.py is "The one vocabulary of runfold's messages"."""
    table = dict(re.findall(r"^\| `<p>\.([a-z.<>-]+)` \| `runfold\.\w+` \| (.+) \|$", MESSAGES, flags=re.M))

    def branches(kind: str) -> set[str]:
        return {b["name"].rpartition(".")[2] for b in load_contract()[kind]["fields"][-1]["type"]}

    for topic, kind, vocab in [
        ("commands", "commands", COMMANDS),
        ("receipts", "receipts", RECEIPTS),
        ("activations.<queue>", "activations", ACTIVATION_MESSAGES),
        ("child-activations", "child_activations", CHILD_MESSAGES),
    ]:
        documented = {s.strip() for s in table[topic].split(",")}
        assert documented == branches(kind) == set(vocab), topic
    run_event_rows = MESSAGES.split("## Run events", 1)[1].split("How an attempt stopped", 1)[0]
    documented_events = set(re.findall(r"^\| ([A-Z][A-Za-z]+) \|", run_event_rows, flags=re.M)) - {"StepStop"}
    assert documented_events == branches("run_events") == set(EVENT_TYPES)


def test_failure_codes_stops_causes_and_timer_kinds_match_the_doc() -> None:
    """docs/messages.md, "Shared records": Failure `code` is one of the 16 listed; "How an
    attempt stopped": confirmed, completed, failed, lease_expired, stop_unconfirmed;
    StepStopping `cause` (cancelled, timeout); TimerFired `timer_kind` (7 listed)."""
    codes = re.search(r"`code` is one of `([^`]+)`", MESSAGES.replace("\n  ", " "))
    assert codes is not None
    assert {c.strip() for c in codes.group(1).split(",")} == set(FAILURE_CODES)
    stops = MESSAGES.split("How an attempt stopped", 1)[1].split("`stops` is empty", 1)[0]
    assert set(re.findall(r"`([a-z_]+)`", stops)) - {"stop", "stop_timeout_ms"} == set(STOP_HOWS)
    causes = re.search(r"`cause: string` \((.*?)\), `reason", MESSAGES)
    assert causes is not None and set(re.findall(r"`([a-z]+)`", causes.group(1))) == set(STOP_CAUSES)
    kinds = re.search(r"timer_kind: string` \(([^)]*)\)", MESSAGES)
    assert kinds is not None
    # the timers effects arm (the wall-time timer's body is pending.wall_timer, shared with timers_of)
    effects = "".join((ROOT / "processors" / "engine" / f).read_text() for f in ("effects.py", "pending.py"))
    used = set(re.findall(r'_timer\(state, \w+, "([a-z_]+)"', effects))
    used |= set(re.findall(r'"timer_kind": "([a-z_]+)"', effects))
    assert set(re.findall(r"`([a-z_]+)`", kinds.group(1))) == used


def test_run_statuses_in_the_docs_are_the_vocabulary() -> None:
    """docs/index.md, table `runs`: `status` "(as processors.engine.run_status gives it: queued,
    running, waiting, paused, succeeded, failed, cancelled)"; docs/messages.md: "The run statuses
    add `cancelling`, the step statuses `stopping`"; vocabulary.RUN_STATUSES / STEP_STATUSES."""
    semantics = (ROOT / "docs" / "semantics.md").read_text(encoding="utf-8")
    step = re.search(r"status \((scheduled\|[a-z_|\n]+)\)", semantics)
    assert step is not None and tuple(step.group(1).replace("\n", "").split("|")) == STEP_STATUSES
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = re.search(r"run_status` gives it: ([^)]*)\)", index)
    assert listed is not None
    assert set(re.findall(r"`([a-z]+)`", listed.group(1))) == set(RUN_STATUSES)
    # and run_status really gives `cancelling` (a cancel with an attempt in flight)
    h = RunHarness(definition({"a": {"kind": "action", "action": "do"}})).start({}).accept("a").cancel()
    assert h.status == "cancelling"


def test_ids_are_as_documented() -> None:
    """docs/messages.md, "Step identity": `dispatch_id = sha256("{run_id}\\x1f{node}\\x1f{lineage}
    \\x1f{attempt}")[:32]` (hex); "Child run id": `{parent}/{node}`, `[{lineage}]` when mapped,
    `#{attempt}` when attempt > 1."""
    import hashlib

    assert dispatch_id("r-é", "n", "3", 2) == hashlib.sha256("r-é\x1fn\x1f3\x1f2".encode()).hexdigest()[:32]
    assert child_run_id("p", "n", "", 1) == "p/n"
    assert child_run_id("p", "n", "3", 2) == "p/n[3]#2"


# -------------------------------------------------------------- what the engine emits


def exercised() -> list[RunHarness]:
    from test_engine_contract import exercise

    return exercise()


def test_every_emitted_record_has_only_schema_fields_and_survives_the_wire() -> None:
    """docs/messages.md, "Python representation": "Every message is a flat dict ... Envelope
    fields run_id, ts_ms, record_id sit beside the body fields"; "Decoding always returns every
    field"; run events add `sequence` (gap-free from 1; a RunRejected 0), record_id
    `<run_id>:<sequence>` / `<run_id>:rejected:<record_id>` (contract.md). A state refolded from
    the decoded events equals the engine's."""
    contract = load_contract()
    for h in exercised():
        assert [e["sequence"] for e in h.log] == list(range(1, len(h.log) + 1))
        state = None
        for event in h.log:
            fields = {f["name"] for f in contract["run_events"]["fields"][1:-1]}
            fields |= {f["name"] for f in _branch(contract["run_events"], event["type"])["fields"]}
            assert set(event) - {"type"} <= fields, (event["type"], set(event) - fields)
            for missing in fields - set(event):
                _field_default(contract["run_events"], event["type"], missing)  # defaulted, or KeyError
            assert event["record_id"] == f"{h.run_id}:{event['sequence']}"
            decoded = CODEC.decode("run_events", CODEC.encode("run_events", event))
            assert {k: decoded[k] for k in event} == event
            state = evolve(state, decoded)
        assert state is not None and dump_state(state) == dump_state(h.state)
        for rejected in (e for e in h.last.events if e["type"] == "RunRejected"):
            assert rejected["sequence"] == 0 and rejected["record_id"].startswith(f"{h.run_id}:rejected:")
        for message in h.messages:
            kind = "child_activations" if message["type"] in CHILD_MESSAGES else "activations"
            fields = {f["name"] for f in contract[kind]["fields"][1:-1]}
            fields |= {f["name"] for f in _branch(contract[kind], message["type"])["fields"]}
            assert set(message) - {"type"} == fields, message["type"]
            assert_subset(message, CODEC.decode(kind, CODEC.encode(kind, message)))


# --------------------------------------------------------------------------- partitioning

# From Apache kafka-clients 4.1.1 (Utils.murmur2, Utils.toPositive(h) % n), run on this machine.
JAVA = {
    "": (275646681, [0, 0, 2, 9, 9, 81]),
    "a": (-1563381124, [0, 1, 5, 4, 12, 24]),
    "abc": (479470107, [0, 0, 4, 3, 11, 7]),
    "21": (-973932308, [0, 0, 3, 0, 12, 40]),
    "foobar": (-790332482, [0, 0, 0, 6, 14, 66]),
    "r-1": (2040684407, [0, 2, 6, 11, 7, 7]),
    "ordre-é": (648577985, [0, 2, 6, 5, 1, 85]),
    "注文-1": (-6352233, [0, 2, 3, 11, 7, 15]),
    "🚀run": (-1945315163, [0, 0, 1, 9, 5, 85]),
    "x" * 300: (403018756, [0, 1, 0, 4, 4, 56]),
    "a-little-bit-longer-string": (-1486304829, [0, 2, 0, 11, 3, 19]),
}
COUNTS = [1, 3, 7, 12, 16, 100]


@pytest.mark.parametrize("key", list(JAVA), ids=lambda k: repr(k[:12]))
def test_partition_is_javas_murmur2_rule(key: str) -> None:
    """docs/contract.md, "Partitioning": "`(murmur2(utf8(run_id)) & 0x7fffffff) % partitions`:
    Kafka's Java default partitioner for a keyed record" (also for non-ASCII and empty ids)."""
    signed, expected = JAVA[key]
    assert murmur2(key.encode()) == signed & 0xFFFFFFFF
    assert [partition_for(key, n) for n in COUNTS] == expected
    assert [PartitionOwners(n)(key.encode()) for n in COUNTS] == expected
    assert [(murmur2(key.encode()) & 0x7FFFFFFF) % n for n in COUNTS] == expected


def test_every_doc_states_the_same_partition_formula() -> None:
    """docs/runtime.md, "Query": "The owning partition is `murmur2(run_id) % partitions` (Kafka's
    Java default partitioner ...)" against docs/contract.md's `(murmur2(utf8(run_id)) & 0x7fffffff)
    % partitions`: for run id "a" on 3 partitions Java's signed murmur2 % 3 is -1 and the
    unsigned one % 3 is 0, while the owner is 1."""
    runtime = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    stated = re.search(r"The owning partition is `([^`]+)`", runtime)
    assert stated is not None
    assert partition_for("a", 3) == 1 != murmur2(b"a") % 3  # the formula as runtime.md writes it: 0
    assert "0x7fffffff" in stated.group(1), f"runtime.md says {stated.group(1)!r}"


# ------------------------------------------------------------------ json fields, compression


def test_json_integers_are_64_bit_as_documented() -> None:
    """docs/contract.md, "json fields": "Integers up to 2^64 - 1 (and down to -2^63) round-trip
    exactly; beyond that range they are read as doubles"; messages.md: "larger ones are an
    EncodeError"; "A ?json field cannot tell JSON null from absent"."""
    base = {"type": "StartRun", "run_id": "r-1", "record_id": "x", "ts_ms": TS, "definition_id": "d"}
    for n in (2**64 - 1, -(2**63), 2**53 + 1):
        got = CODEC.decode("commands", CODEC.encode("commands", {**base, "input": {"n": n}}))
        assert got["input"]["n"] == n and isinstance(got["input"]["n"], int)
    for n in (2**64, -(2**63) - 1):
        with pytest.raises(EncodeError, match="64 bits"):
            CODEC.encode("commands", {**base, "input": {"n": n}})
    data = CODEC.encode("commands", {**base, "input": {"n": 12345678901234567890}})
    foreign = data.replace(b"12345678901234567890", b"18446744073709551617")  # 2^64 + 1, same length
    assert CODEC.decode("commands", foreign)["input"]["n"] == float(2**64)
    assert (
        CODEC.decode("commands", CODEC.encode("commands", {**base, "input": 1, "budgets": None}))["budgets"]
        is None
    )


def test_runfold_producers_compress_lz4_with_murmur2_and_an_operator_can_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/contract.md, "Compression": "Every runfold producer compresses with LZ4
    (compression.type=lz4)" and "can switch every runfold producer to another codec with
    RUNFOLD_CLIENT_COMPRESSION_TYPE"; "Partitioning": runfold producers use murmur2
    (`partitioner=murmur2_random`)."""
    from processors.runtime.settings import load_processor_settings
    from topology.settings import load_settings, producer_config, transactional_producer_config

    monkeypatch.delenv("RUNFOLD_CLIENT_COMPRESSION_TYPE", raising=False)
    s = load_settings()
    for cfg in (
        producer_config(s),
        transactional_producer_config(s, "t"),
        load_processor_settings().producer_config(),
    ):
        assert (cfg["compression.type"], cfg["partitioner"]) == ("lz4", "murmur2_random")
    monkeypatch.setenv("RUNFOLD_CLIENT_COMPRESSION_TYPE", "gzip")
    s = load_settings()
    for cfg in (
        producer_config(s),
        transactional_producer_config(s, "t"),
        load_processor_settings().producer_config(),
    ):
        assert cfg["compression.type"] == "gzip"
