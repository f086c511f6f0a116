"""Generated Avro writers for the codec's flat record schemas (the encode hot path).

fastavro's `schemaless_writer` costs 12-30 us per message, mostly in walking the schema
dicts and resolving unions by validating each branch. For each flat schema the codec
builds, `compile_writer` generates one straight-line Python function that appends the
record's Avro binary body to a bytearray. It covers exactly the types runfold's contract
uses (null, boolean, int, long, string, bytes, the `json` logical string, arrays and maps
of those, named records, and `["null", T]` unions) and only the values whose encoding is
unambiguous: a value of any other Python type (bool for a long, a tuple in a union, a
64-bit overflow, ...) raises `Unsupported`, and the codec then encodes the message with
fastavro, which either writes it (the same bytes) or raises the explained error. So the
output is byte-for-byte fastavro's (tests/unit/test_fast_writer.py checks it with hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

Writer = Callable[[dict[str, Any], bytearray], None]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_SMALL = [bytes([(n << 1) & 0xFF]) if n < 64 else b"" for n in range(64)]


class Unsupported(Exception):
    """The value is outside the generated writer's cases: encode it with fastavro."""


def _varint(n: int) -> bytes:
    """Zig-zag varint of a 64-bit long (the caller checked the range)."""
    if 0 <= n < 64:
        return _SMALL[n]
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Recently written large longs and their bytes: a decision's messages share one ts_ms, and
# every RunAccepted carries the same budget limits. Bounded (cleared when full); a dict's
# get and set are atomic, so concurrent encoders only ever read a complete entry.
_LONGS: dict[int, bytes] = {}
_LONGS_MAX = 4096


def _long(v: Any) -> bytes:
    if type(v) is not int:
        raise Unsupported
    out = _LONGS.get(v)
    if out is None:
        if not _LONG_MIN <= v <= _LONG_MAX:
            raise Unsupported
        out = _varint(v)
        if len(_LONGS) >= _LONGS_MAX:
            _LONGS.clear()
        _LONGS[v] = out
    return out


def _int(v: Any) -> bytes:
    if type(v) is not int or not _INT_MIN <= v <= _INT_MAX:
        raise Unsupported
    return _varint(v)


def _bytes(v: Any, b: bytearray) -> None:
    if type(v) is not bytes:
        raise Unsupported
    b += _varint(len(v))
    b += v


def _boolean(v: Any) -> bytes:
    if v is True:
        return b"\x01"
    if v is False:
        return b"\x00"
    raise Unsupported


_PRIMITIVE_BYTES = {"int": "_int", "long": "_long", "boolean": "_boolean"}  # value -> bytes
_PRIMITIVE_APPEND = {"bytes": "_bytes"}  # (value, buffer) -> None; strings are inlined


