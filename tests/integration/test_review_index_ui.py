"""Adversarial review of the run index and the web UI against the real broker, a real processor
and a real worker (pure checks: tests/unit/test_review_index_ui_unit.py). Each test quotes the
promise it checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from executor_support import WorkerThread
from processor_support import assign_from_start, make_settings, running
from test_index import EXAMPLES
from ui_support import ui_server

from processors.client import CommandRejected, RunClient
from processors.executors import Worker
from processors.index import Indexer, SQLiteIndex
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from topology.admin import create_topology
from topology.settings import KafkaSettings, consumer_config, producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
CANARY = "sk-reviewCANARYreview0123456789"


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
        c.register(EXAMPLES / "one-step.yaml")
        yield c


@pytest.fixture
def system(settings: ProcessorSettings) -> Iterator[None]:
    with running(settings), WorkerThread(Worker(name="review-test", queues=["default"]), settings):
        yield


def _cli(settings: ProcessorSettings, *args: str, env: dict[str, str] | None = None) -> Any:
    full = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "processors.cli", *args], capture_output=True, text=True, env=full, timeout=60
    )


def test_a_secret_label_is_refused_at_start_and_never_shows_in_the_ui(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/semantics.md, Start: secret literals in the input or the labels are refused
    (`InvalidInput`, the reason names paths only); docs/ui.md, "Security": nothing shown carries a
    secret. The processor accepted such labels once (a reviewer's finding), and the UI showed them
    raw: now the start is refused, and neither the answer nor any UI page or JSON carries it."""
    with pytest.raises(CommandRejected) as refused:
        client.start("one-step", {"text": "hi"}, labels={"api_key": CANARY, "team": "a"})
    assert refused.value.code == "InvalidInput" and "labels.api_key" in refused.value.reason
    assert CANARY not in str(refused.value)
    rid = client.start("one-step", {"text": "hi"}, labels={"team": "a"})
    assert client.wait(rid, timeout=60).status == "succeeded"
    with ui_server(settings, tmp_path / "ui.sqlite") as base, httpx.Client(base_url=base, timeout=30) as http:
        api = http.get("/api/runs", params={"label": "team=a"})
        assert api.status_code == 200 and [r["run_id"] for r in api.json()["runs"]] == [rid]
        for path in ("/api/runs", "/", "/fragments/runs", f"/runs/{rid}", f"/fragments/run/{rid}"):
            assert CANARY not in http.get(path).text, path


def _records(settings: ProcessorSettings, topic: str, run_id: str) -> list[Any]:
    consumer = Consumer(consumer_config(settings, "review-reader", enable_partition_eof=True))
    try:
        parts = assign_from_start(consumer, [topic])
        decode = Codec.default().decoder("run_events")
        out, eof = [], set()
        while len(eof) < parts:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                eof.add(msg.partition())
                continue
            if decode(msg.value())["run_id"] == run_id:
                out.append(msg)
        return out
    finally:
        consumer.close()


