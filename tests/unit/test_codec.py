"""Codec round trips, defaults, JSON fields and garbage handling (no broker)."""

from __future__ import annotations

import copy
import io
import os
import struct
from typing import Any

import orjson
import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import TOPIC_KINDS, Codec, DecodeError, EncodeError
from schemas.contract import load_contract
from schemas.registry import confluent_header

TS = 1_764_400_000_000
USAGE = {"prompt_tokens": 1200, "completion_tokens": 340, "cost_micros": 5100}
STEP = {"node": "summarize", "lineage": "2", "attempt": 1, "dispatch_id": "9f" * 16}
PARENT = {
    "parent_run_id": "r-parent",
    "parent_node": "research",
    "parent_lineage": "",
    "parent_dispatch_id": "ab" * 16,
    "root_run_id": "r-root",
    "depth": 1,
}
FAILURE = {
    "code": "ExecutionFailed",
    "message": "HTTP 503 from search",
    "retryable": True,
    "node": "search",
    "lineage": "0",
}
BUNDLE = {
    "definition": {"id": "research-brief", "nodes": [{"id": "search", "kind": "action"}]},
    "hash": "c0ffee",
}
AGENT = {
    "agent": "writer",
    "model": "gpt-4o-mini",
    "prompt": [{"role": "user", "content": "Summarise"}],
    "output_schema": {"type": "object", "required": ["summary"]},
    "structured_output_attempts": 2,
    "tools": None,  # only an agent loop's model turn has these (issue 25)
    "messages": None,
}


def env(run_id: str = "r-1", **extra: Any) -> dict[str, Any]:
    return {"run_id": run_id, "record_id": "rec-0001", "ts_ms": TS, **extra}


