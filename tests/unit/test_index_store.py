"""The index database on its own: paging is exact under ties, hostile cursors and filters are
refused with a clear error, an index refuses another prefix and a newer schema."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.index.projection import accept
from processors.index.settings import parse_time
from processors.index.store import (
    Batch,
    CursorError,
    IndexError_,
    RunFilter,
    SQLiteIndex,
    describe,
    encode_cursor,
)


def _accepted(i: int, created: int, team: str) -> dict:
    return {
        "type": "RunAccepted",
        "run_id": f"r{i:03d}",
        "sequence": 1,
        "ts_ms": created,
        "definition_id": "d",
        "revision": 1,
        "bundle_hash": "h",
        "labels": {"team": team},
        "budgets": {},
    }


@settings(max_examples=40, deadline=None)
@given(
    created=st.lists(st.integers(0, 5), min_size=0, max_size=40),  # many ties in created_ms
    limit=st.integers(1, 7),
    team=st.sampled_from(["a", "b", None]),
)
def test_paging_returns_every_matching_run_once_newest_first(
    created: list[int], limit: int, team: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = SQLiteIndex(Path(tmp) / "i.sqlite")
        runs = [accept(_accepted(i, c, "a" if i % 2 else "b")) for i, c in enumerate(created)]
        index.write(Batch(runs=runs, new_runs=runs, offsets={("t", 0): len(runs)}))
        f = RunFilter(labels=(("team", team),)) if team else RunFilter()
        seen: list[str] = []
        cursor = None
        while True:
            page = index.search(f, limit=limit, cursor=cursor)
            assert len(page.runs) <= limit
            seen += [r["run_id"] for r in page.runs]
            cursor = page.next_cursor
            if cursor is None:
                break
        expected = sorted(
            (r for r in runs if team is None or r.labels["team"] == team),
            key=lambda r: (r.created_ms, r.run_id),
            reverse=True,
        )
        assert seen == [r.run_id for r in expected]
        assert sum(index.counts(f).values()) == len(expected)
        index.close()


@given(st.text(max_size=60) | st.binary(max_size=60).map(lambda b: b.hex()))
def test_a_hostile_cursor_is_a_cursor_error(cursor: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = SQLiteIndex(Path(tmp) / "i.sqlite")
        try:
            index.search(cursor=cursor)
        except CursorError as e:
            assert "not a cursor" in str(e)
        index.close()


def test_a_cursor_beyond_64_bits_is_a_cursor_error(tmp_path: Path) -> None:
    index = SQLiteIndex(tmp_path / "i.sqlite")
    with pytest.raises(CursorError):
        index.search(cursor=encode_cursor(2**64 - 1, "r"))
    index.close()


def test_bad_filters_limits_and_times_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown run status 'done'"):
        RunFilter(status=("done",))
    with tempfile.TemporaryDirectory() as tmp:
        index = SQLiteIndex(Path(tmp) / "i.sqlite")
        with pytest.raises(ValueError, match="limit must be between 1 and 10000"):
            index.search(limit=0)
        index.close()
    assert parse_time("2h", now_ms=10_000_000) == 10_000_000 - 7_200_000
    assert parse_time("2026-12-01T00:00:00Z") == parse_time("2026-12-01T00:00:00")
    assert parse_time("1764400000000") == 1764400000000
    with pytest.raises(ValueError, match="not a time: 'soon'"):
        parse_time("soon")


def test_an_index_refuses_another_prefix_and_a_newer_schema(tmp_path: Path) -> None:
    index = SQLiteIndex(tmp_path / "i.sqlite")
    index.bind_prefix("prod")
    index.bind_prefix("prod")
    with pytest.raises(IndexError_, match="indexes the topic prefix 'prod', not 'dev'"):
        index.bind_prefix("dev")
    index.reset()
    index.bind_prefix("dev")  # a rebuild may change it
    index.close()
    conn = sqlite3.connect(tmp_path / "i.sqlite")
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(IndexError_, match="schema 99, newer"):
        SQLiteIndex(tmp_path / "i.sqlite")
    with pytest.raises(IndexError_, match="no run index at"):
        SQLiteIndex(tmp_path / "missing.sqlite", readonly=True)


def test_a_postgres_url_is_printed_without_its_password() -> None:
    assert describe("postgresql://u:hunter2@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert describe("postgresql://u@db/x") == "postgresql://u@db/x"
    assert "hunter2" not in describe("postgres://u:hunter2@h/x")
