"""The run index's database: SQLite (stdlib `sqlite3`, WAL) by default, one file.

One writer (the ingest) and any number of readers (the CLI, the UI): WAL lets readers read
while the writer writes. Every batch the ingest writes — run rows, step rows, events,
rejections *and the consumed offsets* — is one transaction, so the offsets in the database
always describe exactly the rows in it: a crash at any point resumes from the offsets of the
last committed batch and neither loses nor double-counts an event.

`synchronous=NORMAL` in WAL mode: a committed transaction survives the process being killed
(kill -9); after a power loss the last transactions may be rolled back *together with their
offsets*, so the ingest re-reads them: still exact.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from processors.engine.vocabulary import RUN_STATUSES
from processors.index.projection import RunRow, StepRow

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    definition_id TEXT NOT NULL, revision INTEGER NOT NULL, bundle_hash TEXT NOT NULL,
    status TEXT NOT NULL, phase TEXT NOT NULL, superstep INTEGER NOT NULL,
    labels TEXT NOT NULL, budgets TEXT NOT NULL,
    parent_run_id TEXT, parent_node TEXT, root_run_id TEXT NOT NULL, depth INTEGER NOT NULL,
    created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, finished_ms INTEGER,
    sequence INTEGER NOT NULL,
    steps INTEGER NOT NULL, instances INTEGER NOT NULL, attempts INTEGER NOT NULL, retries INTEGER NOT NULL, agents INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
    failure_code TEXT, failure_message TEXT, failure_node TEXT,
    pause_code TEXT, pause_reason TEXT, cancel_reason TEXT,
    signals INTEGER NOT NULL, partition INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_ms DESC, run_id DESC);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_ms DESC, run_id DESC);
CREATE INDEX IF NOT EXISTS runs_by_definition ON runs (definition_id, created_ms DESC, run_id DESC);
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_by_failure ON runs (failure_code) WHERE failure_code IS NOT NULL;
-- labels never change after RunAccepted: one row per (run, key), created_ms copied so that a
-- label filter walks newest first
CREATE TABLE IF NOT EXISTS run_labels (
    run_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, created_ms INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX IF NOT EXISTS labels_by_value ON run_labels (key, value, created_ms DESC, run_id DESC);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, key TEXT NOT NULL, node TEXT NOT NULL, lineage TEXT NOT NULL,
    kind TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL, first_attempt INTEGER NOT NULL,
    activations INTEGER NOT NULL, superstep INTEGER NOT NULL, queue TEXT, dispatch_id TEXT,
    scheduled_ms INTEGER, started_ms INTEGER, finished_ms INTEGER, worker_id TEXT, retry_due_ms INTEGER,
    failure_code TEXT, failure_message TEXT,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
    reason TEXT, waiting INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, sequence INTEGER NOT NULL, type TEXT NOT NULL, ts_ms INTEGER NOT NULL,
    node TEXT, lineage TEXT, attempt INTEGER, body BLOB NOT NULL,
    PRIMARY KEY (run_id, sequence)
);
CREATE TABLE IF NOT EXISTS rejections (
    partition INTEGER NOT NULL, record_offset INTEGER NOT NULL,
    run_id TEXT NOT NULL, ts_ms INTEGER NOT NULL, command_type TEXT NOT NULL, code TEXT NOT NULL,
    reason TEXT NOT NULL, definition_id TEXT, revision INTEGER,
    PRIMARY KEY (partition, record_offset)
);
CREATE INDEX IF NOT EXISTS rejections_by_run ON rejections (run_id);
"""

_RUN_COLUMNS = (
    "run_id, definition_id, revision, bundle_hash, status, phase, superstep, labels, budgets, "
    "parent_run_id, parent_node, root_run_id, depth, created_ms, updated_ms, finished_ms, sequence, "
    "steps, instances, attempts, retries, agents, prompt_tokens, completion_tokens, cost_micros, "
    "failure_code, failure_message, failure_node, pause_code, pause_reason, cancel_reason, signals, partition"
)
_STEP_COLUMNS = (
    "run_id, key, node, lineage, kind, status, attempt, first_attempt, activations, superstep, queue, "
    "dispatch_id, scheduled_ms, started_ms, finished_ms, worker_id, retry_due_ms, failure_code, "
    "failure_message, prompt_tokens, completion_tokens, cost_micros, reason, waiting"
)


def _upsert(table: str, columns: str, key: str) -> str:
    names = [c.strip() for c in columns.split(",")]
    keys = {k.strip() for k in key.split(",")}
    updates = ", ".join(f"{c} = excluded.{c}" for c in names if c not in keys)
    marks = ", ".join("?" for _ in names)
    return f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT ({key}) DO UPDATE SET {updates}"