# One realistic, fully populated example per record type of every topic.
EXAMPLES: dict[str, dict[str, dict[str, Any]]] = {
    "commands": {
        "StartRun": {
            **env(),
            "definition_id": "research-brief",
            "revision": 3,
            "input": {"topic": "kafka"},
            "parent": PARENT,
            "bundle": BUNDLE,
            "budgets": {"tokens": 50000},
            "labels": {"team": "search", "env": "dev"},
        },
        "CancelRun": {**env(), "reason": "user asked", "idempotency_key": None},
        "SignalRun": {
            **env(),
            "signal": "approve",
            "payload": {"approved": True, "by": "ana"},
            "idempotency_key": "approve-ana-1",
        },
        "ResumeRun": {
            **env(),
            "budgets": {"cost_micros": 2_000_000},
            "reason": "raised budget",
            "idempotency_key": "resume-7",
        },
    },
    "receipts": {
        "ActivationAccepted": {**env(), **STEP, "worker_id": "w-1", "lease_ms": 30000},
        "ActivationHeartbeat": {**env(), **STEP, "worker_id": "w-1", "lease_ms": 30000},
        "ActivationCompleted": {
            **env(),
            **STEP,
            "worker_id": "w-1",
            "output": {"summary": "ok", "n": 3},
            "usage": USAGE,
        },
        "ActivationFailed": {
            **env(),
            **STEP,
            "worker_id": "w-1",
            "code": "ExecutionFailed",
            "message": "boom",
            "retryable": True,
            "usage": USAGE,
        },
        "ActivationCancelled": {
            **env(),
            **STEP,
            "worker_id": "w-1",
            "reason": "run cancelled",
            "confirmed": True,
        },
        "ChildRunFinished": {
            **env(),
            **STEP,
            "child_run_id": "r-1/summarize[2]",
            "status": "failed",
            "output": None,
            "failure": FAILURE,
            "usage": USAGE,
        },
        "TimerFired": {
            **env(),
            "timer_id": "t-1",
            "timer_kind": "retry_backoff",
            "due_ms": TS + 500,
            "node": "search",
            "lineage": "",
            "attempt": 2,
            "dispatch_id": "cd" * 16,
        },
    },
    "activations": {
        "ActionActivation": {
            **env(),
            **STEP,
            "definition_id": "research-brief",
            "root_run_id": "r-1",
            "kind": "agent",
            "action": "llm.chat",
            "queue": "agents",
            "input": {"text": "..."},
            "deadline_ms": TS + 60000,
            "lease_ms": 30000,
            "heartbeat_ms": 10000,
            "capabilities": ["http", "llm"],
            "agent": AGENT,
        },
        "CancelActivation": {**env(), **STEP, "reason": "run cancelled"},
    },
    "child_activations": {
        "ChildRunActivation": {
            **env(),
            **STEP,
            "child_run_id": "r-1/summarize[2]",
            "definition_id": "summarizer",
            "revision": 1,
            "input": {"doc": "x"},
            "bundle": BUNDLE,
            "parent": PARENT,
            "deadline_ms": None,
        },
        "ChildRunCancel": {**env(), **STEP, "child_run_id": "r-1/summarize[2]", "reason": "parent cancelled"},
    },
    "run_events": {
        "RunAccepted": {
            **env(sequence=1),
            "definition_id": "research-brief",
            "revision": 3,
            "bundle_hash": "c0ffee",
            "bundle": BUNDLE,
            "input": {"topic": "kafka"},
            "parent": None,
            "budgets": {"tokens": 50000},
            "labels": {"team": "search"},
        },
        "RunRejected": {
            **env(sequence=0),
            "code": "NotFound",
            "reason": "no definition nope",
            "definition_id": "nope",
            "revision": None,
            "command_type": "StartRun",
            "idempotency_key": None,
        },
        "RunStarted": {**env(sequence=2), "superstep": 0},
        "StepScheduled": {
            **env(sequence=3),
            **STEP,
            "kind": "action",
            "queue": "default",
            "input": {"q": "kafka"},
            "input_hash": "ee" * 32,
            "deadline_ms": TS + 1000,
            "superstep": 0,
        },
        "StepStarted": {**env(sequence=4), **STEP, "worker_id": "w-1", "lease_expires_ms": TS + 30000},
        "StepLeaseExtended": {**env(sequence=5), **STEP, "worker_id": "w-1", "lease_expires_ms": TS + 60000},
        "StepSucceeded": {**env(sequence=6), **STEP, "output": {"summary": "ok"}, "usage": USAGE},
        "StepFailed": {**env(sequence=7), **STEP, "failure": FAILURE, "usage": USAGE, "stop": None},
        "StepRetryScheduled": {
            **env(sequence=8),
            **STEP,
            "next_attempt": 2,
            "due_ms": TS + 2000,
            "timer_id": "t-retry",
        },
        "StepSkipped": {**env(sequence=9), "node": "publish", "lineage": "", "reason": "condition false"},
        "StepCancelled": {
            **env(sequence=10),
            **STEP,
            "reason": "run cancelled",
            "stop": "confirmed",
            "usage": USAGE,
        },
        "StepStopping": {
            **env(sequence=10),
            **STEP,
            "cause": "timeout",
            "reason": "search timed out after 1000 ms",
            "failure": FAILURE,
            "due_ms": TS + 30_000,
        },
        "SuperstepCommitted": {
            **env(sequence=11),
            "superstep": 1,
            "state": {"notes": ["a", "b"]},
            "next_frontier": ["write", "review"],
        },
        "RunWaiting": {
            **env(sequence=12),
            "node": "approve",
            "lineage": "",
            "signal": "approve",
            "due_ms": TS + 86_400_000,
        },
        "SignalReceived": {
            **env(sequence=13),
            "signal": "approve",
            "payload": True,
            "node": "approve",
            "idempotency_key": "approve-ana-1",
        },
        "BudgetWarning": {**env(sequence=14), "dimension": "tokens", "used": 40000, "limit": 50000},
        "BudgetExhausted": {**env(sequence=15), "dimension": "tokens", "used": 50001, "limit": 50000},
        "RunPaused": {
            **env(sequence=16),
            "code": "BudgetExceeded",
            "reason": "tokens exhausted",
            "stops": [{"node": "search", "lineage": "", "attempt": 1, "stop": "lease_expired"}],
        },
        "RunCancelling": {
            **env(sequence=16),
            "outcome": "RunPaused",
            "reason": "tokens exhausted",
            "code": "BudgetExceeded",
            "failure": None,
            "step_reason": "run paused: tokens exhausted",
            "idempotency_key": None,
        },
        "RunResumed": {
            **env(sequence=17),
            "budgets": {"tokens": 90000},
            "reason": "raised",
            "idempotency_key": "resume-7",
        },
        "RunSucceeded": {**env(sequence=18), "output": {"brief": "..."}, "usage": USAGE},
        "RunFailed": {**env(sequence=19), "failure": FAILURE, "usage": USAGE, "stops": []},
        "RunCancelled": {
            **env(sequence=20),
            "reason": "user asked",
            "usage": USAGE,
            "stops": [{"node": "search", "lineage": "0", "attempt": 2, "stop": "stop_unconfirmed"}],
            "idempotency_key": None,
        },
        "CommandDeduplicated": {
            **env(sequence=0),
            "record_id": "r-1:duplicate:rec-0002",
            "command_type": "SignalRun",
            "idempotency_key": "approve-ana-1",
            "answer_sequence": 13,
            "answer_type": "SignalReceived",
        },
        "ReceiptConflict": {
            **env(sequence=21),
            **STEP,
            "receipt_type": "ActivationCompleted",
            "reason": "step already failed",
        },
    },
    "run_state": {
        "RunStateSnapshot": {
            "run_id": "r-1",
            "sequence": 21,
            "ts_ms": TS,
            "status": "running",
            "definition_id": "research-brief",
            "revision": 3,
            "state_digest": "aa" * 32,
            "state": {"nodes": {"search": {"status": "succeeded"}}},
        },
    },
    "definitions": {
        "DefinitionRecord": {
            "definition_id": "research-brief",
            "revision": 3,
            "content_hash": "bb" * 32,
            "definition": BUNDLE["definition"],
            "registered_ms": TS,
        },
    },
    "dead_letters": {
        "DeadLetter": {
            "record_id": "dl-1",
            "ts_ms": TS,
            "source_topic": "p.commands",
            "source_partition": 4,
            "source_offset": 1234,
            "key": b"r-1",
            "error": "cannot decode commands: bad magic",
            "original": b"\x00\xffgarbage",
            "producer": "processor-0",
        },
    },
}


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(history=[])


