"""Where the run index lives: `RUNFOLD_INDEX_DB` (an SQLite file's path, or a `postgresql://`
URL), or the default file `.runfold/index.sqlite`."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

from processors.index.postgres import PostgresIndex
from processors.index.store import SQLiteIndex, default_path, is_dsn

INDEX_ENV = "RUNFOLD_INDEX_DB"


def configured_index() -> str | None:
    """The index RUNFOLD_INDEX_DB names, or None when no index is configured."""
    value = os.environ.get(INDEX_ENV, "").strip()
    return value or None


def index_path(explicit: str | Path | None = None) -> str:
    """The index to write: an explicit one, else RUNFOLD_INDEX_DB, else `.runfold/index.sqlite`."""
    if explicit:
        return str(explicit)
    return configured_index() or str(default_path())


def open_index(target: str | Path, *, readonly: bool = False) -> SQLiteIndex:
    """The index at `target`: PostgreSQL for a `postgresql://` URL, else an SQLite file."""
    if is_dsn(target):
        return PostgresIndex(str(target), readonly=readonly)
    return SQLiteIndex(target, readonly=readonly)


def open_reader(target: str | Path) -> SQLiteIndex:
    """A read-only handle on an index (its ingest writes it from another process)."""
    return open_index(target, readonly=True)


_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(text: str, *, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch from `2026-12-01T10:00:00Z` (ISO 8601; no zone: UTC), a
    duration before now (`90s`, `15m`, `2h`, `7d`) or epoch milliseconds (`1764400000000`)."""
    text = text.strip()
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    if text[-1:] in _UNITS and text[:-1].isascii() and text[:-1].isdigit():
        return _in_range(text, now - int(text[:-1]) * _UNITS[text[-1]])
    if text.isascii() and text.isdigit():
        return _in_range(text, int(text))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use ISO 8601 like 2026-12-01T10:00:00Z, a duration like 15m/2h/7d, "
            "or epoch milliseconds)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _in_range(text: str, ms: int) -> int:
    """`ms` if the database can hold it (a signed 64-bit integer), else a ValueError saying so."""
    if not -(2**63) <= ms < 2**63:
        raise ValueError(f"not a time: {text!r} is out of range")
    return ms
