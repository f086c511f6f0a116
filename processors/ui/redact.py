"""What the UI shows of user data: secret-looking keys and values masked, whatever the source.

Run events are redacted by the executors and the engine refuses secret literals in definitions
and inputs, but the UI does not rely on it: every JSON value it renders passes through here,
with the engine's own rules for what looks like a secret (processors/engine/secrets.py): values
under secret-looking keys, secret-looking strings, and keys that are secret-looking strings."""

from __future__ import annotations

from typing import Any

from processors.engine.secrets import is_secret_handle, is_secret_key, is_secret_value

MASK = "***"


def mask(value: Any, under_secret_key: bool = False) -> Any:
    if isinstance(value, dict):
        if is_secret_handle(value):
            return value
        out: dict[Any, Any] = {}
        for index, (k, v) in enumerate(value.items()):
            inner = mask(v, under_secret_key or (isinstance(k, str) and is_secret_key(k)))
            if isinstance(k, str) and is_secret_value(k):  # material as a key: the key is masked too
                k = f"{MASK} (key {index})"
            out[k] = inner
        return out
    if isinstance(value, list):
        return [mask(v, under_secret_key) for v in value]
    if isinstance(value, str):
        if under_secret_key and value:
            return MASK
        return MASK if is_secret_value(value) else value
    if under_secret_key and isinstance(value, int | float) and not isinstance(value, bool):
        return MASK
    return value