def all_examples() -> list[tuple[str, str]]:
    return [(kind, t) for kind in EXAMPLES for t in EXAMPLES[kind]]


def test_every_topic_and_union_branch_has_an_example(codec: Codec) -> None:
    assert set(EXAMPLES) == set(TOPIC_KINDS)
    for kind in TOPIC_KINDS:
        assert sorted(EXAMPLES[kind]) == sorted(codec.record_types(kind)), kind


@pytest.mark.parametrize(("kind", "record_type"), all_examples())
def test_round_trip(codec: Codec, kind: str, record_type: str) -> None:
    msg = {"type": record_type, **copy.deepcopy(EXAMPLES[kind][record_type])}
    data = codec.encode(kind, msg)
    assert data[:2] == b"\xc3\x01" and data[2:10] == codec.fingerprint(kind)
    assert codec.decode(kind, data) == msg
    assert msg == {"type": record_type, **EXAMPLES[kind][record_type]}  # encode did not mutate


@pytest.mark.parametrize(("kind", "record_type"), all_examples())
def test_flat_encoding_is_the_standard_envelope_encoding(codec: Codec, kind: str, record_type: str) -> None:
    """Bytes equal fastavro's own encoding of the envelope, and a plain Avro reader reads them."""
    schema = parse_schema(codec.schema(kind))
    msg = copy.deepcopy(EXAMPLES[kind][record_type])
    if "body" in [f["name"] for f in schema["fields"]]:
        head = [f["name"] for f in schema["fields"][:-1]]
        body = {k: v for k, v in msg.items() if k not in head}
        envelope = {
            "schema_version": 1,
            **{k: msg[k] for k in head[1:]},
            "body": (f"runfold.{record_type}", body),
        }
    else:
        envelope = {"schema_version": 1, **msg}
    buf = io.BytesIO()
    schemaless_writer(buf, schema, envelope)
    data = codec.encode(kind, {"type": record_type, **msg})
    assert data[10:] == buf.getvalue()
    read = schemaless_reader(io.BytesIO(data[10:]), schema)
    assert read["schema_version"] == 1


