"""The generated Avro readers (schemas/fast_reader.py) decode exactly as fastavro does.

For every record type of every topic: messages written with the current schema must be
read by the generated reader (not the fallback) into fastavro's dict; garbage, truncated
and mutated bytes must give the codec's outcome without the generated reader (the same
dict, or a DecodeError with the same reason) and never any other exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast_writer import _record  # the message strategies of the writer tests

from schemas import TOPIC_KINDS, Codec, DecodeError
from schemas.fast_reader import Malformed

CODEC = Codec.default()
REFERENCE = Codec()  # the same contract decoded by fastavro only
for _topic in REFERENCE._topics.values():
    _topic.fast_read = None
CASES = [(kind, name) for kind in TOPIC_KINDS for name in CODEC.record_types(kind)]
_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _message(data: Any, kind: str, name: str) -> bytes:
    flat = CODEC._topics[kind].flat[name]
    msg = data.draw(_record(flat, dict(flat["__named_schemas"]), valid=True))
    if CODEC._topics[kind].is_envelope:
        msg["type"] = name
    msg.pop("schema_version", None)
    return CODEC.encode(kind, msg)


def _outcome(codec: Codec, kind: str, data: bytes) -> tuple[str, str]:
    try:
        return "ok", repr(codec.decode(kind, data))  # repr: key order and bool/int/float types count
    except DecodeError as exc:
        return "error", exc.reason


@pytest.mark.parametrize(("kind", "name"), CASES)
@_SETTINGS
@given(data=st.data())
def test_current_schema_records_take_the_generated_path_with_fastavro_dicts(
    kind: str, name: str, data: Any
) -> None:
    topic = CODEC._topics[kind]
    assert topic.fast_read is not None, f"{kind} has no generated reader"
    encoded = _message(data, kind, name)
    expected = REFERENCE.decode(kind, encoded)
    got = topic.fast_read(encoded, 10)  # raises if the generated reader would fall back
    assert got == expected
    assert repr(got) == repr(expected)
    assert got["type"] == name


@pytest.mark.parametrize(("kind", "name"), CASES)
@_SETTINGS
@given(
    data=st.data(),
    cut=st.integers(0, 1 << 16),
    flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_truncated_and_mutated_records_decode_as_fastavro_or_raise_decode_error(
    kind: str, name: str, data: Any, cut: int, flips: list[tuple[int, int]]
) -> None:
    encoded = _message(data, kind, name)
    truncated = encoded[: 10 + cut % (len(encoded) - 10)]
    assert _outcome(CODEC, kind, truncated) == _outcome(REFERENCE, kind, truncated)
    mutated = bytearray(encoded)
    for at, value in flips:
        mutated[10 + at % (len(encoded) - 10)] = value
    assert _outcome(CODEC, kind, bytes(mutated)) == _outcome(REFERENCE, kind, bytes(mutated))
    extended = encoded + bytes([flips[0][1]])
    assert _outcome(CODEC, kind, extended) == ("error", "1 trailing bytes after the record")


@pytest.mark.parametrize("kind", TOPIC_KINDS)
@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64))
def test_garbage_after_a_current_header_raises_only_decode_error_or_decodes_as_fastavro(
    kind: str, body: bytes
) -> None:
    data = CODEC._topics[kind].header + body
    assert _outcome(CODEC, kind, data) == _outcome(REFERENCE, kind, data)


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_bogus_length_prefixes_are_bounded_by_the_bytes_left() -> None:
    topic = CODEC._topics["run_events"]
    ok = CODEC.encode(
        "run_events",
        {"type": "RunStarted", "run_id": "r", "record_id": "r:2", "ts_ms": 5, "sequence": 2, "superstep": 1},
    )
    # schema_version 1, then run_id's length claims 2**62 bytes
    bogus = ok[:11] + _varint(1 << 62) + b"r"
    with pytest.raises(Malformed):
        topic.fast_read(bogus, 10)
    with pytest.raises(DecodeError):
        CODEC.decode("run_events", bogus)
    over = ok[:10] + b"\x80" * 11 + b"\x01"  # a varint longer than 64 bits
    with pytest.raises(Malformed):
        topic.fast_read(over, 10)
    with pytest.raises(DecodeError):
        CODEC.decode("run_events", over)


def test_another_schema_version_is_refused_by_the_generated_reader_and_explained() -> None:
    data = CODEC.encode(
        "run_events",
        {
            "type": "RunStarted",
            "run_id": "r",
            "record_id": "r:2",
            "ts_ms": 5,
            "sequence": 2,
            "superstep": 1,
            "schema_version": 2,
        },
    )
    with pytest.raises(Malformed):
        CODEC._topics["run_events"].fast_read(data, 10)
    with pytest.raises(DecodeError) as info:
        CODEC.decode("run_events", data)
    assert info.value.reason == "unsupported schema_version 2"


def test_every_topic_has_a_generated_reader_wired_into_decoder() -> None:
    for kind in TOPIC_KINDS:
        assert CODEC._topics[kind].fast_read is not None, kind
    msg = {"type": "RunStarted", "run_id": "r", "record_id": "r:2", "ts_ms": 5, "sequence": 2, "superstep": 1}
    assert CODEC.decoder("run_events")(CODEC.encode("run_events", msg))["superstep"] == 1


@pytest.mark.parametrize("size", [0, 63, 64, 100, 4095, 4096, 8191, 8192, 70_000])
def test_one_two_and_three_byte_lengths_are_read_by_the_generated_path(size: int) -> None:
    msg = {
        "type": "StepSucceeded",
        "run_id": "r" * size,
        "record_id": "r:2",
        "ts_ms": 1_764_400_000_000,
        "sequence": 1 << 40,
        "node": "n",
        "lineage": "0",
        "attempt": 1,
        "dispatch_id": "d",
        "output": {"text": "é" * size},
        "usage": {"prompt_tokens": size, "completion_tokens": -size, "cost_micros": -(1 << 63)},
    }
    data = CODEC.encode("run_events", msg)
    got = CODEC._topics["run_events"].fast_read(data, 10)
    assert repr(got) == repr(REFERENCE.decode("run_events", data))
    assert got["run_id"] == msg["run_id"] and got["output"] == msg["output"]