class _Gen:
    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.consts: dict[str, Any] = {}
        self.helpers: list[str] = []
        self.records: dict[str, str] = {}
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def const(self, value: Any) -> str:
        name = f"c{len(self.consts)}"
        self.consts[name] = value
        return name

    def value(self, t: Any, v: str, ind: str, out: list[str]) -> None:
        """Lines appending the encoding of the Python value in variable `v` of Avro type `t` to `b`."""
        if isinstance(t, str) and t in self.named:
            t = self.named[t]
        if isinstance(t, str):
            if t == "string":  # inlined: the most frequent field type
                raw = self.var()
                # str.encode unbound: a TypeError for anything but a str (or a subclass, whose
                # UTF-8 fastavro writes as well), so no separate type check
                out.append(f"{ind}{raw} = _utf8({v})")
                self.length_prefixed(raw, ind, out)
            elif t == "long":
                out.append(f"{ind}if type({v}) is int and 0 <= {v} < 64: b.append({v} << 1)")
                out.append(f"{ind}else: b += _long({v})")
            elif t == "int":
                out.append(f"{ind}if type({v}) is int and 0 <= {v} < 64: b.append({v} << 1)")
                out.append(f"{ind}else: b += _int({v})")
            elif t in _PRIMITIVE_BYTES:
                out.append(f"{ind}b += {_PRIMITIVE_BYTES[t]}({v})")
            elif t in _PRIMITIVE_APPEND:
                out.append(f"{ind}{_PRIMITIVE_APPEND[t]}({v}, b)")
            elif t == "null":
                out.append(f"{ind}if {v} is not None: raise Unsupported")
            else:
                raise NotImplementedError(t)
            return
        if isinstance(t, list):
            if len(t) != 2 or t[0] != "null":
                raise NotImplementedError(f"union {t}")
            inner = t[1]
            out.append(f"{ind}if {v} is None:")
            out.append(f"{ind}    b.append(0)")
            out.append(f"{ind}else:")
            # fastavro resolves a union by validating the branches; a tuple is its "named
            # branch" notation and a dict with "-type" names the branch: leave both to it.
            out.append(f"{ind}    if type({v}) is tuple: raise Unsupported")
            if self._is_record(inner):
                out.append(f"{ind}    if type({v}) is not dict or '-type' in {v}: raise Unsupported")
            out.append(f"{ind}    b.append(2)")
            self.value(inner, v, ind + "    ", out)
            return
        kind = t.get("type")
        if kind == "string" and t.get("logicalType") == "json":
            # fastavro: orjson.dumps(v).decode() written as UTF-8: the same bytes
            raw = self.var()
            out.append(f"{ind}{raw} = _dumps({v})")
            self.length_prefixed(raw, ind, out)
        elif kind in ("string", "bytes", "int", "long", "boolean", "null") and "logicalType" not in t:
            self.value(kind, v, ind, out)
        elif kind == "array":
            item = self.var()
            out.append(f"{ind}if type({v}) is not list: raise Unsupported")
            out.append(f"{ind}if {v}:")
            out.append(f"{ind}    b += _varint(len({v}))")
            out.append(f"{ind}    for {item} in {v}:")
            self.value(t["items"], item, ind + "        ", out)
            out.append(f"{ind}b.append(0)")
        elif kind == "map":
            key, val = self.var(), self.var()
            out.append(f"{ind}if type({v}) is not dict: raise Unsupported")
            out.append(f"{ind}if {v}:")
            out.append(f"{ind}    b += _varint(len({v}))")
            out.append(f"{ind}    for {key}, {val} in {v}.items():")
            self.value("string", key, ind + "        ", out)
            self.value(t["values"], val, ind + "        ", out)
            out.append(f"{ind}b.append(0)")
        elif kind == "record":
            out.append(f"{ind}{self.record(t)}({v}, b)")
        else:
            raise NotImplementedError(str(kind))

    @staticmethod
    def length_prefixed(raw: str, ind: str, out: list[str]) -> None:
        """Lines appending the bytes in `raw` with their length (one- and two-byte varints inline)."""
        n = raw + "n"
        out.append(f"{ind}{n} = len({raw})")
        out.append(f"{ind}if {n} < 64: b.append({n} << 1)")
        out.append(f"{ind}elif {n} < 8192: b.append(({n} << 1) & 0x7F | 0x80); b.append({n} >> 6)")
        out.append(f"{ind}else: b += _varint({n})")
        out.append(f"{ind}b += {raw}")

    def _is_record(self, t: Any) -> bool:
        if isinstance(t, str) and t in self.named:
            t = self.named[t]
        return isinstance(t, dict) and t.get("type") == "record"

    def record(self, schema: dict[str, Any]) -> str:
        """A helper function writing one record (a dict): returns its name."""
        name = schema["name"]
        fn = self.records.get(name)
        if fn is not None:
            return fn
        fn = self.records[name] = f"w_{len(self.records)}"
        lines = [f"def {fn}(m, b):", "    if type(m) is not dict: raise Unsupported", "    g = m.get"]
        for f in schema["fields"]:
            v = self.var()
            t = f["type"]
            default = f.get("default")
            if t in ("int", "long") and type(default) is int and 0 <= default < 64:
                # envelope constants (schema_version, the body's union index): callers leave them out
                lines.append(f"    if {f['name']!r} not in m: b.append({default << 1})")
                lines.append("    else:")
                lines.append(f"        {v} = m[{f['name']!r}]")
                self.value(t, v, "        ", lines)
                continue
            if "default" in f:
                lines.append(f"    {v} = g({f['name']!r}, {self.const(f['default'])})")
            elif isinstance(t, list) and "null" in t:
                lines.append(f"    {v} = g({f['name']!r})")  # fastavro: missing and nullable is null
            else:
                lines.append(f"    {v} = m[{f['name']!r}]")  # missing, no default: fastavro raises
            self.value(t, v, "    ", lines)
        self.helpers.append("\n".join(lines))
        return fn


def compile_writer(schema: dict[str, Any]) -> Writer | None:
    """A writer for one parsed flat record schema (fastavro `parse_schema` output), or None
    when the schema uses a type the generator does not cover."""
    gen = _Gen(dict(schema.get("__named_schemas") or {}))
    try:
        top = gen.record(schema)
    except NotImplementedError:
        return None
    env: dict[str, Any] = {
        "Unsupported": Unsupported,
        "_varint": _varint,
        "_long": _long,
        "_int": _int,
        "_boolean": _boolean,
        "_bytes": _bytes,
        "_utf8": str.encode,
        "_dumps": orjson.dumps,
        **gen.consts,
    }
    exec("\n\n".join(gen.helpers), env)
    writer: Writer = env[top]
    return writer