def test_omitted_optionals_take_defaults(codec: Codec) -> None:
    start = {"type": "StartRun", **env(), "definition_id": "d", "input": None}
    assert codec.decode("commands", codec.encode("commands", start)) == {
        **start,
        "revision": None,
        "parent": None,
        "bundle": None,
        "budgets": None,
        "labels": {},
    }
    done = {"type": "ActivationCompleted", **env(), **STEP, "worker_id": "w", "output": [1]}
    got = codec.decode("receipts", codec.encode("receipts", done))
    assert got["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
    timer = {"type": "TimerFired", **env(), "timer_id": "t", "timer_kind": "sleep", "due_ms": 5}
    got = codec.decode("receipts", codec.encode("receipts", timer))
    assert (got["node"], got["lineage"], got["attempt"], got["dispatch_id"]) == (None, None, None, None)
    assert codec.decode("commands", codec.encode("commands", {"type": "CancelRun", **env()}))["reason"] == ""
    failure = {"code": "Timeout", "message": "slow"}
    got = codec.decode(
        "run_events", codec.encode("run_events", {"type": "RunFailed", **env(sequence=3), "failure": failure})
    )
    assert got["failure"] == {**failure, "retryable": False, "node": None, "lineage": None}


JSON_VALUES = [
    {"nested": {"deep": [{"a": [1, [2, [3]]]}]}},
    'unicode: é ü 中文 🚀 \u0000 \\ "quotes"',
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0,
    3.141592653589793,
    -1e-300,
    1.7976931348623157e308,
    None,
    True,
    False,
    [],
    {},
    "",
    [None, 1, "x", 1.5, {"k": None}],
]


@pytest.mark.parametrize("value", JSON_VALUES)
def test_json_fields_carry_any_json_value(codec: Codec, value: Any) -> None:
    msg = {"type": "StepSucceeded", **env(sequence=4), **STEP, "output": value, "usage": USAGE}
    assert codec.decode("run_events", codec.encode("run_events", msg))["output"] == value
    # optional json field: None is null (absent) and everything else round-trips too
    start = {"type": "StartRun", **env(), "definition_id": "d", "input": value, "bundle": value}
    got = codec.decode("commands", codec.encode("commands", start))
    assert got["input"] == value and got["bundle"] == value


@pytest.mark.parametrize(
    ("kind", "msg", "record_type", "field"),
    [
        (
            "commands",
            {"type": "StartRun", **env(), "definition_id": 5, "input": {}},
            "StartRun",
            "definition_id",
        ),
        ("commands", {"type": "StartRun", **env(), "definition_id": "d"}, "StartRun", "input"),
        (
            "commands",
            {"type": "StartRun", **env(), "definition_id": "d", "input": 2**70},
            "StartRun",
            "input",
        ),
        (
            "commands",
            {"type": "StartRun", **env(), "definition_id": "d", "input": {1: "x"}},
            "StartRun",
            "input",
        ),
        (
            "commands",
            {"type": "StartRun", "record_id": "x", "ts_ms": 1, "definition_id": "d", "input": 1},
            "StartRun",
            "run_id",
        ),
        ("run_events", {"type": "RunStarted", **env(), "superstep": 1}, "RunStarted", "sequence"),
        (
            "run_events",
            {"type": "RunStarted", **env(sequence=1), "superstep": "one"},
            "RunStarted",
            "superstep",
        ),
        ("commands", {"type": "Nope", **env()}, "Nope", "type"),
        ("commands", {**env(), "reason": "x"}, None, "type"),
        ("run_state", {"type": "DeadLetter"}, "DeadLetter", "type"),
    ],
)
def test_encode_error_names_record_and_field(
    codec: Codec, kind: str, msg: dict[str, Any], record_type: str | None, field: str
) -> None:
    with pytest.raises(EncodeError) as err:
        codec.encode(kind, msg)
    assert (err.value.record_type, err.value.field) == (record_type, field)
    assert field in str(err.value)


def valid(codec: Codec) -> bytes:
    return codec.encode("run_events", {"type": "StepSucceeded", **EXAMPLES["run_events"]["StepSucceeded"]})


def test_garbage_is_a_decode_error_with_a_reason(codec: Codec) -> None:
    data = valid(codec)
    fp = codec.fingerprint("run_events")
    cases = {
        b"": "empty",
        b"\x01\x02\x03": "bad magic",
        b"\xc3\x01\x00": "truncated single-object header",
        b"\xc3\x01" + b"\x00" * 8 + data[10:]: "unknown writer schema fingerprint",
        b"\xc3\x01" + codec.fingerprint("commands") + data[10:]: "unknown writer schema fingerprint",
        data[:-3]: "truncated",
        data[:40]: "truncated",
        data + b"\x00": "trailing bytes",
        b"\xc3\x01" + fp + b"\x02" + b"\xff" * 12: "",
        b"\x00\x00\x00\x00\x07" + data[10:]: "no schema registry configured",
        b"\x00\x00": "truncated Confluent header",
    }
    for raw, reason in cases.items():
        with pytest.raises(DecodeError) as err:
            codec.decode("run_events", raw)
        assert reason in err.value.reason, (raw, err.value.reason)
        assert err.value.topic_kind == "run_events"


def test_wrong_schema_version_is_rejected(codec: Codec) -> None:
    data = bytearray(valid(codec))
    assert data[10] == 2  # zigzag varint of schema_version 1
    data[10] = 4
    with pytest.raises(DecodeError, match="unsupported schema_version 2"):
        codec.decode("run_events", bytes(data))


def test_invalid_json_and_utf8_inside_a_valid_frame(codec: Codec) -> None:
    schema = parse_schema(
        {
            "type": "record",
            "name": "runfold.RunStateSnapshot",
            "fields": [
                {"name": n, "type": t}
                for n, t in [
                    ("schema_version", "int"),
                    ("run_id", "string"),
                    ("sequence", "long"),
                    ("ts_ms", "long"),
                    ("status", "string"),
                    ("definition_id", "string"),
                    ("revision", "int"),
                    ("state_digest", "string"),
                    ("state", "string"),
                ]
            ],
        }
    )
    rec = {
        "schema_version": 1,
        "run_id": "r",
        "sequence": 1,
        "ts_ms": 1,
        "status": "running",
        "definition_id": "d",
        "revision": 1,
        "state_digest": "x",
        "state": "{not json",
    }
    buf = io.BytesIO()
    schemaless_writer(buf, schema, rec)
    head = b"\xc3\x01" + codec.fingerprint("run_state")
    with pytest.raises(DecodeError, match="invalid JSON"):
        codec.decode("run_state", head + buf.getvalue())
    bad_utf8 = buf.getvalue().replace(b"\x02r", b"\x02\xff", 1)
    with pytest.raises(DecodeError, match="UTF-8"):
        codec.decode("run_state", head + bad_utf8)


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=300), kind=st.sampled_from(TOPIC_KINDS), framed=st.booleans())
def test_decode_never_raises_anything_but_decode_error(body: bytes, kind: str, framed: bool) -> None:
    codec = _shared_codec()
    data = b"\xc3\x01" + codec.fingerprint(kind) + body if framed else body
    try:
        msg = codec.decode(kind, data)
    except DecodeError as err:
        assert err.reason
    else:
        assert isinstance(msg, dict) and msg["type"] in codec.record_types(kind)


