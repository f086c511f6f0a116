"""References and templates: any JSON object with a `"from"` key is a reference.

`{"from": "state", "pointer": "/plan/queries"}` reads the scope `state` at an RFC 6901
pointer; `{"from": "literal", "value": {...}}` is how a literal object that itself has a
`from` key is written. Every other value is walked recursively and copied.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any, ClassVar, Final, NamedTuple

import orjson

from processors.engine.definition import Ref
from processors.engine.errors import RefError

__all__ = [
    "ABSENT",
    "REF_KEYS",
    "REF_SOURCES",
    "RefError",
    "Scope",
    "canonical_json",
    "input_hash",
    "iter_refs",
    "json_type",
    "parse_pointer",
    "pointer_get",
    "resolve",
    "resolve_ref",
]

REF_SOURCES: Final = frozenset({"input", "state", "output", "item", "signal", "literal"})
REF_KEYS: Final = frozenset({"from", "pointer", "value"})


class _Absent:
    """Marks a scope entry that does not exist here (distinct from a JSON null)."""

    _instance: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


class Scope(NamedTuple):
    """What references can read. Leave out what does not exist here: e.g. `item` outside
    a mapped node, `output` before a step finished, `signal` outside a wait node. (Immutable
    like a frozen dataclass, but built in a third of the time: one or two per input record.)"""

    input: Any = ABSENT
    state: Any = ABSENT
    output: Any = ABSENT
    item: Any = ABSENT
    signal: Any = ABSENT


def resolve(template: Any, scope: Scope) -> Any:
    """Resolve every reference inside `template`; returns a new value (never shares
    containers with `template`, though values read from the scope are shared)."""
    if isinstance(template, dict):
        if "from" in template:
            return resolve_ref(template, scope)
        return {key: resolve(value, scope) for key, value in template.items()}
    if isinstance(template, list):
        return [resolve(value, scope) for value in template]
    if isinstance(template, Ref):
        return resolve_ref(template.to_template(), scope)
    return template


def resolve_ref(ref: dict[str, Any], scope: Scope) -> Any:
    source = ref.get("from")
    pointer = ref.get("pointer", "")
    if source == "literal":
        base = ref.get("value")
    elif source in REF_SOURCES:
        base = getattr(scope, source)
        if base is ABSENT:
            raise RefError(f"no {source!r} in this scope")
    else:
        raise RefError(f"unknown reference source {source!r}")
    if not isinstance(pointer, str):
        raise RefError(f"pointer of a {source!r} reference must be a string")
    try:
        return pointer_get(base, pointer)
    except KeyError as exc:
        raise RefError(f"{pointer} not found in {source}: {exc.args[0]}") from None


@lru_cache(maxsize=4096)
def parse_pointer(pointer: str) -> tuple[str, ...]:
    """RFC 6901: `""` is the whole document, else `/`-separated tokens with `~1` → `/`, `~0` → `~`."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer must be empty or start with '/': {pointer!r}")
    tokens = pointer[1:].split("/")
    return tuple(token.replace("~1", "/").replace("~0", "~") if "~" in token else token for token in tokens)


def pointer_get(doc: Any, pointer: str) -> Any:
    """The value at `pointer` in `doc`. Raises `KeyError(reason)` when it does not exist
    (the reason names the failing token, never a value)."""
    try:
        tokens = parse_pointer(pointer)
    except ValueError as exc:
        raise KeyError(str(exc)) from None
    current = doc
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                raise KeyError(f"no key {token!r}")
            current = current[token]
        elif isinstance(current, list):
            if not _is_index(token):
                raise KeyError(f"{token!r} is not an array index")
            index = int(token)
            if index >= len(current):
                raise KeyError(f"index {index} out of range")
            current = current[index]
        else:
            raise KeyError(f"cannot descend into a {json_type(current)} at {token!r}")
    return current


def _is_index(token: str) -> bool:
    # RFC 6901: digits without leading zeros; "-" (past the end) never exists for reads
    return token.isdigit() and token.isascii() and (token == "0" or not token.startswith("0"))


def json_type(value: Any) -> str:
    """The JSON type name of a value, for error messages (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: orjson with sorted keys (the hash and digest form)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def input_hash(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of a resolved input."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def iter_refs(template: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every reference in a template with its path (`.a[0].b`-style), for validation."""
    found: list[tuple[str, dict[str, Any]]] = []
    _collect_refs(template, path, found)
    return found


def _collect_refs(template: Any, path: str, found: list[tuple[str, dict[str, Any]]]) -> None:
    if isinstance(template, dict):
        if "from" in template:
            found.append((path, template))
            return
        for key, value in template.items():
            _collect_refs(value, f"{path}.{key}" if path else str(key), found)
    elif isinstance(template, list):
        for index, value in enumerate(template):
            _collect_refs(value, f"{path}[{index}]", found)
