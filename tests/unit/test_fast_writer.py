"""The generated Avro writers (schemas/fast_writer.py) write exactly fastavro's bytes.

For every record type of every topic: well-typed messages must take the generated path
and give fastavro's bytes; arbitrary (often ill-typed) messages either give fastavro's
bytes or are refused, so the codec falls back to fastavro (which writes or explains).
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import TOPIC_KINDS, Codec, EncodeError

CODEC = Codec.default()
CASES = [(kind, name) for kind in TOPIC_KINDS for name in CODEC.record_types(kind)]

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_wrong = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | st.floats()
    | st.tuples(st.text(max_size=3), st.integers())
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    | st.builds(bytearray, st.binary(max_size=3))
)


def _strategy(t: Any, named: dict[str, Any], valid: bool) -> st.SearchStrategy[Any]:
    good = _typed(t, named, valid)
    return good if valid else st.one_of(good, good, good, _wrong)


def _typed(t: Any, named: dict[str, Any], valid: bool) -> st.SearchStrategy[Any]:
    if isinstance(t, str) and t in named:
        t = named[t]
    if isinstance(t, list):
        return st.none() | _strategy(t[1], named, valid)
    if isinstance(t, dict):
        kind = t["type"]
        if t.get("logicalType") == "json":
            return _json
        if kind == "array":
            return st.lists(_strategy(t["items"], named, valid), max_size=4)
        if kind == "map":
            return st.dictionaries(st.text(max_size=6), _strategy(t["values"], named, valid), max_size=4)
        if kind == "record":
            return _record(t, named, valid)
        t = kind
    return {
        "int": st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(0, 63),
        "long": st.integers(-(1 << 63), (1 << 63) - 1)
        | st.integers(-70, 70)
        | st.integers(1_700_000_000_000, 1_800_000_000_000),
        "string": st.text(),
        "bytes": st.binary(),
        "boolean": st.booleans(),
        "null": st.none(),
    }[t]


def _record(schema: dict[str, Any], named: dict[str, Any], valid: bool) -> st.SearchStrategy[dict[str, Any]]:
    fields = {
        f["name"]: _strategy(f["type"], named, valid) for f in schema["fields"] if f["name"] != "_branch"
    }
    # fields with a default (or nullable) may be left out; without one only an invalid message omits them
    optional = {f["name"] for f in schema["fields"] if "default" in f or isinstance(f["type"], list)}

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out = {}
        for name, strategy in fields.items():
            if (name in optional or not valid) and draw(st.integers(0, 3)) == 0:
                continue
            out[name] = draw(strategy)
        return out

    return build()


def _reference(flat: Any, msg: dict[str, Any]) -> bytes | None:
    buf = BytesIO()
    try:
        schemaless_writer(buf, flat, msg)
    except Exception:
        return None
    return buf.getvalue()


@pytest.mark.parametrize(("kind", "name"), CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_well_typed_messages_take_the_generated_path_with_fastavro_bytes(
    kind: str, name: str, data: Any
) -> None:
    topic = CODEC._topics[kind]
    flat, fast = topic.flat[name], topic.fast[name]
    assert fast is not None, f"{kind}/{name} has no generated writer"
    msg = data.draw(_record(flat, dict(flat["__named_schemas"]), valid=True))
    out = bytearray()
    fast(msg, out)
    assert bytes(out) == _reference(flat, msg)


@pytest.mark.parametrize(("kind", "name"), CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_message_is_written_as_fastavro_writes_it_or_refused(kind: str, name: str, data: Any) -> None:
    topic = CODEC._topics[kind]
    flat, fast = topic.flat[name], topic.fast[name]
    assert fast is not None
    msg = data.draw(_record(flat, dict(flat["__named_schemas"]), valid=False))
    out = bytearray()
    try:
        fast(msg, out)
    except Exception:
        return  # refused: the codec falls back to fastavro
    assert bytes(out) == _reference(flat, msg)


def test_codec_falls_back_to_fastavro_for_values_outside_the_generated_cases() -> None:
    ok = {"type": "RunStarted", "run_id": "r", "record_id": "r:2", "ts_ms": 5, "sequence": 2, "superstep": 1}
    # a bool is an int to fastavro (written as 1) but outside the generated writer's cases
    assert CODEC.encode("run_events", {**ok, "superstep": True}) == CODEC.encode("run_events", ok)
    with pytest.raises(EncodeError) as info:
        CODEC.encode("run_events", {**ok, "superstep": "one"})
    assert info.value.field == "superstep"
    with pytest.raises(EncodeError):
        CODEC.encode("run_events", {**ok, "sequence": 1 << 64})