@settings(max_examples=200, deadline=None)
@given(
    cut=st.integers(min_value=0),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
)
def test_mutated_valid_records_decode_or_fail_cleanly(cut: int, flips: list[tuple[int, int]]) -> None:
    codec = _shared_codec()
    data = bytearray(codec.encode("commands", {"type": "StartRun", **EXAMPLES["commands"]["StartRun"]}))
    for pos, byte in flips:
        data[10 + pos % (len(data) - 10)] = byte
    data = data[: len(data) - cut % len(data)] if cut % 3 else data
    try:
        msg = codec.decode("commands", bytes(data))
    except DecodeError as err:
        assert err.reason
    else:
        assert msg["type"] in codec.record_types("commands")


def test_length_prefix_far_beyond_the_input_does_not_allocate(codec: Codec) -> None:
    # record_id claims ~4.6e18 bytes: must fail as truncated, not try to allocate
    data = b"\xc3\x01" + codec.fingerprint("commands") + b"\x02" + b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f"
    with pytest.raises(DecodeError, match="truncated"):
        codec.decode("commands", data)


_CODEC: list[Codec] = []


def _shared_codec() -> Codec:
    if not _CODEC:
        _CODEC.append(Codec(history=[]))
    return _CODEC[0]


# --- fingerprints and framing


