"""The run index in PostgreSQL (psycopg 3), for teams that run it: `--db postgresql://...`.

The same tables, the same SQL and the same one-transaction batches as the SQLite index
(store.py): only the connection differs — `%s` placeholders, BIGINT for the millisecond
columns, BYTEA for the event bodies, and a plain BEGIN.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from processors.index.store import _SCHEMA, IndexError_, SQLiteIndex, describe


class _Connection:
    """A psycopg connection that takes the SQLite index's `?` placeholders."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Any = None) -> Any:
        return self.conn.execute(sql.replace("?", "%s"), args or None)

    def executemany(self, sql: str, rows: list[Any]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), rows)

    def executescript(self, script: str) -> None:
        self.conn.execute(script)

    def close(self) -> None:
        self.conn.close()


_PG_SCHEMA = _SCHEMA.replace("INTEGER", "BIGINT").replace("BLOB", "BYTEA")


class PostgresIndex(SQLiteIndex):
    _BEGIN = "BEGIN"

    def __init__(self, dsn: str, *, readonly: bool = False) -> None:
        self.dsn = dsn
        self.readonly = readonly
        self._local = threading.local()
        try:
            if readonly:
                self._conn().execute("SELECT 1 FROM meta LIMIT 1")
            else:
                self._create_schema(_PG_SCHEMA)
        except psycopg.Error as e:
            raise IndexError_(f"the run index at {describe(dsn)}: {str(e).strip()}") from None

    def __str__(self) -> str:
        return describe(self.dsn)

    def _conn(self) -> Any:
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            raw = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            if self.readonly:
                raw.execute("SET default_transaction_read_only = on")
            conn = self._local.conn = _Connection(raw)
        return conn
