"""Generated Avro readers for records written with the current schema (the decode hot path).

fastavro's `schemaless_reader` with writer->reader resolution costs ~35 us per message,
mostly in walking the schema dicts. When a record's writer fingerprint is the current
reader schema's, no resolution is needed, and `compile_reader` generates one straight-line
Python function per topic that parses the Avro body into the codec's flat dict directly
(body fields, `type`, envelope fields; `schema_version` checked and dropped; `json`
logical strings parsed with orjson).

The generated reader is deliberately strict: it accepts only canonical, in-bounds
encodings of the types runfold's contract uses (null, boolean, int, long, string, bytes,
the `json` logical string, arrays and maps of those, named records, `["null", T]` unions
and the envelope's body union). Anything else - a truncation, a length or count larger
than the bytes left, a varint over 10 bytes or 64 bits, a negative block count, a union
index out of range, invalid UTF-8 or JSON, trailing bytes, another schema_version - raises,
and the codec then decodes the bytes with fastavro, which either reads them (the same
dict) or raises the explained `DecodeError`. So errors and edge cases keep exactly
today's behaviour, and no length prefix is trusted beyond the remaining buffer
(tests/unit/test_fast_reader.py checks it against fastavro with hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

Reader = Callable[[bytes, int], dict[str, Any]]

_U64 = 1 << 64
_BOOL = (False, True)


class Malformed(Exception):
    """Outside the generated reader's cases: decode the bytes with fastavro."""


def _long(d: bytes, i: int) -> tuple[int, int]:
    """The zig-zag varint at d[i] (at most 10 bytes, 64 bits) and the index after it."""
    b = d[i]  # IndexError past the end: the codec falls back
    n = b & 0x7F
    shift = 7
    i += 1
    while b & 0x80:
        if shift > 63:
            raise Malformed
        b = d[i]
        n |= (b & 0x7F) << shift
        shift += 7
        i += 1
    if n >= _U64:
        raise Malformed
    return (n >> 1) ^ -(n & 1), i


def _count(d: bytes, i: int) -> tuple[int, int]:
    """A length or block count: non-negative and at most the bytes left (every item takes >= 1)."""
    n, i = _long(d, i)
    if n < 0 or n > len(d) - i:
        raise Malformed
    return n, i


class _Gen:
    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.n = 0
        self.depth = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def resolve(self, t: Any) -> Any:
        if isinstance(t, str) and t in self.named:
            return self.named[t]
        if (
            isinstance(t, dict)
            and t.get("type") in ("string", "bytes", "int", "long", "boolean", "null")
            and "logicalType" not in t
        ):
            return t["type"]
        return t

    def value(self, t: Any, v: str, ind: str, out: list[str]) -> None:
        """Lines reading a value of Avro type `t` at d[i] into variable `v`, advancing `i`."""
        t = self.resolve(t)
        if t in ("long", "int"):  # an Avro int is a zig-zag varint as well
            out.append(f"{ind}{v} = d[i]")
            out.append(f"{ind}if {v} < 128: {v} = ({v} >> 1) ^ -({v} & 1); i += 1")
            out.append(f"{ind}else: {v}, i = _long(d, i)")
        elif t in ("string", "bytes") or (
            isinstance(t, dict) and t.get("type") == "string" and t.get("logicalType") == "json"
        ):
            n = self.var()
            out.append(f"{ind}{n} = d[i]")
            out.append(f"{ind}if {n} < 128 and not {n} & 1: {n} = i + 1 + ({n} >> 1); i += 1")
            # two-byte lengths (64..8191) inline as well: most JSON fields are that long
            out.append(
                f"{ind}elif {n} & 129 == 128 and d[i + 1] < 128: {n} = i + 2 + ((({n} & 127) | (d[i + 1] << 7)) >> 1); i += 2"
            )
            out.append(f"{ind}else: {n}, i = _count(d, i); {n} += i")
            out.append(f"{ind}if {n} > end: raise Malformed")
            if t == "string":
                out.append(f"{ind}{v} = d[i:{n}].decode(); i = {n}")
            elif t == "bytes":
                out.append(f"{ind}{v} = d[i:{n}]; i = {n}")
            else:
                out.append(f"{ind}{v} = _loads(d[i:{n}]); i = {n}")
        elif t == "boolean":
            out.append(f"{ind}{v} = _BOOL[d[i]]; i += 1")
        elif t == "null":
            out.append(f"{ind}{v} = None")
        elif isinstance(t, list):
            if len(t) != 2 or t[0] != "null":
                raise NotImplementedError(f"union {t}")
            out.append(f"{ind}{v} = d[i]; i += 1")
            out.append(f"{ind}if {v} == 0: {v} = None")
            out.append(f"{ind}elif {v} != 2: raise Malformed")
            out.append(f"{ind}else:")
            self.value(t[1], v, ind + "    ", out)
        elif isinstance(t, dict) and t.get("type") in ("array", "map"):
            is_map = t["type"] == "map"
            inner = t["values"] if is_map else t["items"]
            if self.resolve(inner) == "null":
                raise NotImplementedError("zero-byte items")  # a count could not be bounded by the bytes
            n, k, x = self.var(), self.var(), self.var()
            out.append(f"{ind}{v} = {{}}" if is_map else f"{ind}{v} = []")
            out.append(f"{ind}{n}, i = _count(d, i)")
            out.append(f"{ind}while {n}:")
            out.append(f"{ind}    for _ in range({n}):")
            if is_map:
                self.value("string", k, ind + "        ", out)
            self.value(inner, x, ind + "        ", out)
            out.append(f"{ind}        {v}[{k}] = {x}" if is_map else f"{ind}        {v}.append({x})")
            out.append(f"{ind}    {n}, i = _count(d, i)")
        elif isinstance(t, dict) and t.get("type") == "record":
            self.depth += 1
            if self.depth > 8:
                raise NotImplementedError("recursive record")
            fields = self.fields(t["fields"], ind, out)
            out.append(f"{ind}{v} = {{{', '.join(f'{k!r}: {x}' for k, x in fields)}}}")
            self.depth -= 1
        else:
            raise NotImplementedError(str(t))

    def fields(self, fields: list[dict[str, Any]], ind: str, out: list[str]) -> list[tuple[str, str]]:
        read = []
        for f in fields:
            v = self.var()
            self.value(f["type"], v, ind, out)
            read.append((f["name"], v))
        return read


