"""Avro codec for every runfold topic: flat dicts in Python, Avro on the wire.

API (stable; the runtime, executors and tools call only this)::

    from schemas import Codec, DecodeError, EncodeError
    codec = Codec.default()            # cached per process; honours SCHEMA_REGISTRY_URL
    data = codec.encode("commands", {"type": "StartRun", "run_id": "r-1", "record_id": "…",
                                     "ts_ms": 1764400000000, "definition_id": "d", "input": {}})
    msg = codec.decode("commands", data)    # the same flat dict, optional fields filled
    enc = codec.encoder("run_events")       # pre-bound callables for hot loops: dict -> bytes
    dec = codec.decoder("receipts")         # bytes -> dict
    codec.encode_many(kind, msgs) -> list[bytes];  codec.decode_many(kind, datas) -> list[dict]

Topic kinds: commands, receipts, activations, child_activations, run_events,
run_state, definitions, dead_letters. Messages are the flat dicts of
docs/messages.md: `type` names the record (the envelope's body branch), envelope
fields (`run_id`, `record_id`, `ts_ms`, `sequence`) sit beside body fields, and
`schema_version` is written and checked here, never seen by callers. Omitted
optional fields encode as null (or their schema default: `labels` {}, `usage`
zeros, ...) and decode as None/default. JSON fields (Avro `string` with
`logicalType: json`) hold any JSON value; integers must fit in 64 bits.

Wire format: Avro single-object encoding (`C3 01`, 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema, Avro binary body). Decoding looks
the fingerprint up among the known writer schemas (current plus
`schemas/history/<kind>/*.avsc` plus `add_writer_schema`) and resolves to the
current reader schema. With a Schema Registry (`SCHEMA_REGISTRY_URL` or
`registry_url=`) encoding uses the Confluent framing (`00` + 4-byte big-endian
schema id); decoding accepts both framings.

Errors: `DecodeError` (one type for any undecodable bytes; `.reason`,
`.topic_kind`) and `EncodeError` (names the record type and field). Both are
ValueErrors. `InvalidJsonField` is the DecodeError of a record whose Avro decodes but
one of whose `json` fields holds text that is not UTF-8 JSON: it carries the decoded
message (those fields None) and which fields, so the processor can answer the run
(a RunRejected, a failed attempt) instead of only dead-lettering the bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from functools import lru_cache
from io import BytesIO
from pathlib import Path
from typing import Any

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import LOGICAL_READERS, SchemaResolutionError
from fastavro.write import LOGICAL_WRITERS

from schemas.contract import (
    SCHEMA_DIR,
    SCHEMA_VERSION,
    TOPIC_KINDS,
    fingerprint64,
    load_contract,
    read_history,
)
from schemas.errors import DecodeError, EncodeError, InvalidJsonField
from schemas.fast_reader import compile_reader
from schemas.fast_writer import compile_writer
from schemas.registry import RegistryFraming

__all__ = ["TOPIC_KINDS", "Codec", "DecodeError", "EncodeError", "InvalidJsonField", "get_codec"]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0
MAX_RECORD_BYTES = 64 * 1024 * 1024  # far above any Kafka message.max.bytes we configure


# --- the `json` logical type: fastavro keys custom logical types as "<avro type>-<logicalType>"


def _json_to_avro(datum: Any, schema: Any) -> str:
    return orjson.dumps(datum).decode()


def _json_from_avro(data: str, writer_schema: Any, reader_schema: Any) -> Any:
    return orjson.loads(data)


LOGICAL_WRITERS["string-json"] = _json_to_avro
LOGICAL_READERS["string-json"] = _json_from_avro


def _by_name(t: Any) -> Any:
    """Replace inline named-type definitions by their names (they are resolved through named_schemas)."""
    if isinstance(t, list):
        return [_by_name(b) for b in t]
    if isinstance(t, dict):
        kind = t.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            return t["name"]
        if kind == "array":
            return {**t, "items": _by_name(t["items"])}
        if kind == "map":
            return {**t, "values": _by_name(t["values"])}
    return t


def _parse(schema: Any, named: dict[str, Any] | None = None) -> Any:
    return parse_schema(schema, named_schemas=named)


def _decode_reason(exc: BaseException) -> str:
    if isinstance(exc, orjson.JSONDecodeError):
        return f"invalid JSON in a json field ({exc})"
    if isinstance(exc, UnicodeDecodeError):
        return "invalid UTF-8 in a string field"
    if isinstance(exc, (EOFError, struct.error)):
        return "truncated or malformed Avro body"
    if isinstance(exc, IndexError):  # fastavro's varint reader past the end, or a bad union index
        return "truncated or malformed Avro body (read past the end or bad union index)"
    if isinstance(exc, MemoryError):
        return "length prefix too large"
    if isinstance(exc, SchemaResolutionError):  # fastavro's text is a Python repr of the schemas: not shown
        return (
            "not readable with the current reader schema: the writer used a union branch (a message "
            "type) or a field type the reader does not have, e.g. a newer runfold schema"
        )
    return f"not valid for the schema ({type(exc).__name__}: {str(exc)[:200]})"


class _Topic:
    """Encoder/decoder for one topic kind (all per-record work lives here)."""

    def __init__(self, kind: str, schema: dict[str, Any]) -> None:
        self.kind = kind
        self.raw = schema
        self.reader: dict[str, Any] = _parse(schema)
        self.name: str = self.reader["name"]
        self.fingerprint = fingerprint64(schema)
        self.header: bytes = SINGLE_OBJECT_MAGIC + self.fingerprint
        # fingerprint -> (writer schema, reader schema or None when they are the same)
        self.writers: dict[bytes, tuple[Any, Any]] = {self.fingerprint: (self.reader, None)}
        self.registry_writers: dict[int, tuple[Any, Any]] = {}
        # the unparsed writer schemas, for reading a record whose json fields are not JSON
        self.raw_writers: dict[bytes | int, dict[str, Any]] = {self.fingerprint: schema}
        self._lenient: dict[bytes | int, tuple[Any, Any]] = {}
        named: dict[str, Any] = dict(self.reader["__named_schemas"])
        fields: list[Any] = self.reader["fields"]
        self.is_envelope = fields[-1]["name"] == "body"
        # Encoding writes the envelope through a flat schema per body type whose binary form is
        # identical (header fields, the union index as an int with a fixed default, body fields),
        # so the caller's flat dict is written as is: no envelope dict, no union matching.
        self.flat: dict[str, Any] = {}
        self.short: dict[str, str] = {}
        if self.is_envelope:
            header = [self._field(f) for f in fields[:-1]]
            self.envelope_fields = tuple(f["name"] for f in fields[1:-1])
            for index, member in enumerate(fields[-1]["type"]):
                branch: Any = named[member] if isinstance(member, str) else member
                short = branch["name"].rpartition(".")[2]
                self.short[branch["name"]] = short
                flat_fields = [*header, {"name": "_branch", "type": "int", "default": index}]
                flat_fields += [self._field(f) for f in branch["fields"]]
                clash = {f["name"] for f in header} & {f["name"] for f in branch["fields"]}
                if clash:
                    raise ValueError(f"{self.name}: body {short} reuses envelope fields {clash}")
                self.flat[short] = parse_schema(
                    {"type": "record", "name": f"runfold.flat.{short}", "fields": flat_fields},
                    named_schemas=dict(named),
                )
        else:
            self.envelope_fields = ()
            short = self.name.rpartition(".")[2]
            self.short[self.name] = short
            self.flat[short] = parse_schema(
                {
                    "type": "record",
                    "name": f"runfold.flat.{short}",
                    "fields": [self._field(f) for f in fields],
                },
                named_schemas=dict(named),
            )
        self.single_type = None if self.is_envelope else short
        self.fast = {name: compile_writer(flat) for name, flat in self.flat.items()}
        # records written with the current schema skip fastavro (anything it refuses goes to fastavro)
        self.fast_read = compile_reader(self.reader, self.short, SCHEMA_VERSION)

    @staticmethod
    def _field(f: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in f.items() if k in ("name", "type", "default")}
        out["type"] = _by_name(f["type"])
        if f["name"] == "schema_version":
            out["default"] = SCHEMA_VERSION
        return out

    def add_writer(self, schema: dict[str, Any]) -> bytes:
        parsed: Any = parse_schema(schema)
        fp = fingerprint64(schema)
        if fp != self.fingerprint:
            self.writers[fp] = (parsed, self.reader)
            self.raw_writers[fp] = schema
        return fp

    # --- hot path

    def encode(self, msg: dict[str, Any]) -> bytes:
        record_type = msg.get("type", self.single_type)
        fast = self.fast.get(record_type)  # type: ignore[arg-type]
        if fast is not None:
            out = bytearray(self.header)
            try:
                fast(msg, out)
                return bytes(out)
            except Exception:
                pass
        flat = self.flat.get(record_type)  # type: ignore[arg-type]
        if flat is None:
            raise EncodeError(
                f"unknown record type {record_type!r} (expected one of {sorted(self.flat)})",
                self.kind,
                record_type,
                "type",
            )
        buf = BytesIO()
        buf.write(self.header)
        try:
            schemaless_writer(buf, flat, msg)
        except Exception as exc:
            raise self._explain(msg, record_type, flat, exc) from exc  # type: ignore[arg-type]
        return buf.getvalue()

    def decode(self, data: bytes | None) -> dict[str, Any]:
        if data is None:  # a tombstone: never a runfold record, and bad input is a DecodeError
            raise DecodeError("null value (a tombstone)", self.kind)
        if data[:2] == SINGLE_OBJECT_MAGIC:
            found = self.writers.get(data[2:10])
            if found is None:
                if len(data) < 10:
                    raise DecodeError("truncated single-object header", self.kind)
                raise DecodeError(
                    f"unknown writer schema fingerprint {data[2:10].hex()}: write with the schema of "
                    f"schemas/standalone/{self.name}.avsc (fingerprint {self.fingerprint.hex()}) or one in "
                    f"schemas/history/{self.kind}/; a writer schema of your own (even one extra optional "
                    "field) needs Schema Registry framing (docs/contract.md, Schema evolution)",
                    self.kind,
                )
            start = 10
        elif data[:1] == b"\x00":
            found = self._registry_writer(data)
            start = 5
        elif not data:
            raise DecodeError("empty value", self.kind)
        else:
            raise DecodeError(f"bad magic {data[:2].hex()} (expected c301 or 00)", self.kind)
        if len(data) > MAX_RECORD_BYTES:
            raise DecodeError(f"record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}", self.kind)
        if found[1] is None and self.fast_read is not None:
            try:
                return self.fast_read(data, start)
            except Exception:
                pass  # malformed or an edge case: fastavro reads it or explains why not
        fo = BytesIO(data)
        fo.seek(start)
        try:
            rec: Any = schemaless_reader(fo, found[0], found[1], True, True)
        except Exception as exc:
            if isinstance(exc, (orjson.JSONDecodeError, UnicodeDecodeError)):
                self._raise_invalid_json(data, start)
            raise DecodeError(_decode_reason(exc), self.kind) from None
        if fo.tell() != len(data):
            raise DecodeError(f"{len(data) - fo.tell()} trailing bytes after the record", self.kind)
        return self._flat(rec)

    def _flat(self, rec: Any) -> dict[str, Any]:
        """The codec's flat dict of a decoded record (envelope fields beside the body's)."""
        if rec["schema_version"] != SCHEMA_VERSION:
            raise DecodeError(f"unsupported schema_version {rec['schema_version']}", self.kind)
        if not self.is_envelope:
            del rec["schema_version"]
            rec["type"] = self.single_type
            return rec  # type: ignore[no-any-return]
        body = rec["body"]
        name, out = body if isinstance(body, tuple) else (self.name, body)
        out["type"] = self.short.get(name, name)
        for key in self.envelope_fields:
            out[key] = rec[key]
        return out  # type: ignore[no-any-return]

    # --- cold paths

    def _raise_invalid_json(self, data: bytes, start: int) -> None:
        """Read the record again with its json fields as plain bytes: when only their text is
        at fault, raise InvalidJsonField with the message; otherwise return (the caller raises
        the plain DecodeError)."""
        fp: bytes | int = data[2:10] if data[:2] == SINGLE_OBJECT_MAGIC else int.from_bytes(data[1:5], "big")
        plain = self._lenient.get(fp)
        if plain is None:
            raw = self.raw_writers.get(fp)
            if raw is None:
                return
            plain_reader = parse_schema(_json_as_bytes(self.raw))
            plain = (
                (plain_reader, None) if raw is self.raw else (parse_schema(_json_as_bytes(raw)), plain_reader)
            )
            self._lenient[fp] = plain
        fo = BytesIO(data)
        fo.seek(start)
        try:
            rec: Any = schemaless_reader(fo, plain[0], plain[1], True, True)
        except Exception:
            return
        if fo.tell() != len(data):
            return
        bad: list[tuple[str, str]] = []
        rec = _parse_json_leaves(rec, self.raw, _named_types(self.raw), [], bad)
        if not bad:  # the fast path's strictness, not the text: nothing to report here
            return
        raise InvalidJsonField(self.kind, self._flat(rec), bad) from None

    registry: RegistryFraming | None = None  # when a schema registry is configured

    def _registry_writer(self, data: bytes) -> tuple[Any, Any]:
        if len(data) < 5:
            raise DecodeError("truncated Confluent header", self.kind)
        schema_id = int.from_bytes(data[1:5], "big")
        found = self.registry_writers.get(schema_id)
        if found is not None:
            return found
        if self.registry is None:
            raise DecodeError(
                f"Confluent framing (schema id {schema_id}) but no schema registry configured", self.kind
            )
        try:
            schema = self.registry.writer_schema(schema_id)
        except DecodeError as exc:
            raise DecodeError(exc.reason, self.kind) from None
        fp = fingerprint64(schema)
        writer: Any = parse_schema(schema)
        found = (self.reader, None) if fp == self.fingerprint else (writer, self.reader)
        self.registry_writers[schema_id] = found
        self.raw_writers[schema_id] = self.raw if fp == self.fingerprint else schema
        return found

    def _explain(self, msg: dict[str, Any], record_type: str, flat: Any, exc: Exception) -> EncodeError:
        """Find the first field that does not fit (only after a failed encode)."""
        named: Any = flat["__named_schemas"]
        for f in flat["fields"]:
            if f["name"] == "_branch":
                continue
            probe: Any = parse_schema(
                {"type": "record", "name": "runfold.probe.Field", "fields": [f]}, named_schemas=dict(named)
            )
            try:
                schemaless_writer(BytesIO(), probe, {f["name"]: msg[f["name"]]} if f["name"] in msg else {})
            except Exception as field_exc:
                return EncodeError(_encode_reason(field_exc), self.kind, record_type, f["name"])
        return EncodeError(_encode_reason(exc), self.kind, record_type, None)


def _is_json(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "string" and t.get("logicalType") == "json"


def _json_as_bytes(t: Any) -> Any:
    """The schema with every `json` string read as Avro bytes (the same binary encoding), so
    neither UTF-8 nor JSON is checked while reading."""
    if _is_json(t):
        return "bytes"
    if isinstance(t, list):
        return [_json_as_bytes(b) for b in t]
    if isinstance(t, dict):
        out = dict(t)
        if "fields" in t:
            out["fields"] = [{**f, "type": _json_as_bytes(f["type"])} for f in t["fields"]]
        for k in ("items", "values"):
            if k in t:
                out[k] = _json_as_bytes(t[k])
        if isinstance(t.get("type"), (dict, list)):
            out["type"] = _json_as_bytes(t["type"])
        return out
    return t


def _named_types(schema: Any, ns: str = "runfold", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Full name -> definition of every named type defined in `schema`."""
    out = {} if out is None else out
    if isinstance(schema, list):
        for b in schema:
            _named_types(b, ns, out)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = schema["name"]
            full = name if "." in name else f"{schema.get('namespace', ns)}.{name}"
            out[full] = schema
            ns = full.rpartition(".")[0]
            for f in schema.get("fields", ()):
                _named_types(f["type"], ns, out)
        elif kind == "array":
            _named_types(schema["items"], ns, out)
        elif kind == "map":
            _named_types(schema["values"], ns, out)
        elif isinstance(kind, (dict, list)):
            _named_types(kind, ns, out)
    return out