def _crc64_avro(data: bytes) -> int:
    """The reference algorithm from the Avro specification ("Schema Fingerprints")."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_fingerprint_is_crc64_avro_of_canonical_form_little_endian(codec: Codec, kind: str) -> None:
    from fastavro.schema import to_parsing_canonical_form

    canonical = to_parsing_canonical_form(parse_schema(codec.schema(kind)))
    assert codec.fingerprint(kind) == struct.pack("<Q", _crc64_avro(canonical.encode()))
    assert '"name":"runfold.' in canonical and '"doc"' not in canonical


def test_schemas_are_standalone_and_define_shared_types_once() -> None:
    contract = load_contract()
    text = orjson.dumps(contract["run_events"]).decode()
    assert text.count('"name":"Usage"') == 1 and text.count('"name":"Failure"') == 1
    for kind, schema in contract.items():
        parse_schema(schema)  # no external references left
        assert schema["namespace"] == "runfold", kind


def test_confluent_header_framing() -> None:
    assert confluent_header(1) == b"\x00\x00\x00\x00\x01"
    assert confluent_header(0x01020304) == b"\x00\x01\x02\x03\x04"
    with pytest.raises(ValueError):
        confluent_header(2**32)


class _InMemoryRegistry:
    """Registry double for the framing we own (register/get by id); not a real registry."""

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}

    def register_schema(self, subject: str, schema: Any) -> int:
        for schema_id, known in self.by_id.items():
            if known.schema_str == schema.schema_str:
                return schema_id
        self.by_id[len(self.by_id) + 100] = schema
        return len(self.by_id) + 99

    def get_schema(self, schema_id: int) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self.by_id:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.by_id[schema_id]


def test_registry_mode_frames_with_schema_id_and_decodes_both_framings(codec: Codec) -> None:
    registry = _InMemoryRegistry()
    reg_codec = Codec(history=[], registry_client=registry)
    msg = {"type": "CancelRun", **env(), "reason": "x", "idempotency_key": None}
    data = reg_codec.encode("commands", msg)
    schema_id = int.from_bytes(data[1:5], "big")
    assert data[0] == 0 and registry.by_id[schema_id].schema_type == "AVRO"
    assert data[5:] == codec.encode("commands", msg)[10:]
    assert reg_codec.decode("commands", data) == msg
    assert reg_codec.decode("commands", codec.encode("commands", msg)) == msg
    fresh = Codec(history=[], registry_client=registry)  # learns the writer schema from the registry by id
    fresh.registry.__dict__["_schemas"].clear()  # type: ignore[union-attr]
    assert fresh.decode("commands", data) == msg
    with pytest.raises(DecodeError, match="unknown schema registry id 999"):
        reg_codec.decode("commands", b"\x00" + (999).to_bytes(4, "big") + data[5:])


def test_default_codec_is_cached_and_single_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    assert Codec.default() is Codec.default()
    assert Codec.default().encode("commands", {"type": "CancelRun", **env()})[:2] == b"\xc3\x01"
    assert "SCHEMA_REGISTRY_URL" not in os.environ


def test_pre_bound_encoder_decoder_and_batches(codec: Codec) -> None:
    msgs = [{"type": t, **EXAMPLES["receipts"][t]} for t in EXAMPLES["receipts"]]
    datas = codec.encode_many("receipts", msgs)
    assert datas == [codec.encoder("receipts")(m) for m in msgs]
    assert codec.decode_many("receipts", datas) == msgs
    assert [codec.decoder("receipts")(d) for d in datas] == msgs
    with pytest.raises(ValueError, match="unknown topic kind"):
        codec.encode("nope", msgs[0])
