"""Merging the writes of one superstep into state, and `state` node mutations.

All writes of a superstep were computed from the same base state; at the barrier they
are applied in the deterministic order `(node, lineage)` (lineage `""` first, then map
indices numerically) through each key's reducer:

- `replace`: the last writer in that order wins;
- `append`: the current list (null = []) extended by a list, or with one scalar item;
- `merge`: shallow dict merge (null = {}), later keys win;
- `sum`: numeric sum (null = 0); `max`: numeric maximum (null = the write);
- `reject_concurrent`: like `replace`, but more than one writer in a superstep is a
  `ReducerConflict`.

Booleans are not numbers here (JSON keeps them apart). Nothing is mutated in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from processors.engine.definition import Reducer
from processors.engine.errors import ReducerConflict, ReducerTypeError
from processors.engine.refs import json_type as _type

Write = tuple[str, str, str, Any]  # (state key, node, lineage, value)

REDUCERS: Final = frozenset({"replace", "append", "merge", "sum", "max", "reject_concurrent"})


def lineage_order(lineage: str) -> int:
    """`""` (not mapped) sorts before map index 0."""
    return int(lineage) if lineage else -1


def merge(policy: Reducer | str, current: Any, incoming: Any, key: str = "") -> Any:
    """Merge one incoming write into the current value of a state key."""
    if policy in ("replace", "reject_concurrent"):
        return incoming
    if policy == "append":
        base = [] if current is None else current
        if not isinstance(base, list):
            raise ReducerTypeError(key, f"append needs a list in state, found {_type(current)}")
        return [*base, *incoming] if isinstance(incoming, list) else [*base, incoming]
    if policy == "merge":
        base = {} if current is None else current
        if not isinstance(base, dict) or not isinstance(incoming, dict):
            raise ReducerTypeError(
                key, f"merge needs objects, found {_type(current)} in state and {_type(incoming)} written"
            )
        return {**base, **incoming}
    if policy in ("sum", "max"):
        if not _is_number(incoming) or not (current is None or _is_number(current)):
            raise ReducerTypeError(
                key, f"{policy} needs numbers, found {_type(current)} in state and {_type(incoming)} written"
            )
        if current is None:
            return incoming
        return current + incoming if policy == "sum" else max(current, incoming)
    raise ReducerTypeError(key, f"unknown reducer {policy!r}")


def apply_writes(
    state: Mapping[str, Any], writes: Iterable[Write], reducers: Mapping[str, str]
) -> dict[str, Any]:
    """A new state with every write merged in deterministic order. Raises
    `ReducerConflict` / `ReducerTypeError` (with the key) — the run fails with code `State`."""
    ordered = sorted(writes, key=lambda w: (w[1], lineage_order(w[2])))
    by_key: dict[str, list[Write]] = {}
    for write in ordered:
        by_key.setdefault(write[0], []).append(write)
    new_state = dict(state)
    for key, key_writes in by_key.items():
        if key not in new_state:
            raise ReducerTypeError(key, "not a declared state key")
        policy = reducers.get(key, "replace")
        if policy == "reject_concurrent" and len(key_writes) > 1:
            raise ReducerConflict(key, [(node, lineage) for _, node, lineage, _ in key_writes])
        value = new_state[key]
        for _, _, _, incoming in key_writes:
            value = merge(policy, value, incoming, key)
        new_state[key] = value
    return new_state


def apply_mutations(state: Mapping[str, Any], mutations: Iterable[tuple[str, str, Any]]) -> dict[str, Any]:
    """Apply resolved `(op, target, value)` mutations of a `state` node, in order:

    - `set`: the target becomes `value`;
    - `increment`: numeric add (`value` null = 1; state null = 0);
    - `append`: as the `append` reducer (a list extends, a scalar is one item);
    - `remove`: from a list, every item equal to `value`; from an object, the key
      `value`; with `value` null, the target becomes null.
    """
    new_state = dict(state)
    for op, target, value in mutations:
        if target not in new_state:
            raise ReducerTypeError(target, "not a declared state key")
        current = new_state[target]
        if op == "set":
            new_state[target] = value
        elif op == "increment":
            new_state[target] = merge("sum", current, 1 if value is None else value, target)
        elif op == "append":
            new_state[target] = merge("append", current, value, target)
        elif op == "remove":
            new_state[target] = _remove(current, value, target)
        else:
            raise ReducerTypeError(target, f"unknown mutation {op!r}")
    return new_state


def _remove(current: Any, value: Any, key: str) -> Any:
    if value is None:
        return None
    if isinstance(current, list):
        return [item for item in current if not _json_equal(item, value)]
    if isinstance(current, dict):
        if not isinstance(value, str):
            raise ReducerTypeError(key, f"remove from an object needs a string key, got {_type(value)}")
        return {k: v for k, v in current.items() if k != value}
    raise ReducerTypeError(key, f"remove needs a list or object in state, found {_type(current)}")


def _json_equal(a: Any, b: Any) -> bool:
    # Python says True == 1; JSON does not
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