def _parse_json_leaves(
    value: Any, t: Any, named: dict[str, Any], path: list[str], bad: list[tuple[str, str]]
) -> Any:
    """`value` (read with `_json_as_bytes`) with its json leaves parsed; a leaf that is not
    UTF-8 JSON becomes None and is listed in `bad` with its path (the envelope's `body` left out)."""
    if isinstance(t, str):
        found = named.get(t) or named.get(f"runfold.{t}")
        return value if found is None else _parse_json_leaves(value, found, named, path, bad)
    if isinstance(t, list):
        if value is None:
            return None
        if isinstance(value, tuple):  # a record branch of the envelope's body union: (name, record)
            name, inner = value
            return name, _parse_json_leaves(inner, named.get(name, {}), named, path, bad)
        branches = [b for b in t if b != "null"]
        return _parse_json_leaves(value, branches[0], named, path, bad) if len(branches) == 1 else value
    if not isinstance(t, dict):
        return value
    if _is_json(t):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            bad.append((".".join(path), str(exc)))
            return None
    kind = t.get("type")
    if kind in ("record", "error") and isinstance(value, dict):
        return {
            f["name"]: _parse_json_leaves(
                value.get(f["name"]),
                f["type"],
                named,
                path if f["name"] == "body" else [*path, f["name"]],
                bad,
            )
            for f in t["fields"]
        }
    if kind == "array" and isinstance(value, list):
        return [_parse_json_leaves(v, t["items"], named, [*path, str(i)], bad) for i, v in enumerate(value)]
    if kind == "map" and isinstance(value, dict):
        return {k: _parse_json_leaves(v, t["values"], named, [*path, k], bad) for k, v in value.items()}
    if isinstance(kind, (dict, list)):
        return _parse_json_leaves(value, kind, named, path, bad)
    return value