_UPSERT_RUN = _upsert("runs", _RUN_COLUMNS, "run_id")
_UPSERT_STEP = _upsert("steps", _STEP_COLUMNS, "run_id, key")


class IndexError_(RuntimeError):
    """The index database cannot be used as asked (another topic prefix, a newer schema, ...)."""


class CursorError(ValueError):
    """A paging cursor that this index did not hand out."""


def _run_tuple(r: RunRow) -> tuple[Any, ...]:
    return (
        r.run_id, r.definition_id, r.revision, r.bundle_hash, r.status(), r.phase, r.superstep,
        orjson.dumps(r.labels, option=orjson.OPT_SORT_KEYS).decode(), orjson.dumps(r.budgets).decode(),
        r.parent_run_id, r.parent_node, r.root_run_id, r.depth, r.created_ms, r.updated_ms, r.finished_ms,
        r.sequence, r.ledger_steps, len(r.steps), r.attempts, r.retries, r.agents, r.prompt_tokens, r.completion_tokens,
        r.cost_micros, r.failure_code, r.failure_message, r.failure_node, r.pause_code, r.pause_reason,
        r.cancel_reason, r.signals, r.partition,
    )  # fmt: skip


def _step_tuple(s: StepRow) -> tuple[Any, ...]:
    return (
        s.run_id, s.key, s.node, s.lineage, s.kind, s.status, s.attempt, s.first_attempt, s.activations,
        s.superstep, s.queue, s.dispatch_id, s.scheduled_ms, s.started_ms, s.finished_ms, s.worker_id,
        s.retry_due_ms, s.failure_code, s.failure_message, s.prompt_tokens, s.completion_tokens,
        s.cost_micros, s.reason, int(s.waiting),
    )  # fmt: skip


@dataclass
class Batch:
    """What one ingest transaction writes."""

    runs: list[RunRow] = field(default_factory=list)  # changed runs (their dirty steps with them)
    new_runs: list[RunRow] = field(default_factory=list)  # accepted in this batch (labels)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    rejections: list[tuple[Any, ...]] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> next


MAX_LABEL_FILTERS = 32  # each is a condition of the query: SQLite refuses a tree of ~1,000


@dataclass(frozen=True)
class RunFilter:
    """What `search` and `counts` select. Every field narrows; None / empty: no condition."""

    status: tuple[str, ...] = ()
    definition_id: str | None = None
    revision: int | None = None
    labels: tuple[tuple[str, str | None], ...] = ()  # (key, value); value None: the key is present
    since_ms: int | None = None  # created at or after
    until_ms: int | None = None  # created before
    parent_run_id: str | None = None
    root_run_id: str | None = None
    failure_code: str | None = None

    def __post_init__(self) -> None:
        bad = [s for s in self.status if s not in RUN_STATUSES]
        if bad:
            raise ValueError(f"unknown run status {bad[0]!r}: expected one of {', '.join(RUN_STATUSES)}")
        if len(self.labels) > MAX_LABEL_FILTERS:
            raise ValueError(f"{len(self.labels)} label filters: at most {MAX_LABEL_FILTERS}")
        object.__setattr__(self, "status", tuple(dict.fromkeys(self.status)))  # each once


@dataclass
class Page:
    runs: list[dict[str, Any]]
    next_cursor: str | None  # pass back to get the next page; None: this was the last


def encode_cursor(created_ms: int, run_id: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([created_ms, run_id])).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        created_ms, run_id = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if type(created_ms) is not int or type(run_id) is not str or not -(2**63) <= created_ms < 2**63:
            raise ValueError
    except (ValueError, TypeError) as e:
        raise CursorError(f"not a cursor this index gave out: {cursor[:40]!r}") from e
    return created_ms, run_id


def _row_dict(cursor: Any, row: Sequence[Any]) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cursor.description, row, strict=True)}


def is_dsn(target: str | Path) -> bool:
    """A PostgreSQL URL (`postgresql://...`) rather than an SQLite file."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def describe(target: str | Path) -> str:
    """The target as safe to print: a URL's password masked."""
    text = str(target)
    if is_dsn(text):
        scheme, _, rest = text.partition("://")
        userinfo, at, host = rest.rpartition("@")
        if at and ":" in userinfo:
            text = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
        # libpq takes the password as a query parameter too: ...?password=...
        text = re.sub(r"([?&]password=)[^&#]*", r"\1***", text, flags=re.IGNORECASE)
    return text


def default_path() -> Path:
    """The index file when none is configured: under the project's data dir, `.runfold/`."""
    return Path(".runfold") / "index.sqlite"


