"""Load the Avro contract (`schemas/runfold.*.avsc`) into standalone schemas.

The `.avsc` files follow the `<full name>.avsc` convention (what fastavro's
`load_schema` and the Java tooling expect): shared named types (`Usage`,
`Failure`, `ParentRef`, `AgentSpec`) live in their own files and the topic
envelopes refer to them by full name. `standalone()` inlines each referenced
type at its first use, which is the self-contained form a Schema Registry
stores and whose Parsing Canonical Form gives the single-object fingerprint.

`schemas/standalone/<full name>.avsc` holds that form of each topic's value schema, one
self-contained file per topic, for tools in other languages (`new Schema.Parser().parse(file)`,
avsc's `Type.forSchema`) and for Schema Registry; tests/unit/test_contract_files.py keeps
them equal to what `standalone()` gives. Rewrite them after changing a `.avsc` with
`python -m schemas`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

SCHEMA_DIR = Path(__file__).resolve().parent
STANDALONE_DIR = SCHEMA_DIR / "standalone"
NAMESPACE = "runfold"
SCHEMA_VERSION = 1

# topic kind -> envelope (or single record) full name, as in docs/messages.md
TOPIC_RECORDS: dict[str, str] = {
    "commands": "runfold.CommandEnvelope",
    "receipts": "runfold.ReceiptEnvelope",
    "activations": "runfold.ActivationEnvelope",
    "child_activations": "runfold.ChildActivationEnvelope",
    "run_events": "runfold.RunEventEnvelope",
    "run_state": "runfold.RunStateSnapshot",
    "definitions": "runfold.DefinitionRecord",
    "dead_letters": "runfold.DeadLetter",
}
TOPIC_KINDS = tuple(TOPIC_RECORDS)

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def read_avsc_dir(schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    """Every `<full name>.avsc` in `schema_dir`, keyed by full name."""
    raw: dict[str, Any] = {}
    for path in sorted(schema_dir.glob("*.avsc")):
        schema = orjson.loads(path.read_bytes())
        name = _full_name(schema)
        if path.stem != name:
            raise ValueError(f"{path}: file must be named {name}.avsc")
        raw[name] = schema
    return raw


def standalone(full_name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The schema `full_name` with every referenced named type defined at its first use."""
    defined: set[str] = set()

    def inline(t: Any, ns: str) -> Any:
        if isinstance(t, str):
            if t in _PRIMITIVES:
                return t
            name = t if "." in t else f"{ns}.{t}"
            if name in defined:
                return name
            if name not in raw:
                raise ValueError(f"{full_name}: unknown named type {t!r}")
            return inline(copy.deepcopy(raw[name]), ns)
        if isinstance(t, list):
            return [inline(b, ns) for b in t]
        kind = t.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = _full_name(t, ns)
            defined.add(name)
            if kind in ("record", "error"):
                inner_ns = name.rpartition(".")[0]
                t["fields"] = [{**f, "type": inline(f["type"], inner_ns)} for f in t["fields"]]
            return t
        if kind == "array":
            return {**t, "items": inline(t["items"], ns)}
        if kind == "map":
            return {**t, "values": inline(t["values"], ns)}
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in _PRIMITIVES):
            return inline(kind, ns)
        return t

    return inline(copy.deepcopy(raw[full_name]), NAMESPACE)  # type: ignore[no-any-return]


def fingerprint64(schema: dict[str, Any] | str) -> bytes:
    """CRC-64-AVRO of the Parsing Canonical Form, as the 8 little-endian bytes of single-object encoding."""
    parsed = parse_schema(schema, _write_hint=False) if not isinstance(schema, str) else schema
    canonical = to_parsing_canonical_form(parsed)
    # fastavro renders the fingerprint as the hex of its little-endian bytes ('"int"' -> 8f5c393f1ad57572)
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def load_contract(schema_dir: Path = SCHEMA_DIR) -> dict[str, dict[str, Any]]:
    """topic kind -> standalone (unparsed) schema of that topic's value."""
    raw = read_avsc_dir(schema_dir)
    return {kind: standalone(name, raw) for kind, name in TOPIC_RECORDS.items()}


def read_history(schema_dir: Path = SCHEMA_DIR) -> list[tuple[str, dict[str, Any]]]:
    """Historical writer schemas kept in `history/<topic kind>/*.avsc` (standalone JSON).

    A schema that is no longer current but may still be on the wire goes here, so
    records written with it keep decoding (their fingerprint stays known).
    """
    out: list[tuple[str, dict[str, Any]]] = []
    history = schema_dir / "history"
    for kind in TOPIC_KINDS:
        for path in sorted((history / kind).glob("*.avsc")):
            out.append((kind, orjson.loads(path.read_bytes())))
    return out


def _full_name(schema: dict[str, Any], ns: str = NAMESPACE) -> str:
    name: str = schema["name"]
    if "." in name:
        return name
    return f"{schema.get('namespace', ns)}.{name}"


def standalone_files(schema_dir: Path = SCHEMA_DIR) -> dict[str, bytes]:
    """File name -> bytes of each topic's self-contained schema (what `schemas/standalone/` holds)."""
    raw = read_avsc_dir(schema_dir)
    return {
        f"{name}.avsc": orjson.dumps(standalone(name, raw), option=orjson.OPT_INDENT_2) + b"\n"
        for name in TOPIC_RECORDS.values()
    }


def write_standalone(out_dir: Path = STANDALONE_DIR, schema_dir: Path = SCHEMA_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in standalone_files(schema_dir).items():
        (out_dir / name).write_bytes(data)
        written.append(out_dir / name)
    return written