def compile_reader(reader: dict[str, Any], short: dict[str, str], schema_version: int) -> Reader | None:
    """A reader of one topic's current-schema Avro body (fastavro `parse_schema` output of the
    envelope or single record) starting at index i, or None when the schema uses a type the
    generator does not cover. `short` maps record full names to the `type` the codec sets."""
    gen = _Gen(dict(reader.get("__named_schemas") or {}))
    fields: list[dict[str, Any]] = reader["fields"]
    is_envelope = fields[-1]["name"] == "body"
    if fields[0]["name"] != "schema_version":
        return None
    lines = ["def read(d, i):", "    end = len(d)"]
    helpers: list[str] = []
    try:
        header = gen.fields(fields[:-1] if is_envelope else fields, "    ", lines)
        lines.append(f"    if {header[0][1]} != {schema_version}: raise Malformed")
        if not is_envelope:
            lines.append("    if i != end: raise Malformed")
            items = [f"{k!r}: {x}" for k, x in header[1:]] + [f"'type': {short[reader['name']]!r}"]
            lines.append(f"    return {{{', '.join(items)}}}")
        else:
            envelope = header[1:]
            args = ", ".join(x for _, x in envelope)
            lines.append("    k = d[i]")
            lines.append("    if k & 1 or k >= 128: raise Malformed")  # canonical non-negative one-byte index
            lines.append(f"    return _BRANCHES[k >> 1](d, i + 1, end, {args})")
            for index, member in enumerate(fields[-1]["type"]):
                branch = gen.resolve(member)
                body = [f"def b{index}(d, i, end, {args}):"]
                read = gen.fields(branch["fields"], "    ", body)
                body.append("    if i != end: raise Malformed")
                items = [f"{k!r}: {x}" for k, x in read] + [f"'type': {short[branch['name']]!r}"]
                items += [f"{k!r}: {x}" for k, x in envelope]
                body.append(f"    return {{{', '.join(items)}}}")
                helpers.append("\n".join(body))
    except (NotImplementedError, KeyError, TypeError):
        return None
    env: dict[str, Any] = {
        "Malformed": Malformed,
        "_long": _long,
        "_count": _count,
        "_BOOL": _BOOL,
        "_loads": orjson.loads,
    }
    exec("\n\n".join([*helpers, "\n".join(lines)]), env)
    if is_envelope:
        env["_BRANCHES"] = tuple(env[f"b{n}"] for n in range(len(fields[-1]["type"])))
    fn: Reader = env["read"]
    return fn
