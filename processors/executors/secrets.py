"""`$secret` handles, resolved only inside the worker, under two locks: the activation's
capabilities and the operator's secrets policy.

A definition never holds secret material; it holds handles: `{"$secret": "github"}` (an
object with exactly that one key). A handle resolves only when

1. the activation grants the capability `secret:<name>` (the node's `capabilities` list:
   the definition's author asks for it), and
2. the worker's `secrets_policy` has a rule for `<name>` whose `definitions` / `queues` match
   the activation's definition id and queue (the operator allows it: a definition cannot
   grant itself a secret), and
3. the worker's own secret store has a value: environment variables `RUNFOLD_SECRET_<NAME>`
   (name upper-cased, every non-alphanumeric character as `_`) plus any mapping given to the
   worker in code.

Anything else fails `PermissionDenied`, naming the rule, never the value. `http.request` then
checks the rule's `hosts` for the destination (`check_destination`).

Every value resolved for an activation is remembered by its `SecretResolver`; `redactor`
finds those values and every other value of the store (redaction.py: the common encodings
too), so the runner can redact failure messages and refuse outputs that echo a secret
(`InvalidOutput`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from processors.executors.destinations import first_match, origin_text, parse_entry, url_origin
from processors.executors.errors import ActionError
from processors.executors.redaction import MIN_SECRET_CHARS, Redactor, known_redactor, redactor_for, remember
from processors.executors.settings import SecretRule

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
    """True when any secret value occurs in `value`, in any form `Redactor` finds."""
    return redactor_for(secrets).contains(value)


class SecretStore:
    """Where secret material lives for this worker process: explicit values, then the environment."""

    def __init__(self, values: Mapping[str, str] | None = None, use_env: bool = True) -> None:
        self._values = dict(values or {})
        self._use_env = use_env
        self._known: list[str] | None = None

    def lookup(self, name: str) -> str | None:
        if name in self._values:
            return self._values[name]
        if self._use_env:
            return os.environ.get(env_var_for(name))
        return None

    def known_values(self) -> list[str]:
        """Every value this store holds (explicit ones and `RUNFOLD_SECRET_*`, read once): what
        is redacted everywhere, resolved for an activation or not."""
        if self._known is None:
            values = list(self._values.values())
            if self._use_env:
                values += [v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)]
            self._known = [v for v in values if len(v) >= MIN_SECRET_CHARS]  # shorter ones never resolve
            remember(self._known)
        return self._known


def _globs_match(patterns: list[str], value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


class SecretsPolicy:
    """The operator's rules (`WorkerSettings.secrets_policy`): no rule, no secret."""

    def __init__(self, rules: Mapping[str, SecretRule] | None = None) -> None:
        self.rules = dict(rules or {})
        self._hosts = {name: [parse_entry(h) for h in rule.hosts] for name, rule in self.rules.items()}

    def check_resolve(self, name: str, definition_id: str, queue: str) -> None:
        rule = self.rules.get(name)
        if rule is None:
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} is not in this worker's secrets policy "
                f"(no rule secrets_policy.{name}): it resolves for no activation",
                False,
            )
        if rule.definitions and not _globs_match(rule.definitions, definition_id):
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} may not be resolved for definition "
                f"{definition_id!r}: rule secrets_policy.{name}.definitions is {rule.definitions}",
                False,
            )
        if rule.queues and not _globs_match(rule.queues, queue):
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} may not be resolved on queue {queue!r}: "
                f"rule secrets_policy.{name}.queues is {rule.queues}",
                False,
            )

    def check_destination(self, name: str, url: httpx.URL) -> None:
        """`http.request` may send secret `name` to `url` (scheme, host and port all match)."""
        entries = self._hosts.get(name, [])
        if first_match(entries, url) is not None:
            return
        where = origin_text(*url_origin(url))
        if not entries:
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} may not be sent by http.request: rule secrets_policy.{name}.hosts is empty",
                False,
            )
        scheme, host, port = url_origin(url)
        if scheme == "http" and first_match(entries, url.copy_with(scheme="https", port=port)) is not None:
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} may be sent to {host} over https only "
                f"(rule secrets_policy.{name}.hosts has no http:// entry for {where})",
                False,
            )
        raise ActionError(
            "PermissionDenied",
            f"secret {name!r} may not be sent to {where}: rule "
            f"secrets_policy.{name}.hosts is {[e.text for e in entries]}",
            False,
        )


class SecretResolver:
    """Resolves handles for one activation: only what its capabilities grant and the policy
    allows for its definition and queue, never more."""

    def __init__(
        self,
        store: SecretStore,
        capabilities: Iterable[str],
        policy: SecretsPolicy | None = None,
        definition_id: str = "",
        queue: str = "",
    ) -> None:
        self._store = store
        self._granted = frozenset(capabilities)
        self._policy = policy if policy is not None else SecretsPolicy()
        self._definition_id = definition_id
        self._queue = queue
        self.resolved: list[str] = []
        self.resolved_names: list[str] = []

    def get(self, name: str) -> str:
        """The secret `name`, if the activation grants `secret:<name>`, the policy allows it
        here and the store has it."""
        if capability_for(name) not in self._granted:
            raise ActionError(
                "PermissionDenied", f"secret {name!r} needs capability {capability_for(name)!r}", False
            )
        self._policy.check_resolve(name, self._definition_id, self._queue)
        value = self._store.lookup(name)
        if value is None:
            raise ActionError("PermissionDenied", f"secret {name!r} is not configured on this worker", False)
        if len(value) < MIN_SECRET_CHARS:
            raise ActionError(
                "PermissionDenied",
                f"secret {name!r} is shorter than {MIN_SECRET_CHARS} characters: "
                "too short to be redacted reliably, so it is not used",
                False,
            )
        if value not in self.resolved:
            self.resolved.append(value)
            self.resolved_names.append(name)
            remember([value])
        return value

    def resolve(self, value: Any) -> Any:
        """A copy of `value` with every handle replaced by its secret; malformed handles are refused."""
        if isinstance(value, dict):
            if SECRET_KEY in value:
                if not is_handle(value):
                    raise ActionError("InvalidInput", 'malformed secret handle (want {"$secret": name})')
                return self.get(value[SECRET_KEY])
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value

    def check_destination(self, url: httpx.URL) -> None:
        """Every secret resolved so far may be sent to `url` (`http.request`)."""
        for name in self.resolved_names:
            self._policy.check_destination(name, url)

    @property
    def redactor(self) -> Redactor:
        """Finds every secret value this process knows: those resolved here or for any other
        activation, every value of the worker's store, the agent providers' API keys."""
        self._store.known_values()  # remembered once
        return known_redactor()
