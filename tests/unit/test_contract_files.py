"""The schema files a producer in another language starts from (docs/contract.md): the
self-contained files match the contract, parse alone and give the fingerprints the codec
writes; the shared-type files parse in the documented load order; a writer that leaves
`schema_version` to its schema default is read."""

from __future__ import annotations

import io

import orjson
import pytest
from fastavro import parse_schema, schemaless_writer

from schemas import TOPIC_KINDS, Codec, DecodeError
from schemas.contract import SCHEMA_DIR, STANDALONE_DIR, TOPIC_RECORDS, fingerprint64, standalone_files

# The fingerprints on the wire since schema_version 1: a change to one is a new writer schema
# (keep the old one in schemas/history/<kind>/ so records already in the log still decode).
FINGERPRINTS = {
    "commands": "b06e03173e1597ea",  # issue 44: idempotency_key (v1: a603db8dbef79e61)
    "receipts": "f1017a3e4ce431dc",  # issue 27: ActivationCancelled.confirmed (v1: 08513f8e0ee0dabc)
    "activations": "a6a3b3037515da6c",  # issue 25: AgentSpec.tools/messages (v1: 199fd866e4f4405f)
    "child_activations": "b16f383694186dbf",
    # issue 44: idempotency keys, CommandDeduplicated (v2: ebcb920fa2804fb3); issue 27: the
    # stopping phase (v1: aa225c37072e13b6)
    "run_events": "744b5898718c9058",
    "run_state": "bec981ddea69fcc0",
    "definitions": "ada0c3fd574491f8",
    "dead_letters": "d5e255ed6943190f",
}
# docs/contract.md, "Loading the .avsc files": the shared named types first, then the rest.
LOAD_ORDER = [
    "runfold.Usage",
    "runfold.Failure",
    "runfold.ParentRef",
    "runfold.AgentSpec",
    "runfold.CommandEnvelope",
    "runfold.ReceiptEnvelope",
    "runfold.ActivationEnvelope",
    "runfold.ChildActivationEnvelope",
    "runfold.RunEventEnvelope",
    "runfold.RunStateSnapshot",
    "runfold.DefinitionRecord",
    "runfold.DeadLetter",
]
CODEC = Codec(history=[])


def test_standalone_files_are_what_the_avsc_files_give() -> None:
    expected = standalone_files()
    on_disk = {p.name: p.read_bytes() for p in STANDALONE_DIR.glob("*.avsc")}
    assert on_disk == expected, "schemas/standalone/ is stale: run `python -m schemas`"


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_each_standalone_file_parses_alone_with_the_fingerprint_on_the_wire(kind: str) -> None:
    schema = orjson.loads((STANDALONE_DIR / f"{TOPIC_RECORDS[kind]}.avsc").read_bytes())
    parse_schema(schema, named_schemas={})  # no other file needed
    assert fingerprint64(schema).hex() == FINGERPRINTS[kind] == CODEC.fingerprint(kind).hex()


def test_the_avsc_files_parse_in_the_documented_load_order_and_five_need_it() -> None:
    assert sorted(LOAD_ORDER) == sorted(p.stem for p in SCHEMA_DIR.glob("runfold.*.avsc"))
    named: dict = {}
    needs_others = []
    for name in LOAD_ORDER:
        schema = orjson.loads((SCHEMA_DIR / f"{name}.avsc").read_bytes())
        try:
            parse_schema(schema, named_schemas={})
        except Exception:
            needs_others.append(name)
        parse_schema(schema, named_schemas=named)
    assert needs_others == [
        "runfold.CommandEnvelope",
        "runfold.ReceiptEnvelope",
        "runfold.ActivationEnvelope",
        "runfold.ChildActivationEnvelope",
        "runfold.RunEventEnvelope",
    ]


def test_a_writer_that_leaves_schema_version_to_its_default_is_read() -> None:
    """Java's GenericRecordBuilder and avsc fill a field's default: schema_version has one (1)."""
    schema = orjson.loads((STANDALONE_DIR / "runfold.CommandEnvelope.avsc").read_bytes())
    parsed = parse_schema(schema)
    buf = io.BytesIO()
    schemaless_writer(
        buf,
        parsed,
        {
            "record_id": "r",
            "run_id": "x",
            "ts_ms": 1_764_400_000_000,
            "body": ("runfold.CancelRun", {"reason": "why"}),
        },
    )
    msg = CODEC.decode("commands", b"\xc3\x01" + CODEC.fingerprint("commands") + buf.getvalue())
    assert msg == {
        "type": "CancelRun",
        "run_id": "x",
        "record_id": "r",
        "ts_ms": 1_764_400_000_000,
        "reason": "why",
        "idempotency_key": None,
    }


def test_a_writer_schema_of_ones_own_is_refused_with_the_rule_and_the_schema_to_use() -> None:
    schema = orjson.loads((STANDALONE_DIR / "runfold.CommandEnvelope.avsc").read_bytes())
    schema["fields"].insert(4, {"name": "trace", "type": ["null", "string"], "default": None})
    mine = Codec(schemas={**{k: CODEC.schema(k) for k in TOPIC_KINDS}, "commands": schema}, history=[])
    data = mine.encode("commands", {"type": "CancelRun", "run_id": "x", "record_id": "r", "ts_ms": 1})
    with pytest.raises(DecodeError) as err:
        CODEC.decode("commands", data)
    assert (
        "schemas/standalone/runfold.CommandEnvelope.avsc (fingerprint b06e03173e1597ea)" in err.value.reason
    )
    assert "Schema Registry" in err.value.reason


def test_with_schema_registry_a_compatible_writer_schema_of_ones_own_is_read() -> None:
    from test_codec import _InMemoryRegistry

    schema = orjson.loads((STANDALONE_DIR / "runfold.CommandEnvelope.avsc").read_bytes())
    schema["fields"].insert(4, {"name": "trace", "type": ["null", "string"], "default": None})
    registry = _InMemoryRegistry()
    mine = Codec(
        schemas={**{k: CODEC.schema(k) for k in TOPIC_KINDS}, "commands": schema},
        history=[],
        registry_client=registry,
    )
    data = mine.encode(
        "commands", {"type": "CancelRun", "run_id": "x", "record_id": "r", "ts_ms": 1, "trace": "t"}
    )
    assert data[0] == 0  # Confluent framing: the writer schema travels by id
    processor = Codec(history=[], registry_client=registry)
    assert processor.decode("commands", data) == {
        "type": "CancelRun",
        "run_id": "x",
        "record_id": "r",
        "ts_ms": 1,
        "reason": "",
        "idempotency_key": None,
    }