class SQLiteIndex:
    """The index in one SQLite file. Thread-safe for readers (one connection per thread)."""

    _BEGIN = "BEGIN IMMEDIATE"

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._local = threading.local()
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Run inputs, outputs and state, like the run-events topic: for this user only (SQLite
            # gives its -wal and -shm files the database file's mode). An existing file keeps its own.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self._create_schema(_SCHEMA)
        elif not self.path.exists():
            raise IndexError_(f"no run index at {self.path}: start one with `runfold index run`")

    def __str__(self) -> str:
        return str(self.path)

    def _create_schema(self, schema: str) -> None:
        conn = self._conn()
        conn.executescript(schema)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise IndexError_(
                f"{self} holds index schema {row[0]}, newer than this runfold's ({SCHEMA_VERSION})"
            )

    # ---------------------------------------------------------------- connections
    def _conn(self) -> Any:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.readonly:
                conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
            else:
                conn = sqlite3.connect(self.path, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        conn = self._conn()
        conn.execute(self._BEGIN)
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # ---------------------------------------------------------------- ingest side
    def bind_prefix(self, prefix: str) -> None:
        """Remember which topic prefix this index holds; refuse to mix another one into it."""
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'topic_prefix'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('topic_prefix', ?)", (prefix,))
            elif row[0] != prefix:
                raise IndexError_(
                    f"{self} indexes the topic prefix {row[0]!r}, not {prefix!r}: "
                    "use another index file (RUNFOLD_INDEX_DB) or --rebuild"
                )

    def offsets(self, topic: str) -> dict[int, int]:
        rows = self._conn().execute("SELECT partition, next_offset FROM offsets WHERE topic = ?", (topic,))
        return {int(p): int(o) for p, o in rows}

    def reset(self) -> None:
        """Forget every row and offset (a rebuild from the beginning of the topic)."""
        with self._tx() as db:
            for table in ("offsets", "runs", "run_labels", "steps", "events", "rejections"):
                db.execute(f"DELETE FROM {table}")
            db.execute("DELETE FROM meta WHERE key = 'topic_prefix'")

    def load_runs(self, run_ids: Iterable[str]) -> dict[str, RunRow]:
        """The projections of these runs as last written (for runs the ingest no longer caches)."""
        ids = list(run_ids)
        out: dict[str, RunRow] = {}
        conn = self._conn()
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            cur = conn.execute(f"SELECT * FROM runs WHERE run_id IN ({marks})", chunk)
            for row in cur.fetchall():
                d = _row_dict(cur, row)
                out[d["run_id"]] = _run_from_row(d)
            cur = conn.execute(f"SELECT * FROM steps WHERE run_id IN ({marks})", chunk)
            for row in cur.fetchall():
                d = _row_dict(cur, row)
                d["waiting"] = bool(d["waiting"])
                step = StepRow(**d)
                out[step.run_id].steps[step.key] = step
        return out

    def write(self, batch: Batch) -> None:
        with self._tx() as db:
            if batch.runs:
                db.executemany(_UPSERT_RUN, [_run_tuple(r) for r in batch.runs])
                steps = [_step_tuple(r.steps[k]) for r in batch.runs for k in r.dirty_steps]
                if steps:
                    db.executemany(_UPSERT_STEP, steps)
            labels = [(r.run_id, k, v, r.created_ms) for r in batch.new_runs for k, v in r.labels.items()]
            if labels:
                db.executemany(
                    "INSERT INTO run_labels VALUES (?, ?, ?, ?) ON CONFLICT (run_id, key) "
                    "DO UPDATE SET value = excluded.value, created_ms = excluded.created_ms",
                    labels,
                )
            if batch.events:
                db.executemany(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", batch.events
                )
            if batch.rejections:
                db.executemany(
                    "INSERT INTO rejections VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    batch.rejections,
                )
            db.executemany(
                "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                [(t, p, o) for (t, p), o in batch.offsets.items()],
            )

    # ---------------------------------------------------------------- read side
    def _where(self, f: RunFilter) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        if f.status:
            where.append(f"r.status IN ({','.join('?' * len(f.status))})")
            args.extend(f.status)
        for column, value in (
            ("definition_id", f.definition_id),
            ("revision", f.revision),
            ("parent_run_id", f.parent_run_id),
            ("root_run_id", f.root_run_id),
            ("failure_code", f.failure_code),
        ):
            if value is not None:
                where.append(f"r.{column} = ?")
                args.append(value)
        if f.since_ms is not None:
            where.append("r.created_ms >= ?")
            args.append(f.since_ms)
        if f.until_ms is not None:
            where.append("r.created_ms < ?")
            args.append(f.until_ms)
        for key, value in f.labels:
            if value is None:
                where.append("EXISTS (SELECT 1 FROM run_labels l WHERE l.run_id = r.run_id AND l.key = ?)")
                args.append(key)
            else:
                where.append(
                    "r.run_id IN (SELECT l.run_id FROM run_labels l WHERE l.key = ? AND l.value = ?)"
                )
                args.extend((key, value))
        return where, args

    def search(self, f: RunFilter = RunFilter(), *, limit: int = 50, cursor: str | None = None) -> Page:
        """Runs matching `f`, newest first (by creation, then run id), `limit` per page."""
        if not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be between 1 and 10000, not {limit}")
        where, args = self._where(f)
        if cursor:
            created_ms, run_id = decode_cursor(cursor)
            where.append("(r.created_ms < ? OR (r.created_ms = ? AND r.run_id < ?))")
            args.extend((created_ms, created_ms, run_id))
        sql = "SELECT r.* FROM runs r"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.created_ms DESC, r.run_id DESC LIMIT ?"
        cur = self._conn().execute(sql, [*args, limit + 1])
        rows = [_public_run(_row_dict(cur, row)) for row in cur.fetchall()]
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1]["created_ms"], rows[-1]["run_id"]) if more and rows else None
        return Page(rows, nxt)

    def counts(self, f: RunFilter = RunFilter()) -> dict[str, int]:
        """How many runs matching `f` (its status condition ignored) have each status."""
        where, args = self._where(RunFilter(**{**f.__dict__, "status": ()}))
        sql = "SELECT r.status, COUNT(*) FROM runs r"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " GROUP BY r.status"
        return {status: int(n) for status, n in self._conn().execute(sql, args)}

    def get(self, run_id: str) -> dict[str, Any] | None:
        cur = self._conn().execute("SELECT * FROM runs r WHERE run_id = ?", (run_id,))
        row = cur.fetchone()
        return _public_run(_row_dict(cur, row)) if row is not None else None

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        cur = self._conn().execute("SELECT * FROM steps WHERE run_id = ?", (run_id,))
        rows = [_row_dict(cur, row) for row in cur.fetchall()]
        for row in rows:
            row["waiting"] = bool(row["waiting"])
        rows.sort(key=lambda s: (s["node"], int(s["lineage"]) if s["lineage"] else -1))
        return rows

    def events(
        self, run_id: str, *, after_sequence: int = 0, limit: int = 10_000, types: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """The run's events (decoded, as on the topic), in sequence order."""
        sql = "SELECT body FROM events WHERE run_id = ? AND sequence > ?"
        args: list[Any] = [run_id, after_sequence]
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(types)
        sql += " ORDER BY sequence LIMIT ?"
        return [orjson.loads(b) for (b,) in self._conn().execute(sql, [*args, limit])]

    def children(self, run_id: str) -> list[dict[str, Any]]:
        cur = self._conn().execute(
            "SELECT * FROM runs r WHERE parent_run_id = ? ORDER BY created_ms, run_id", (run_id,)
        )
        return [_public_run(_row_dict(cur, row)) for row in cur.fetchall()]

    def rejections(self, limit: int = 100) -> list[dict[str, Any]]:
        cur = self._conn().execute("SELECT * FROM rejections ORDER BY ts_ms DESC LIMIT ?", (limit,))
        return [_row_dict(cur, row) for row in cur.fetchall()]

    def version(self) -> int:
        """Grows whenever the ingest wrote a batch (the sum of its next offsets): cheap to poll."""
        return int(self._conn().execute("SELECT COALESCE(SUM(next_offset), 0) FROM offsets").fetchone()[0])

    def stats(self) -> dict[str, Any]:
        conn = self._conn()
        prefix = conn.execute("SELECT value FROM meta WHERE key = 'topic_prefix'").fetchone()
        return {
            "path": str(self),
            "topic_prefix": prefix[0] if prefix else None,
            "runs": conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0],
            "events": conn.execute("SELECT COUNT(*) FROM events").fetchone()[0],
            "offsets": {
                f"{t}[{p}]": o for t, p, o in conn.execute("SELECT * FROM offsets ORDER BY topic, partition")
            },
        }


def _run_from_row(d: dict[str, Any]) -> RunRow:
    d = dict(d)
    d.pop("status")
    d["ledger_steps"] = d.pop("steps")
    d.pop("instances")
    d["labels"] = orjson.loads(d["labels"])
    d["budgets"] = orjson.loads(d["budgets"])
    return RunRow(**d)


def _public_run(d: dict[str, Any]) -> dict[str, Any]:
    d["labels"] = orjson.loads(d["labels"])
    d["budgets"] = orjson.loads(d["budgets"])
    return d
