"""The run processor against a real broker: test code acts as the executors."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from processor_support import (
    Commands,
    Reader,
    Responder,
    action,
    complete_all,
    make_settings,
    register_definitions,
    running,
    settled_value,
    setup_topology,
    terminal_of,
    workflow,
)

from processors.client import RunClient
from processors.client.errors import RunNotFound
from processors.replay.verify import verify
from processors.runtime.settings import ProcessorSettings
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    # kafka_settings is requested for its cleanup: it deletes the prefix's topics afterwards.
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", query_port=0, metrics_port=0)
    setup_topology(s)
    return s


def test_start_to_succeeded_with_snapshot_query_and_metrics(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    snapshots = Reader(settings, [settings.topics.run_state], "run_state")
    cmd = Commands(settings)
    with running(settings) as pt, Responder(settings, complete_all) as responder:
        for i in range(6):
            cmd.start(f"run-{i}", "three", {"i": i})
        cmd.flush()
        events.wait_for(
            lambda evs: all(terminal_of(evs, f"run-{i}") for i in range(6)), what="6 terminal runs"
        )
        # each run's events: gap-free sequence, one terminal event, three steps in order
        for i in range(6):
            mine = events.of(f"run-{i}")
            assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1))
            assert [e["type"] for e in terminal_of(mine, f"run-{i}")] == ["RunSucceeded"]
            assert [e["node"] for e in mine if e["type"] == "StepSucceeded"] == ["a", "b", "c"]
            # run-events partition == partition of the run's commands (co-partitioning)
        assert len(responder.seen) == 18
        # snapshots: the latest one per run is terminal and matches the last event's sequence
        snapshots.wait_for(
            lambda s: (
                {r["run_id"] for r in s if r["status"] == "succeeded"} >= {f"run-{i}" for i in range(6)}
            ),
            what="succeeded snapshots",
        )
        last = {r["run_id"]: r for r in snapshots.records}
        assert last["run-0"]["sequence"] == events.of("run-0")[-1]["sequence"]
        # query: the owner answers with the committed state and events
        base = f"http://127.0.0.1:{pt.processor.query_port}"
        body = httpx.get(f"{base}/runs/run-0", timeout=5).json()
        assert body["status"] == "succeeded" and body["sequence"] == last["run-0"]["sequence"]
        evs = httpx.get(f"{base}/runs/run-0/events", params={"since": 2}, timeout=5).json()["events"]
        assert [e["sequence"] for e in evs] == list(range(3, body["sequence"] + 1))
        assert httpx.get(f"{base}/runs/nope", timeout=5).status_code == 404
        health = httpx.get(f"{base}/health", timeout=5)
        assert health.status_code == 200 and health.json()["ready"] and health.json()["stalled_s"] == 0
        assert sorted(health.json()["owned"]) == list(range(pt.processor.partition_count))
        metrics = httpx.get(f"http://127.0.0.1:{pt.processor.metrics_port}/metrics", timeout=5).text
        assert 'runfold_processor_transactions_total{outcome="committed"}' in metrics
        assert 'runfold_processor_runs{status="succeeded"} 6.0' in metrics
    events.close()
    snapshots.close()


def test_a_start_right_after_its_definition_is_registered_is_started_not_rejected(
    settings: ProcessorSettings,
) -> None:
    # `defs register` then `runs start`: the processor's definitions reader may not have polled
    # the definition when the StartRun naming it is folded. Made certain here: its poll sees
    # nothing, so only reading the definitions topic to its end before deciding can find them.
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    late = [f"late-{i}" for i in range(4)]
    with running(settings) as pt, Responder(settings, complete_all):
        reader = pt.processor._definitions
        assert reader is not None
        reader.poll = lambda: 0  # type: ignore[method-assign]
        for wid in late:
            register_definitions(settings, [workflow(wid, {"a": action("a")})])
            cmd.start(f"{wid}-run", wid, {})
            cmd.flush()
        cmd.start("never-run", "never-registered", {})
        cmd.flush()
        events.wait_for(
            lambda evs: all(terminal_of(evs, f"{w}-run") for w in late) and events.of("never-run"),
            what="the late definitions' runs to finish, the unknown one to be rejected",
        )
    for wid in late:
        assert [e["type"] for e in terminal_of(events.records, f"{wid}-run")] == ["RunSucceeded"]
        assert not events.of(f"{wid}-run", "RunRejected")
    [rejected] = events.of("never-run")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "NotFound"
    events.close()


def test_cancel_mid_run(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    cancels: list[dict] = []

    def handler(c: Commands, act: dict) -> None:
        if act["type"] == "ActionActivation":
            c.cancel(act["run_id"], "user asked")  # never completes: cancel while in flight
        else:
            cancels.append(act)
            c.receipt(act, "ActivationCancelled", reason="stopped")

    with running(settings), Responder(settings, handler):
        cmd.start("c-1", "one")
        cmd.flush()
        events.wait_for(lambda evs: terminal_of(evs, "c-1"), what="terminal event of c-1")
    assert [e["type"] for e in terminal_of(events.records, "c-1")] == ["RunCancelled"]
    assert cancels and cancels[0]["type"] == "CancelActivation"
    events.close()


def test_retryable_failure_is_retried_after_backoff_timer(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    seen_at: dict[int, float] = {}

    def handler(c: Commands, act: dict) -> None:
        seen_at[act["attempt"]] = time.monotonic()
        if act["attempt"] == 1:
            c.fail(act, retryable=True)
        else:
            c.complete(act)

    with running(settings), Responder(settings, handler):
        cmd.start("rt-1", "retry")
        cmd.flush()
        events.wait_for(lambda evs: terminal_of(evs, "rt-1"), what="terminal event of rt-1")
    types = [e["type"] for e in events.of("rt-1")]
    assert "StepRetryScheduled" in types and types[-1] == "RunSucceeded"
    assert seen_at[2] - seen_at[1] >= 0.25  # backoff 300 ms, fired by the durable timer
    events.close()


def test_sleep_node(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    with running(settings), Responder(settings, complete_all):
        cmd.start("s-1", "sleepy")
        cmd.flush()
        events.wait_for(lambda evs: terminal_of(evs, "s-1"), what="terminal event of s-1")
    mine = events.of("s-1")
    assert mine[-1]["type"] == "RunSucceeded"
    sleep = next(e for e in mine if e["type"] == "StepScheduled" and e["node"] == "s")
    woke = next(e for e in mine if e["type"] == "StepSucceeded" and e["node"] == "s")
    assert woke["ts_ms"] - sleep["ts_ms"] >= 400
    events.close()


def test_garbage_goes_to_dead_letters_and_processing_continues(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    cmd = Commands(settings)
    t = settings.topics
    with running(settings) as pt, Responder(settings, complete_all):
        cmd.raw(t.commands, b"g-1", b"\x00not avro at all")
        cmd.raw(t.receipts, b"g-1", b"\xc3\x01garbage")
        cmd.raw(t.commands, b"g-1", None)
        cmd.send(
            "commands",
            "g-2",
            {"type": "StartRun", "definition_id": "one", "revision": None, "input": {}},
            topic=None,
        )
        # a valid command under the wrong key
        cmd.producer.produce(
            t.commands,
            __import__("processor_support").CODEC.encode(
                "commands", {"type": "CancelRun", "run_id": "g-2", "ts_ms": 1, "record_id": "x", "reason": ""}
            ),
            b"other-key",
        )
        cmd.start("g-3", "one")
        cmd.start("g-4", "no-such-definition")
        cmd.flush()
        dead.wait_for(lambda d: len(d) >= 4, what="4 dead letters")
        events.wait_for(
            lambda evs: terminal_of(evs, "g-3") and events.of("g-4", "RunRejected"),
            what="g-3 terminal and g-4 rejected",
        )
        metrics = pt.processor.metrics
        assert settled_value(metrics.dead_letters.labels("undecodable"), 2) == 2
        assert settled_value(metrics.dead_letters.labels("null_value"), 1) == 1
        assert settled_value(metrics.dead_letters.labels("key_mismatch"), 1) == 1
        assert settled_value(metrics.rejected.labels("NotFound"), 1) == 1
    by_topic = {(d["source_topic"], d["error"].split(":")[0]) for d in dead.records}
    assert (t.commands, "cannot decode " + t.commands) in by_topic
    assert (t.receipts, "cannot decode " + t.receipts) in by_topic
    for d in dead.records:
        assert d["producer"] == "processor" and d["source_offset"] >= 0 and d["source_partition"] in (0, 1)
        assert d["key"] in (b"g-1", b"other-key")
    garbage = next(d for d in dead.records if d["source_topic"] == t.receipts)
    assert garbage["original"] == b"\xc3\x01garbage"
    assert events.of("g-4", "RunRejected")[0]["code"] == "NotFound"
    events.close()
    dead.close()


def test_producers_partition_run_ids_like_partition_for(settings: ProcessorSettings) -> None:
    # The query server and every runfold producer must agree on where a run lives.
    from confluent_kafka import Producer

    from processors.kafka.partitioning import partition_for
    from topology.settings import producer_config

    got: dict[str, int] = {}
    producer = Producer(producer_config(settings))
    for i in range(64):
        key = f"run-{i}/child[{i}]#2"
        producer.produce(
            settings.topics.commands,
            b"x",
            key.encode(),
            on_delivery=lambda err, msg: got.__setitem__(msg.key().decode(), msg.partition()),
        )
    producer.flush(10)
    assert len(got) == 64 and set(got.values()) == {0, 1}
    assert all(partition_for(k, 2) == p for k, p in got.items())


def test_finished_runs_leave_the_store_after_their_retention_and_their_ids_stay_taken(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> None:
    settings = make_settings(
        kafka_bootstrap,
        topic_prefix,
        tmp_path / "state",
        query_port=0,
        finished_retention_ms=1_000,
        idle_poll_ms=10,
    )
    setup_topology(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    runs = [f"old-{i}" for i in range(1, 21)]  # 13 on partition 1, 7 on 0
    with running(settings) as pt, Responder(settings, complete_all):
        pt.processor.purge_page = 1  # a backlog of pages: passes must follow each other, not wait 1 s
        for run_id in runs:
            cmd.start(run_id, "three")
        cmd.flush()
        events.wait_for(lambda evs: all(terminal_of(evs, r) for r in runs), what="20 finished runs")
        finished_at = time.monotonic()
        base = f"http://127.0.0.1:{pt.processor.query_port}"
        purged = pt.processor.metrics.runs_purged
        deadline = time.monotonic() + 20
        while purged._value.get() < len(runs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert purged._value.get() == len(runs)
        # retention 1 s + at most one 1 s pass interval + 13 one-run transactions back to back
        # (~3 s, ~5 on a loaded machine); a page per pass interval would take 13 s or more
        assert time.monotonic() - finished_at < 10.0
        answer = httpx.get(f"{base}/runs/old-1", timeout=5)
        assert answer.status_code == 404 and "finished runs are kept 1 s" in answer.json()["message"]
        assert httpx.get(f"{base}/runs/old-1/events", timeout=5).status_code == 404
        # a late duplicate start is refused; it does not begin a second run under the same id
        cmd.start("old-1", "three")
        cmd.flush()
        events.wait_for(
            lambda evs: any(e["type"] == "RunRejected" and e["run_id"] == "old-1" for e in evs),
            what="the duplicate start's rejection",
        )
        assert [e["type"] for e in events.of("old-1")].count("RunAccepted") == 1
        assert events.of("old-1", "RunRejected")[0]["code"] == "Conflict"
    # the run-state table keeps their ids only (markers): no run for the client's get and list
    kafka = KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix)
    with RunClient(kafka, timeout_s=10) as client:
        assert [v.run_id for v in client.runs()] == []
        with pytest.raises(RunNotFound):
            client.get("old-2")
    # a fresh instance (the store lost) restored from run-state refuses their ids all the same
    with running(settings.model_copy(update={"state_dir": tmp_path / "fresh"})) as pt:
        assert pt.processor.metrics.runs_seeded._value.get() == len(runs)
        cmd.start("old-2", "three")
        cmd.flush()
        events.wait_for(
            lambda evs: any(e["type"] == "RunRejected" and e["run_id"] == "old-2" for e in evs),
            what="the fresh instance's rejection",
        )
    assert [e["type"] for e in events.of("old-2")].count("RunAccepted") == 1
    assert events.of("old-2", "RunRejected")[0]["code"] == "Conflict"
    events.close()
    # replay still finds every event and counts the purged runs (their markers) instead of
    # reporting missing snapshots
    report = verify(settings, timeout_s=60)
    assert report.ok, report.differences
    assert report.purged == 20 and report.runs == 20 and report.snapshots == 0
