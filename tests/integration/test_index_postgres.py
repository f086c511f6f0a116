"""The run index in a real PostgreSQL (Debian's, started by scripts/_postgres.sh in a temporary
directory): killed mid-ingest twice, resumed, and then row for row the same index as one built
in SQLite in a single pass from the same run events."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_index import REPO, client, settings, system  # noqa: F401  (the same fixtures)

from processors.client import RunClient
from processors.client.errors import CommandRejected
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
# not the offsets: a transaction marker the live processor commits after the last event moves
# one index's end offset and not the other's; the rows are what must be equal
TABLES = ("runs", "steps", "events", "run_labels", "rejections")


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    # not under pytest's tmp dir (0700): as root the server runs as the postgres user
    where = Path(tempfile.mkdtemp(prefix="runfold-pg-"))
    os.chmod(where, 0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = str(REPO / "scripts" / "_postgres.sh")
    started = subprocess.run(
        ["bash", script, "start", str(where / "pg"), str(port)], capture_output=True, text=True
    )
    if started.returncode != 0:
        reason = f"POSTGRESQL TESTS NOT RUN: no PostgreSQL could be started: {started.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", script, "stop", str(where / "pg")], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def _env(where: ProcessorSettings) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": where.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": where.topic_prefix,
    }


def _progress(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT COALESCE(SUM(next_offset), 0) FROM offsets").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:  # the schema is not created yet
        return 0


def _rows(fetch: Any) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for table in TABLES:
        rows = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in fetch(table)]
        out[table] = sorted(rows, key=repr)
    return out


def test_postgres_index_survives_kill_9_and_equals_the_sqlite_one(
    client: RunClient,  # noqa: F811
    system: None,  # noqa: F811
    settings: ProcessorSettings,  # noqa: F811
    postgres: str,
    tmp_path: Path,
) -> None:
    runs = [client.start("noop-3", {}, labels={"batch": str(i % 3)}) for i in range(40)]
    runs.append(client.start("flaky-retry", {"fail_times": 1, "key": "pg"}, labels={"kind": "flaky"}))
    runs.append(client.start("failing", {}))
    client.wait_all(runs, timeout=120)
    with pytest.raises(CommandRejected):  # a RunRejected, which the index keeps
        client.signal("nobody", "approval", {})
    time.sleep(1.0)
    args = [sys.executable, "-m", "processors.cli", "index", "run", "--db", postgres]
    for _ in range(2):
        proc = subprocess.Popen(
            [*args, "--batch-max", "7", "--commit-interval-ms", "1"],
            env=_env(settings),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        before = _progress(postgres)
        deadline = time.monotonic() + 60
        while _progress(postgres) < before + 40 and proc.poll() is None:
            assert time.monotonic() < deadline, "the ingest made no progress"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    mid = _progress(postgres)
    done = subprocess.run(
        [*args, "--once", "--json"], env=_env(settings), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["duplicates"] == 0
    lite = tmp_path / "one-pass.sqlite"
    one = subprocess.run(
        [*args[:-1], str(lite), "--once", "--json"],
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode == 0, one.stderr
    assert 0 < mid < json.loads(one.stdout)["records"]  # the kills landed mid-ingest
    with psycopg.connect(postgres, autocommit=True) as conn:
        in_pg = _rows(lambda t: conn.execute(f"SELECT * FROM {t}").fetchall())
    db = sqlite3.connect(lite)
    in_lite = _rows(lambda t: db.execute(f"SELECT * FROM {t}").fetchall())
    db.close()
    assert in_pg == in_lite
    # and runs list answers from PostgreSQL
    out = subprocess.run(
        [sys.executable, "-m", "processors.cli", "runs", "list", "--label", "kind=flaky", "--json"],
        env={**_env(settings), "RUNFOLD_INDEX_DB": postgres},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    [row] = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["status"] == "succeeded" and row["retries"] == 1 and row["attempts"] == 2
