"""An independent leak detector for the security tests: the ways a secret can be written that
the worker promises to catch (docs/security.md), built here from the standard library alone so
that a bug in the product's redactor cannot hide a leak from the tests.

`leak_forms(secret)` gives (name, needle, case_sensitive) triples; `leaks(text, secret)` the
names of those found in `text` (str or bytes).
"""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus


def _b64_cores(raw: bytes) -> list[tuple[str, str]]:
    out = []
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode().rstrip("=")
        start, end = -(-8 * k // 6), (8 * (k + len(raw))) // 6
        core = enc[start:end]
        out += [(f"base64@{k}", core), (f"base64url@{k}", core.replace("+", "-").replace("/", "_"))]
    return out


def leak_forms(secret: str, partial: int = 8) -> list[tuple[str, str, bool]]:
    forms: list[tuple[str, str, bool]] = [
        ("raw", secret, False),
        ("url", quote(secret, safe=""), False),
        ("url+", quote_plus(secret, safe=""), False),
        ("json", json.dumps(secret)[1:-1], False),
        ("repr", repr(secret)[1:-1], False),
        ("repr-bytes", repr(secret.encode())[2:-1], False),
        ("hex", secret.encode().hex(), False),
    ]
    forms += [(name, core, True) for name, core in _b64_cores(secret.encode())]
    # partial runs: every window of `partial` characters of the raw value
    forms += [(f"partial@{i}", secret[i : i + partial], False) for i in range(0, len(secret) - partial + 1)]
    return forms


def leaks(text: str | bytes, secret: str) -> list[str]:
    """Names of the forms of `secret` that occur in `text`."""
    hay = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    if isinstance(text, bytes):
        hay += "\n" + text.decode("latin-1")  # raw bytes as they are, too
    lower = hay.lower()
    return [
        name
        for name, needle, exact in leak_forms(secret)
        if needle and (needle in hay if exact else needle.lower() in lower)
    ]
