"""How deeply a JSON value nests, checked against a bound before anything serializes it.

Every value a run takes in (an input, a signal payload, an output) is copied a few levels
deeper into events, step records and snapshots, and orjson refuses to serialize more than
254 levels ("Recursion limit reached") while the codec reads up to 1,024. So the engine
refuses a value nested deeper than the server ceiling `max_json_depth` at every ingress,
before its size is measured or its secrets are looked for (both walk it too).

Levels count containers: a scalar is level 0, `[]` and `{"a": 1}` are level 1, `[[1]]` is 2.
The walk stops as soon as it passes the bound, so a hostile value of any depth costs at most
`limit` frames of recursion.
"""

from __future__ import annotations

from typing import Any

import orjson

_CONTAINERS = (dict, list)


def json_size(value: Any) -> tuple[int, str]:
    """The bytes of `value` as JSON, and "" -- or 0 and why it is no JSON value at all. Off the
    wire every value is one (the codec decoded it), but `decide` is also called in process,
    where an integer beyond 64 bits, bytes, a set or a key that is not a string can arrive:
    it must refuse them as it refuses any bad message, never raise (semantics.md, Shape)."""
    try:
        return len(orjson.dumps(value)), ""
    except TypeError as e:  # orjson: "Integer exceeds 64-bit range", "Dict key must be str", ...
        return 0, f"is not a JSON value ({e})"


def too_deep(value: Any, limit: int, path: str) -> str | None:
    """The path (`input.a[0].b`) of the first container nested deeper than `limit` levels in
    `value`, or None if it nests at most `limit` levels."""
    trail = _deeper(value, limit)
    if trail is None:
        return None
    out = path
    for part in reversed(trail):
        out += f"[{part}]" if type(part) is int else (f".{part}" if out else str(part))
    return out


def _deeper(value: Any, budget: int) -> list[str | int] | None:
    """None, or the keys (innermost first) leading to a container past `budget` more levels."""
    if isinstance(value, dict):
        if budget <= 0:
            return []
        for key, item in value.items():
            if isinstance(item, _CONTAINERS):
                trail = _deeper(item, budget - 1)
                if trail is not None:
                    trail.append(str(key))
                    return trail
    elif isinstance(value, list):
        if budget <= 0:
            return []
        for index, item in enumerate(value):
            if isinstance(item, _CONTAINERS):
                trail = _deeper(item, budget - 1)
                if trail is not None:
                    trail.append(index)
                    return trail
    return None


def nesting_reason(what: str, where: str, limit: int) -> str:
    """The one wording of a refusal: names the path and the limit, never the value."""
    return f"{what} nests deeper than max_json_depth {limit} at {where}"
