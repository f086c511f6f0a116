"""Finding and redacting secret values in the common encodings a handler (or a remote server)
might turn them into.

A `Redactor` is built from secret values. It finds each value, and every run of at least
`PARTIAL_CHARS` consecutive characters of it (a partial secret), written

- as is, in any case (`GHP_ABC...`, `ghp_abc...`; non-ASCII letters as str.upper/lower give them);
- URL-encoded (`quote`, `quote_plus`, twice), JSON-escaped (with and without `\\uXXXX` for
  non-ASCII, with `\\/`, twice), as Python `repr` of the str or of its UTF-8 bytes, HTML-escaped, or
  as hex of its UTF-8 bytes: all in any ASCII case;
- in base64, standard or URL-safe alphabet, padded or not, at any of the three byte
  alignments (so also inside the base64 of a longer text, e.g. `Basic base64(user:secret)`).

Numbers are text here: a numeric secret returned as a JSON number is found in the output's
JSON (`contains`). What is not found: a value transformed otherwise (reversed, split into
pieces shorter than `PARTIAL_CHARS`, encrypted, encoded twice in base64...). The check catches
accidents and echoes, not a handler written to leak (see docs/security.md).

Search cost is a few `str.find` passes per secret over the text (in C), then a check of each
candidate: ~8 us per secret for an 800-character message, ~7 ms per secret for 1 MB.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

import orjson

REDACTED = "[redacted]"
# Runs shorter than this (of the value itself) are not looked for: a few characters of a secret
# occur in ordinary text by chance. Values shorter than MIN_SECRET_CHARS are refused by the
# resolver (secrets.py): they could not be found reliably.
PARTIAL_CHARS = 8
MIN_SECRET_CHARS = 8
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ESCAPED = re.compile(r'["\\\x00-\x1f]')  # what JSON escapes in a string


def _lower(text: str) -> str:
    """Lower case that keeps every index where it was: str.lower unless it changes the length
    (a few characters, e.g. "İ"), then ASCII letters only (the upper- and lower-cased secret are
    forms of their own, so a secret's non-ASCII letters are still found in either case)."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


def _base64_cores(raw: bytes) -> list[str]:
    """The base64 characters fully determined by `raw` when it starts at byte offset 0, 1 or 2
    of a 3-byte group, in both alphabets: what any base64 text that contains `raw` contains."""
    cores: list[str] = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode().rstrip("=")
        start, end = math.ceil(8 * k / 6), (8 * (k + len(raw))) // 6
        core = encoded[start:end]
        cores.append(core)
        cores.append(core.replace("+", "-").replace("/", "_"))
    return cores


_ENCODINGS: tuple[Callable[[str], str], ...] = (
    lambda s: s,
    str.upper,
    str.lower,
    lambda s: quote(s, safe=""),
    quote,
    lambda s: quote_plus(s, safe=""),
    lambda s: quote(quote(s, safe=""), safe=""),
    lambda s: json.dumps(s)[1:-1],
    lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    lambda s: json.dumps(json.dumps(s)[1:-1])[1:-1],  # JSON text inside a JSON string
    lambda s: repr(s)[1:-1],
    lambda s: repr(s.encode())[2:-1],
    lambda s: s.encode("unicode_escape").decode("ascii"),
    html.escape,
    lambda s: s.encode().hex(),
)


def _text_forms(secret: str) -> list[tuple[str, int]]:
    """Each text form of `secret` and the fewest characters a run of PARTIAL_CHARS characters
    of it takes in that form (the encodings work character by character: a run's encoding is a
    run of the form, as long as the sum of its characters' encodings)."""
    n = len(secret)
    window = min(PARTIAL_CHARS, n)
    out = []
    for encode in _ENCODINGS:
        form = encode(secret)
        widths = [len(encode(c)) for c in secret]
        run = sum(widths[:window])
        shortest = run
        for i in range(window, n):
            run += widths[i] - widths[i - window]
            shortest = min(shortest, run)
        # never more than the average-based bound this used before (an encoding not quite
        # character-wise, e.g. repr's choice of quotes, must not make a run harder to find)
        out.append((_lower(form), max(1, min(shortest, math.ceil(PARTIAL_CHARS * len(form) / n)))))
    return out


def _base64_run(secret: str) -> int:
    """The fewest base64 characters fully determined by the UTF-8 bytes of a run of
    PARTIAL_CHARS characters of `secret`, at the worst of the three byte alignments."""
    window = min(PARTIAL_CHARS, len(secret))
    nbytes = min(len(secret[i : i + window].encode()) for i in range(len(secret) - window + 1))
    return max(1, min((8 * (k + nbytes)) // 6 - math.ceil(8 * k / 6) for k in range(3)))


class _Form:
    """One encoded form of a secret and the probes that find any long enough run of it."""

    __slots__ = ("fold", "min_run", "probes", "text")

    def __init__(self, text: str, fold: bool, min_run: int) -> None:
        self.text = text
        self.fold = fold  # compared with the ASCII-lower-cased haystack
        self.min_run = min(min_run, len(text))
        # Probes of length P every S characters: any run of min_run characters contains a whole
        # probe (P = min_run - S + 1), so a run is never missed; each probe hit is then extended
        # both ways and kept only if the common run reaches min_run.
        step = max(1, self.min_run // 2)
        size = self.min_run - step + 1
        self.probes = [(i, text[i : i + size]) for i in range(0, len(text) - size + 1, step)]

    def spans(self, hay: str, stop_at_first: bool) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        text, n, m = self.text, len(self.text), len(hay)
        for offset, probe in self.probes:
            at = hay.find(probe)
            while at >= 0:
                left = 0
                while at - left > 0 and offset - left > 0 and hay[at - left - 1] == text[offset - left - 1]:
                    left += 1
                right = len(probe)
                while at + right < m and offset + right < n and hay[at + right] == text[offset + right]:
                    right += 1
                if left + right >= self.min_run:
                    out.append((at - left, at + right))
                    if stop_at_first:
                        return out
                at = hay.find(probe, at + 1)
        return out


class Redactor:
    """Finds and redacts `secrets` in their common encodings (see the module docstring)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = tuple(sorted({s for s in secrets if s}))
        seen: set[tuple[str, bool]] = set()
        self._forms: list[_Form] = []
        for secret in self.secrets:
            b64_run = _base64_run(secret)
            candidates = [(f, True, run) for f, run in _text_forms(secret)]
            candidates += [(f, False, b64_run) for f in _base64_cores(secret.encode())]
            for text, fold, min_run in candidates:
                if text and (text, fold) not in seen:
                    seen.add((text, fold))
                    self._forms.append(_Form(text, fold, min_run))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def _spans(self, text: str, stop_at_first: bool) -> list[tuple[int, int]]:
        if not self._forms or not text:
            return []
        lowered = _lower(text)
        out: list[tuple[int, int]] = []
        for form in self._forms:
            out += form.spans(lowered if form.fold else text, stop_at_first)
            if out and stop_at_first:
                break
        return out

    def find(self, text: str) -> bool:
        """True when `text` holds a secret, or a run of PARTIAL_CHARS of one, in any form."""
        return bool(self._spans(text, stop_at_first=True))

    def redact(self, text: str) -> str:
        """`text` with every occurrence (any form, partial runs too) replaced by `[redacted]`."""
        spans = sorted(self._spans(text, stop_at_first=False))
        if not spans:
            return text
        parts: list[str] = []
        cursor = 0
        start, end = spans[0]
        for s, e in spans[1:]:
            if s <= end:
                end = max(end, e)
                continue
            parts += [text[cursor:start], REDACTED]
            cursor, (start, end) = end, (s, e)
        parts += [text[cursor:start], REDACTED, text[end:]]
        return "".join(parts)

    def contains(self, value: Any) -> bool:
        """True when a JSON-able `value` holds a secret anywhere: in a string, a key, or as a
        number. Searched in its JSON text (one pass, in C); strings that JSON escapes (a quote,
        a backslash, a control character) are searched once more as they are, so a form with
        its own escapes (JSON-in-JSON, repr) is not hidden by a second escaping."""
        if not self._forms:
            return False
        try:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            text = repr(value)
        if self.find(text):
            return True
        if "\\" not in text:
            return False
        escaped: list[str] = []
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if _ESCAPED.search(item):
                    escaped.append(item)
            elif isinstance(item, dict):
                stack.extend(k for k in item if isinstance(k, str))
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)
        return self.find("\0".join(escaped))


@lru_cache(maxsize=256)
def _cached(secrets: frozenset[str]) -> Redactor:
    return Redactor(secrets)


def redactor_for(secrets: Iterable[str]) -> Redactor:
    """A (cached) Redactor for these values: activations that resolve the same secrets share one."""
    return _cached(frozenset(s for s in secrets if s))


# Every secret value this process has resolved, holds in a secret store or uses as an agent
# provider's API key: what receipts, log records (log_redaction.py) and metric labels are
# redacted of, whichever activation resolved it.
_known: set[str] = set()


def remember(values: Iterable[str]) -> None:
    _known.update(v for v in values if len(v) >= MIN_SECRET_CHARS)


def known_redactor() -> Redactor:
    # frozenset(set) copies in C, under the GIL: a pool thread's remember() cannot change the
    # set while it is read (iterating it in Python could raise "Set changed size during iteration").
    return _cached(frozenset(_known))
