"""Finding secret material written as a literal (in definitions, run inputs, outputs).

A value is flagged when

1. it is a string starting with `capability://`, `Bearer ` (any case), `sk-`, `ghp_`,
   `github_pat_`, `xox[bpas]-` (Slack), `AKIA` + 16 upper-case letters/digits (AWS
   access key id) or `-----BEGIN ... PRIVATE KEY`; or
2. it is a non-empty scalar (string or number) held under a *secret-looking key*.

A key is secret-looking when, split into words (on `_`, `-`, `.`, spaces and camelCase),
some word — or two adjacent words joined — is one of `secret(s)`, `token`, `password`,
`passwd`, `passphrase`, `credential(s)`, `apikey`, `accesskey`, `accesstoken`,
`secretkey`, `privatekey`, `clientsecret`, `authtoken`, `refreshtoken`, `authorization`. Words are whole:
`tokens` and `tokenizer` are not `token`. A key is *not* secret-looking if it also has a
word that makes it a count or a name: `max`, `min`, `count`, `limit`, `used`, `usage`,
`budget`, `total`, `num`, `size`, `length`, `estimate`, `name`, `ref`, `handle`, `id`.
So `api_key`, `apiKey`, `X-Api-Key`, `access_token`, `password` are secret keys, while
`max_tokens`, `tokens_used`, `token_count`, `secret_name` are not.

A key that is itself a secret-looking value (rule 1: `{"sk-...": 1}`) is flagged too; its
path names it `<secret-looking key N>` (its position), never its text.

`{"$secret": "<name>"}` is a handle resolved only inside an executor; it is allowed
anywhere. Nulls, booleans and empty strings under a secret key hold no material and
pass, and so do references (`{"from": ..., "pointer": ...}` under a secret key): what they
resolve to is checked where the value appears at run time. The other keys of an object with
a `from` key are checked like any object's (in run data `from` is only a key).
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import pairwise
from typing import Any, Final

SECRET_WORDS: Final = frozenset(
    {
        "secret",
        "secrets",
        "token",
        "password",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "apikey",
        "accesskey",
        "accesstoken",
        "secretkey",
        "privatekey",
        "clientsecret",
        "authtoken",
        "refreshtoken",
        "authorization",
    }
)
NOT_SECRET_WORDS: Final = frozenset(
    {
        "max",
        "min",
        "count",
        "limit",
        "used",
        "usage",
        "budget",
        "total",
        "num",
        "size",
        "length",
        "estimate",
        "name",
        "ref",
        "handle",
        "id",
    }
)
SECRET_PREFIXES: Final = ("capability://", "sk-", "ghp_", "github_pat_")
_SECRET_VALUE = re.compile(
    r"^(?:bearer\s|xox[bpas]-|AKIA[0-9A-Z]{16}\b)|-----BEGIN [A-Z ]*PRIVATE KEY-----", re.IGNORECASE
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_handle(value: Any) -> bool:
    """`{"$secret": "<name>"}` with a non-empty name and nothing else."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("$secret"), str)
        and bool(value["$secret"])
    )


@lru_cache(maxsize=8192)
def is_secret_key(key: str) -> bool:
    words = [word.lower() for word in _WORD_SPLIT.split(key) if word]
    if any(word in NOT_SECRET_WORDS for word in words):
        return False
    if any(word in SECRET_WORDS for word in words):
        return True
    return any(a + b in SECRET_WORDS for a, b in pairwise(words))


def is_secret_value(value: str) -> bool:
    return value.startswith(SECRET_PREFIXES) or _SECRET_VALUE.search(value) is not None


def find_secret_literals(value: Any, path: str = "") -> list[str]:
    """Paths (`nodes.call.input.api_key`, list items `[0]`) of every secret literal in `value`."""
    found: list[str] = []
    _walk(value, path, False, found)
    return found


def _walk(value: Any, path: str, under_secret_key: bool, found: list[str]) -> None:
    if isinstance(value, str):
        if is_secret_value(value) or (under_secret_key and value):
            found.append(path)
    elif isinstance(value, dict):
        if is_secret_handle(value):
            return
        # A reference's own parts (`from`, `pointer`) carry no material; a literal's `value` is
        # checked as if it stood where the reference does. Every other key is walked as in any
        # object: in run data (inputs, payloads, outputs) `from` means nothing, and an object
        # must not hide `{"from": 1, "password": "..."}` behind it.
        literal = "from" in value and value.get("from") == "literal"
        for index, (key, item) in enumerate(value.items()):
            key_text = shown = str(key)
            if is_secret_value(key_text):  # material as a key: flagged, and never named in a path
                shown = f"<secret-looking key {index}>"
                found.append(f"{path}.{shown}" if path else shown)
            inherit = literal and key == "value"
            child = f"{path}.{shown}" if path else shown
            _walk(item, child, under_secret_key if inherit else is_secret_key(key_text), found)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", under_secret_key, found)
    elif under_secret_key and isinstance(value, (int, float)) and not isinstance(value, bool):
        found.append(path)
