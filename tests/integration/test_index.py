"""The run index against a real broker, a real processor and a real worker.

- the rows match the runs' real outcomes (status, usage, steps, attempts, labels, failures),
  `runfold runs list` answers from the index (filters, paging, --json) and says when it scans;
- following: a waiting run turns succeeded in the index once it is signalled;
- kill -9 of `runfold index run` in the middle of its ingest, then a restart: the index equals
  one built in a single clean pass (nothing lost, nothing counted twice).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running

import processors.demo.actions  # noqa: F401  (registers demo.flaky)
from processors.client import RunClient
from processors.client.errors import CommandRejected
from processors.executors import Worker
from processors.index import Indexer, RunFilter, SQLiteIndex
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "definitions"
APPROVAL = {
    "schema": "runfold.workflow/v1",
    "id": "approval",
    "revision": 1,
    "state": {"draft": None, "approved": False},
    "output": {"from": "state", "pointer": "/approved"},
    "entry": ["draft"],
    "nodes": {
        "draft": {"kind": "action", "action": "echo", "writes": {"draft": {"from": "output"}}},
        "review": {
            "kind": "wait",
            "signal": "approval",
            "writes": {"approved": {"from": "signal", "pointer": "/approved"}},
        },
    },
    "routes": {"draft": ["review"]},
}
FAILING = {
    "schema": "runfold.workflow/v1",
    "id": "failing",
    "revision": 1,
    "entry": ["boom"],
    "nodes": {"boom": {"kind": "action", "action": "no.such.action"}},
}


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


@pytest.fixture
def client(settings: ProcessorSettings) -> Iterator[RunClient]:
    with RunClient(
        KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix),
        timeout_s=10,
    ) as c:
        for name in ("one-step.yaml", "flaky-retry.yaml", "noop-3.yaml"):
            c.register(EXAMPLES / name)
        c.register(APPROVAL)
        c.register(FAILING)
        yield c


@pytest.fixture
def system(settings: ProcessorSettings) -> Iterator[None]:
    with running(settings), WorkerThread(Worker(name="index-test", queues=["default", "agents"]), settings):
        yield


def cli(
    settings: ProcessorSettings, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "processors.cli", *args], capture_output=True, text=True, env=full, timeout=120
    )


def test_rows_match_the_runs_outcomes_and_runs_list_uses_the_index(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    ok = [
        client.start("one-step", {"text": f"t{i}"}, labels={"team": "a" if i % 2 else "b"}) for i in range(4)
    ]
    flaky = client.start(
        "flaky-retry", {"fail_times": 2, "key": "idx"}, labels={"team": "a", "kind": "flaky"}
    )
    failing = client.start("failing", {}, labels={"team": "b"})
    waiting = client.start("approval", {"text": "draft"}, labels={"team": "a"})
    doomed = client.start("approval", {"text": "no"})
    outcomes = client.wait_all([*ok, flaky, failing], timeout=90)
    for ev in client.events(waiting, follow=True, timeout=30):
        if ev["type"] == "RunWaiting":
            break
    client.cancel(doomed, reason="not needed")
    assert client.wait(doomed, timeout=30).status == "cancelled"
    with pytest.raises(CommandRejected):  # answered by a RunRejected, which the index keeps
        client.signal("no-such-run", "approval", {"approved": True})

    db = tmp_path / "index.sqlite"
    index = SQLiteIndex(db)
    indexer = Indexer(settings, index)
    stop = threading.Event()
    thread = threading.Thread(target=indexer.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        assert indexer.caught_up.wait(60), "the index never caught up"
        deadline = time.monotonic() + 30
        while (index.get(waiting) or {}).get("status") != "waiting" or not index.rejections():
            assert time.monotonic() < deadline, (index.get(waiting), index.rejections())
            time.sleep(0.1)
        # the outcomes the client saw are the index's rows
        for rid, view in outcomes.items():
            row = index.get(rid)
            assert row is not None, rid
            events = list(client.events(rid))
            assert row["status"] == view.status and row["sequence"] == view.sequence == len(events)
            assert row["definition_id"] == view.definition_id and row["revision"] == view.revision
            assert row["created_ms"] == events[0]["ts_ms"] and row["finished_ms"] == events[-1]["ts_ms"]
            assert row["prompt_tokens"] == view.usage.get("prompt_tokens", 0)
            steps = {s["key"]: s for s in index.steps(rid)}
            assert {k: s["status"] for k, s in steps.items()} == {
                k: s["status"] for k, s in client.get(rid).steps().items()
            }
            assert [e["sequence"] for e in index.events(rid)] == list(range(1, len(events) + 1))
        flaky_row, flaky_step = index.get(flaky), index.steps(flaky)[0]
        assert flaky_row is not None and flaky_row["status"] == "succeeded"
        assert flaky_row["retries"] == 2 and flaky_row["attempts"] == 3 and flaky_step["attempt"] == 3
        assert flaky_row["labels"] == {"team": "a", "kind": "flaky"}
        failed_row = index.get(failing)
        assert failed_row is not None and failed_row["status"] == "failed"
        assert failed_row["failure_code"] == outcomes[failing].failure["code"]
        assert index.steps(failing)[0]["failure_code"] is not None
        cancelled = index.get(doomed)
        assert cancelled is not None and cancelled["status"] == "cancelled"
        assert cancelled["cancel_reason"] == "not needed"
        [rejection] = index.rejections()
        assert rejection["run_id"] == "no-such-run" and rejection["command_type"] == "SignalRun"
        # search: status + label, counts, paging
        team_a_ok = {r for r in ok if ok.index(r) % 2} | {flaky}
        found = index.search(RunFilter(status=("succeeded",), labels=(("team", "a"),)))
        assert {r["run_id"] for r in found.runs} == team_a_ok
        assert index.counts() == {"succeeded": 5, "failed": 1, "cancelled": 1, "waiting": 1}
        seen: list[str] = []
        cursor = None
        while True:
            page = index.search(limit=3, cursor=cursor)
            seen += [r["run_id"] for r in page.runs]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == 8
        # `runfold runs list` reads the index when RUNFOLD_INDEX_DB is set
        env = {"RUNFOLD_INDEX_DB": str(db)}
        out = cli(settings, "runs", "list", "--status", "succeeded", "--label", "team=a", "--json", env=env)
        assert out.returncode == 0, out.stderr
        assert {json.loads(line)["run_id"] for line in out.stdout.splitlines()} == team_a_ok
        out = cli(settings, "runs", "list", "--limit", "5", "--json", env=env)
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(lines) == 6 and "next_cursor" in lines[-1]
        out = cli(settings, "runs", "list", "--cursor", lines[-1]["next_cursor"], "--json", env=env)
        assert {json.loads(line)["run_id"] for line in out.stdout.splitlines()} | {
            r["run_id"] for r in lines[:-1]
        } == set(seen)
        out = cli(settings, "runs", "list", "--cursor", "garbage", env=env)
        assert out.returncode == 2 and "not a cursor" in out.stderr
        # without an index it says it scans, and refuses the index-only filters
        out = cli(settings, "runs", "list", "--json")
        assert out.returncode == 0 and "no run index" in out.stderr
        out = cli(settings, "runs", "list", "--label", "team=a")
        assert out.returncode == 2 and "RUNFOLD_INDEX_DB" in out.stderr
        # live: the signal turns the waiting run succeeded in the index
        client.signal(waiting, "approval", {"approved": True})
        assert client.wait(waiting, timeout=30).status == "succeeded"
        deadline = time.monotonic() + 30
        while (index.get(waiting) or {}).get("status") != "succeeded":
            assert time.monotonic() < deadline, index.get(waiting)
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(30)
    assert indexer.report.duplicates == 0 and not indexer.report.skipped


def _dump(db: Path) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        return {
            table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
            # not the offsets: a transaction marker committed after the last event (the live
            # processor's) moves one index's end offset and not the other's; the rows are the test
            for table in ("runs", "steps", "events", "run_labels", "rejections")
        }
    finally:
        conn.close()


def _indexed(db: Path) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(db, timeout=10)
    try:
        row = conn.execute("SELECT COALESCE(SUM(next_offset), 0) FROM offsets").fetchone()
        return int(row[0])
    except sqlite3.OperationalError:  # the schema is not created yet
        return 0
    finally:
        conn.close()


def test_kill_9_mid_ingest_resumes_without_loss_or_double_counting(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    runs = [client.start("noop-3", {}, labels={"batch": str(i % 3)}) for i in range(60)]
    client.wait_all(runs, timeout=120)
    # the whole log, ingested once cleanly first: each kill below waits for progress it can make
    clean = tmp_path / "clean.sqlite"
    out = cli(settings, "index", "run", "--db", str(clean), "--once", "--json")
    assert out.returncode == 0, out.stderr
    total = json.loads(out.stdout)["records"]
    end = _indexed(clean)  # the log's end, in offsets (transaction markers take offsets too)
    db = tmp_path / "killed.sqlite"
    args = ["index", "run", "--db", str(db), "--batch-max", "7", "--commit-interval-ms", "1"]
    landed: list[int] = []  # where each kill landed (the offsets ingested by then)
    log = tmp_path / "ingest.log"
    for _ in range(3):  # kill it mid-way, up to three times (the ingest may reach the end first)
        if landed and landed[-1] >= end - 1:
            break
        # its stderr to a file: an unread pipe fills and blocks the process mid-ingest
        proc = subprocess.Popen(
            [sys.executable, "-m", "processors.cli", *args],
            env={
                **os.environ,
                "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
                "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
            },
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
        )
        before = _indexed(db)
        want = min(before + 40, end - 1)  # the last kill still lands before the end
        deadline = time.monotonic() + 60
        while _indexed(db) < want and proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                err = log.read_text(errors="replace")[-3000:]
                raise AssertionError(
                    f"the ingest made no progress: offset {_indexed(db)} of {want} (the end: {end}): {err}"
                )
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        landed.append(_indexed(db))
    assert 0 < landed[0] < end, (landed, end)  # the first kill, at least, landed mid-ingest
    # the restart reads to the end
    out = cli(settings, *args[:4], "--once", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["duplicates"] == 0, report  # the offsets were exact: not one event re-read
    assert total > 0
    killed, fresh = _dump(db), _dump(clean)
    assert killed == fresh
    index = SQLiteIndex(db, readonly=True)
    for rid in runs:
        row = index.get(rid)
        assert row is not None and row["status"] == "succeeded" and row["attempts"] == 3
        assert len(index.events(rid)) == row["sequence"]


def test_an_ingest_of_a_prefix_without_its_topic_cannot_start_and_says_what_to_do(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processors.index import ingest

    monkeypatch.setattr(ingest, "TOPIC_APPEARS_S", 1.0)
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"t{os.getpid()}notopics")
    indexer = Indexer(settings, SQLiteIndex(tmp_path / "index.sqlite"))
    with pytest.raises(ingest.IngestCannotStart) as stopped:  # exit 2 (configuration), was 1
        indexer.run(stop=threading.Event())
    assert str(stopped.value) == (
        f"topic {settings.topic_prefix}.run-events does not exist; create it with `runfold topology create` "
        f"(prefix {settings.topic_prefix!r})"
    )