def _encode_reason(exc: Exception) -> str:
    text = str(exc).split(" on field ")[0]
    if "64-bit" in text:
        return "JSON integers must fit in 64 bits"
    return f"{type(exc).__name__}: {text[:200]}"


class Codec:
    """Encode/decode every runfold topic. Build once (`Codec.default()`), share freely."""

    def __init__(
        self,
        schemas: dict[str, dict[str, Any]] | None = None,
        history: Iterable[tuple[str, dict[str, Any]]] | None = None,
        registry_url: str | None = None,
        registry_client: Any = None,
        schema_dir: Path = SCHEMA_DIR,
    ) -> None:
        """`schemas`: topic kind -> standalone schema (default: the `.avsc` contract); `history`:
        extra known writer schemas (default: `schemas/history/`); a registry switches encoding to
        the Confluent framing."""
        contract = schemas if schemas is not None else load_contract(schema_dir)
        self._topics = {kind: _Topic(kind, schema) for kind, schema in contract.items()}
        for kind, schema in history if history is not None else read_history(schema_dir):
            self._topics[kind].add_writer(schema)
        self.registry = None
        if registry_url or registry_client is not None:
            self.registry = RegistryFraming(registry_url, registry_client)
            for topic in self._topics.values():
                topic.registry = self.registry
                topic.header = self.registry.header(topic.name, topic.raw)

    @classmethod
    def default(cls) -> Codec:
        return _default_codec(os.environ.get("SCHEMA_REGISTRY_URL") or None)

    def encode(self, topic_kind: str, msg: dict[str, Any]) -> bytes:
        return self._topic(topic_kind).encode(msg)

    def decode(self, topic_kind: str, data: bytes | None) -> dict[str, Any]:
        return self._topic(topic_kind).decode(data)

    def encode_many(self, topic_kind: str, msgs: Iterable[dict[str, Any]]) -> list[bytes]:
        enc = self._topic(topic_kind).encode
        return [enc(m) for m in msgs]

    def decode_many(self, topic_kind: str, datas: Iterable[bytes]) -> list[dict[str, Any]]:
        dec = self._topic(topic_kind).decode
        return [dec(d) for d in datas]

    def encoder(self, topic_kind: str) -> Callable[[dict[str, Any]], bytes]:
        return self._topic(topic_kind).encode

    def decoder(self, topic_kind: str) -> Callable[[bytes | None], dict[str, Any]]:
        return self._topic(topic_kind).decode

    def add_writer_schema(self, topic_kind: str, schema: dict[str, Any]) -> bytes:
        """Make records written with an older/newer `schema` decodable; returns its fingerprint."""
        return self._topic(topic_kind).add_writer(schema)

    def schema(self, topic_kind: str) -> dict[str, Any]:
        """The standalone (self-contained) Avro schema of the topic's values."""
        return self._topic(topic_kind).raw

    def fingerprint(self, topic_kind: str) -> bytes:
        return self._topic(topic_kind).fingerprint

    def record_types(self, topic_kind: str) -> list[str]:
        return list(self._topic(topic_kind).flat)

    def _topic(self, topic_kind: str) -> _Topic:
        try:
            return self._topics[topic_kind]
        except KeyError:
            raise ValueError(f"unknown topic kind {topic_kind!r} (expected one of {TOPIC_KINDS})") from None


@lru_cache(maxsize=4)
def _default_codec(registry_url: str | None) -> Codec:
    return Codec(registry_url=registry_url)


def get_codec() -> Codec:
    return Codec.default()
