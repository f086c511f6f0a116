"""`$secret` handles, resolved only inside the worker, scoped by the activation's capabilities.

A definition never holds secret material; it holds handles: `{"$secret": "github"}` (an
object with exactly that one key). A handle resolves only when the activation grants the
capability `secret:<name>` (the node's `capabilities` list), and only from the worker's own
secret store: environment variables `RUNFOLD_SECRET_<NAME>` (name upper-cased, every
non-alphanumeric character as `_`) plus any mapping given to the worker in code.

Every value resolved for an activation is remembered by its `SecretResolver`, so the
runner can redact failure messages and refuse outputs that echo a secret (`InvalidOutput`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from processors.executors.errors import ActionError

SECRET_KEY = "$secret"
ENV_PREFIX = "RUNFOLD_SECRET_"
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def capability_for(name: str) -> str:
    """The capability an activation must grant to resolve the handle `{"$secret": name}`."""
    return f"secret:{name}"


def env_var_for(name: str) -> str:
    return ENV_PREFIX + _NON_ALNUM.sub("_", name).upper()


def is_handle(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) == 1
        and SECRET_KEY in value
        and isinstance(value[SECRET_KEY], str)
        and bool(value[SECRET_KEY].strip())
    )


def contains_handle(value: Any) -> bool:
    """True when `value` holds a `$secret` key anywhere (well-formed handle or not)."""
    if isinstance(value, dict):
        return SECRET_KEY in value or any(contains_handle(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_handle(v) for v in value)
    return False


def contains_any(value: Any, secrets: Iterable[str]) -> bool:
    """True when any secret value occurs inside a string (or key) of `value`."""
    needles = [s for s in secrets if s]
    if not needles:
        return False

    def walk(v: Any) -> bool:
        if isinstance(v, str):
            return any(n in v for n in needles)
        if isinstance(v, dict):
            return any(walk(k) or walk(x) for k, x in v.items())
        if isinstance(v, list):
            return any(walk(x) for x in v)
        return False

    return walk(value)


class SecretStore:
    """Where secret material lives for this worker process: explicit values, then the environment."""

    def __init__(self, values: Mapping[str, str] | None = None, use_env: bool = True) -> None:
        self._values = dict(values or {})
        self._use_env = use_env

    def lookup(self, name: str) -> str | None:
        if name in self._values:
            return self._values[name]
        if self._use_env:
            return os.environ.get(env_var_for(name))
        return None


class SecretResolver:
    """Resolves handles for one activation: only the capabilities it grants, never more."""

    def __init__(self, store: SecretStore, capabilities: Iterable[str]) -> None:
        self._store = store
        self._granted = frozenset(capabilities)
        self.resolved: list[str] = []

    def get(self, name: str) -> str:
        """The secret `name`, if the activation grants `secret:<name>` and the store has it."""
        if capability_for(name) not in self._granted:
            raise ActionError(
                "PermissionDenied", f"secret {name!r} needs capability {capability_for(name)!r}", False
            )
        value = self._store.lookup(name)
        if value is None:
            raise ActionError("PermissionDenied", f"secret {name!r} is not configured on this worker", False)
        if value not in self.resolved:
            self.resolved.append(value)
        return value

    def resolve(self, value: Any) -> Any:
        """A copy of `value` with every handle replaced by its secret; malformed handles are refused."""
        if isinstance(value, dict):
            if SECRET_KEY in value:
                if not is_handle(value):
                    raise ActionError("InvalidInput", "malformed secret handle (want {\"$secret\": name})")
                return self.get(value[SECRET_KEY])
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value