def test_a_duplicate_run_accepted_read_after_a_restart_changes_nothing(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/index.md, "Exactly once into the database": "An event whose `(run_id, sequence)` the
    index already holds is skipped as well." Here the duplicate is the run's RunAccepted
    (sequence 1), read by an ingest restarted after the run finished (its cache empty)."""
    rid = client.start("one-step", {"text": "hi"}, labels={"team": "a"})
    assert client.wait(rid, timeout=60).status == "succeeded"
    db = tmp_path / "i.sqlite"
    Indexer(settings, SQLiteIndex(db)).run(follow=False)
    before = SQLiteIndex(db, readonly=True).get(rid)
    assert before is not None and before["status"] == "succeeded" and before["sequence"] > 1
    topic = f"{settings.topic_prefix}.run-events"
    accepted = _records(settings, topic, rid)[0]
    producer = Producer(producer_config(settings))
    producer.produce(topic, accepted.value(), accepted.key(), partition=accepted.partition())
    assert producer.flush(30) == 0
    report = Indexer(settings, SQLiteIndex(db)).run(follow=False)  # a restart: a fresh ingest
    after = SQLiteIndex(db, readonly=True).get(rid)
    assert after is not None
    assert (after["status"], after["sequence"], after["finished_ms"]) == (
        "succeeded",
        before["sequence"],
        before["finished_ms"],
    ), f"the duplicate RunAccepted reset the run: {after['status']} at sequence {after['sequence']}"
    assert report.duplicates == 1 and report.new_runs == 0, report.to_dict()


@pytest.mark.parametrize("since", ["99999999999999999999", "99999999999999999999d"])
def test_runs_list_with_an_out_of_range_since_is_exit_2_with_one_line(
    settings: ProcessorSettings, tmp_path: Path, since: str
) -> None:
    """docs/index.md, "Search": `--since` / `--until` take "ISO 8601, a duration before now such as
    `15m`, `2h`, `7d`, or epoch ms"; a value it cannot use is refused like any bad option: one
    line, exit 2 (as `--since yesterday-ish` is)."""
    db = tmp_path / "i.sqlite"
    SQLiteIndex(db).bind_prefix(settings.topic_prefix)
    out = _cli(settings, "runs", "list", "--since", since, "--json", env={"RUNFOLD_INDEX_DB": str(db)})
    assert out.returncode == 2, (out.returncode, out.stdout[-500:], out.stderr[-800:])
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["ok"] is False
    assert "Traceback" not in out.stderr


def test_index_once_twice_and_status_json_count_each_event_once(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/index.md: `runfold index run --once` "read to the end, then exit"; "nothing lost,
    nothing counted twice"; `runfold index status --json` "prefix, runs, events, consumed offsets"."""
    runs = [client.start("one-step", {"text": str(i)}, labels={"n": str(i % 2)}) for i in range(4)]
    client.wait_all(runs, timeout=60)
    db = tmp_path / "i.sqlite"
    first = _cli(settings, "index", "run", "--db", str(db), "--once", "--json")
    assert first.returncode == 0, first.stderr
    again = _cli(settings, "index", "run", "--db", str(db), "--once", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["events"] == 0  # nothing read twice
    status = _cli(settings, "index", "status", "--db", str(db), "--json")
    assert status.returncode == 0, status.stderr
    stats = json.loads(status.stdout)
    assert stats["topic_prefix"] == settings.topic_prefix and stats["runs"] == 4
    assert stats["events"] == json.loads(first.stdout)["events"]
    index = SQLiteIndex(db, readonly=True)
    for rid in runs:
        row = index.get(rid)
        assert row is not None and row["status"] == "succeeded"
        seqs = [e["sequence"] for e in index.events(rid)]
        assert seqs == list(range(1, row["sequence"] + 1))  # in order, none lost, none twice
    listed = _cli(
        settings,
        "runs",
        "list",
        "--label",
        "n=1",
        "--limit",
        "1",
        "--json",
        env={"RUNFOLD_INDEX_DB": str(db)},
    )
    assert listed.returncode == 0, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(lines) == 2 and "next_cursor" in lines[-1]
    nxt = _cli(
        settings, "runs", "list", "--label", "n=1", "--limit", "1", "--cursor", lines[-1]["next_cursor"],
        "--json", env={"RUNFOLD_INDEX_DB": str(db)},
    )  # fmt: skip
    rows = [json.loads(line) for line in nxt.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["run_id"] != lines[0]["run_id"]


def test_a_wrong_prefix_is_refused_with_exit_2(settings: ProcessorSettings, tmp_path: Path) -> None:
    """docs/index.md, "Exactly once into the database": "An index file remembers its topic prefix
    and refuses another"; exit codes: "2 it cannot start as configured (an index of another prefix ...)"."""
    db = tmp_path / "i.sqlite"
    SQLiteIndex(db).bind_prefix(settings.topic_prefix + "-other")
    out = _cli(settings, "index", "run", "--db", str(db), "--once", "--json")
    assert out.returncode == 2 and json.loads(out.stdout)["ok"] is False, (out.returncode, out.stdout)
