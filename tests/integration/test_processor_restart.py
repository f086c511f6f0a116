"""Processor lifecycle against a real broker: rebalance between two instances, restart from
the store, rebuild from run-events, and fencing of a second instance with the same id."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Consumer
from processor_support import (
    Commands,
    ProcessorThread,
    Reader,
    Responder,
    assign_from_start,
    complete_all,
    make_settings,
    running,
    setup_topology,
    terminal_of,
)

from processors.kafka.exits import ExitCode
from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from schemas.run_state import purged_status
from topology.settings import consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "a")
    setup_topology(s)
    return s


def _one_activation_each(acts: list[dict]) -> None:
    ids = [a["dispatch_id"] for a in acts if a["type"] == "ActionActivation"]
    assert len(ids) == len(set(ids)), "an activation was emitted twice"


def test_two_instances_split_partitions_and_runs_complete_across_rebalance(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    acts = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    runs = [f"rb-{i}" for i in range(12)]
    assert {partition_for(r, 2) for r in runs} == {0, 1}
    second = settings.model_copy(update={"instance_id": "p2", "state_dir": tmp_path / "b", "query_port": 0})
    first = settings.model_copy(update={"query_port": 0})
    with running(first) as a:
        for r in runs:
            cmd.start(r, "three")
        cmd.flush()
        # every run has its first activation before the second instance joins
        acts.wait_for(lambda xs: {x["run_id"] for x in xs} >= set(runs), what="first activations")
        b = ProcessorThread(second).start()
        try:
            a.wait_owned(1)
            b.wait_owned(1)
            assert set(a.processor.partitions.owned()) | set(b.processor.partitions.owned()) == {0, 1}
            # a run owned by the other instance: 421 naming the partition and the owner
            theirs = next(r for r in runs if partition_for(r, 2) in b.processor.partitions.owned())
            resp = httpx.get(f"http://127.0.0.1:{a.processor.query_port}/runs/{theirs}", timeout=10)
            assert resp.status_code == 421
            body = resp.json()
            assert body["partition"] == partition_for(theirs, 2) and body["owner"]["instance_id"] == "p2"
            with Responder(settings, complete_all):
                events.wait_for(
                    lambda evs: all(terminal_of(evs, r) for r in runs),
                    timeout=60,
                    what="all runs terminal across the rebalance",
                )
            owner_b = httpx.get(f"http://127.0.0.1:{b.processor.query_port}/runs/{theirs}", timeout=10).json()
            assert owner_b["status"] == "succeeded"
        finally:
            assert b.stop() == 0
    for r in runs:
        assert [e["type"] for e in terminal_of(events.records, r)] == ["RunSucceeded"]
        mine = events.of(r)
        assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1))
    acts.drain()
    _one_activation_each(acts.records)
    events.close()
    acts.close()


def test_restart_resumes_from_store_and_rebuilds_a_lost_store(settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    acts = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    runs = [f"rs-{i}" for i in range(8)]
    with running(settings):
        for r in runs:
            cmd.start(r, "three")
        cmd.flush()
        acts.wait_for(lambda xs: len(xs) >= len(runs), what="first activations")
    # restart with the same store: nothing to restore, no activation re-emitted
    with running(settings) as pt:
        time.sleep(1.0)
        assert pt.processor.metrics.events_restored._value.get() == 0
        acts.poll(0.5)
        assert len(acts.records) == len(runs)
        for act in list(acts.records):
            cmd.complete(act)  # step a of every run
        cmd.flush()
        acts.wait_for(lambda xs: len(xs) >= 2 * len(runs), what="second activations")
    # lose the store entirely: restart rebuilds it from run-state (each run's snapshot, no
    # event of them folded again), then finishes the runs
    shutil.rmtree(settings.state_dir)
    with running(settings.model_copy(update={"query_port": 0})) as pt:
        assert pt.processor.metrics.runs_seeded._value.get() == len(runs)
        assert pt.processor.metrics.events_restored._value.get() == 0
        # the store holds no event of them: the query reads those from the topic, page by page
        base = f"http://127.0.0.1:{pt.processor.query_port}"
        events.wait_for(lambda evs: len([e for e in evs if e["run_id"] == runs[0]]) >= 5, what="events")
        for since in (0, 2):
            got = httpx.get(f"{base}/runs/{runs[0]}/events", params={"since": since, "limit": 3}, timeout=30)
            logged = [e for e in events.records if e["run_id"] == runs[0]][since : since + 3]
            assert [(e["sequence"], e["type"]) for e in got.json()["events"]] == [
                (e["sequence"], e["type"]) for e in logged
            ]
        with Responder(settings, complete_all):
            # the second activations were emitted already; answer them (the responder reads from the start)
            events.wait_for(
                lambda evs: all(terminal_of(evs, r) for r in runs),
                timeout=60,
                what="all runs terminal after rebuild",
            )
            # runs per status are store stats: rebuilt by restore, then moved by new events
            deadline = time.monotonic() + 10
            gauge = pt.processor.metrics.runs_by_status
            while time.monotonic() < deadline and gauge.labels("succeeded")._value.get() != len(runs):
                time.sleep(0.1)
            assert gauge.labels("succeeded")._value.get() == len(runs)
            assert gauge.labels("running")._value.get() == 0
    for r in runs:
        assert [e["type"] for e in terminal_of(events.records, r)] == ["RunSucceeded"]
    acts.drain()
    _one_activation_each(acts.records)
    assert len([a for a in acts.records if a["type"] == "ActionActivation"]) == 3 * len(runs)
    events.close()
    acts.close()


def test_a_store_far_behind_run_events_is_rebuilt_from_run_state(settings: ProcessorSettings) -> None:
    """A store from before (a partition owned long ago, a backup put back) more than
    `restore_state_lag` offsets behind is replaced by a restore from run-state: every run seeded
    from its snapshot, no event folded; the runs then finish as usual."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    acts = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    runs = [f"far-{i}" for i in range(4)]
    with running(settings):
        for r in runs:
            cmd.start(r, "three")
        cmd.flush()
        acts.wait_for(lambda xs: len(xs) >= len(runs), what="first activations")
    old = settings.state_dir.with_name("old-store")
    shutil.copytree(settings.state_dir, old)
    with running(settings):
        for act in list(acts.records):
            cmd.complete(act)  # step a of every run: events the old store does not hold
        cmd.flush()
        acts.wait_for(lambda xs: len(xs) >= 2 * len(runs), what="second activations")
    shutil.rmtree(settings.state_dir)
    shutil.copytree(old, settings.state_dir)
    with running(settings.model_copy(update={"restore_state_lag": 1})) as pt:
        assert pt.processor.metrics.runs_seeded._value.get() == len(runs)
        assert pt.processor.metrics.events_restored._value.get() == 0
        with Responder(settings, complete_all):
            events.wait_for(
                lambda evs: all(terminal_of(evs, r) for r in runs), timeout=60, what="all runs terminal"
            )
    for r in runs:
        assert [e["type"] for e in terminal_of(events.records, r)] == ["RunSucceeded"]
    events.close()
    acts.close()


def test_second_instance_with_same_id_fences_the_first(settings: ProcessorSettings, tmp_path: Path) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    first = ProcessorThread(settings).start()
    first.wait_owned(2)
    twin = ProcessorThread(settings.model_copy(update={"state_dir": tmp_path / "twin"})).start()
    try:
        runs = [f"f-{i}" for i in range(10)]
        with Responder(settings, complete_all):
            # keep input flowing until the zombie notices it was fenced and exits
            deadline = time.monotonic() + 60
            i = 0
            while first.thread.is_alive() and time.monotonic() < deadline:
                cmd.start(runs[i % len(runs)], "one")
                cmd.flush()
                i += 1
                time.sleep(0.1)
            first.thread.join(30)
            assert first.exit_code == ExitCode.FENCED
            twin.wait_owned(2, timeout=60)
            events.wait_for(
                lambda evs: all(terminal_of(evs, r) for r in runs[: min(i, len(runs))]),
                timeout=60,
                what="runs completed by the surviving instance",
            )
        for r in runs[: min(i, len(runs))]:
            assert len(terminal_of(events.records, r)) == 1
    finally:
        if first.thread.is_alive():
            first.stop()
        assert twin.stop() == 0
        events.close()


def test_stop_event_commits_and_exits_zero(settings: ProcessorSettings) -> None:
    # A processor idling with no input stops promptly and cleanly.
    pt = ProcessorThread(settings).start()
    pt.wait_owned(2)
    t0 = time.monotonic()
    stopper = threading.Timer(0.2, pt.processor.stop)
    stopper.start()
    pt.thread.join(20)
    assert pt.exit_code == 0 and time.monotonic() - t0 < 15


def test_a_store_rebuilt_from_a_log_whose_start_retention_deleted_skips_those_runs_and_goes_on(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_events_retention_ms shorter than a run: a lost store is rebuilt from a log that no
    longer holds some runs' RunAccepted. Those runs are skipped (counted, said) and their ids stay
    taken; the others restore and finish; restore progress counts from the first event read;
    replay verify fails only for the run still open (a finished one lost nothing) and rebuild
    names both. Before, the restore stopped the processor at the first such event, and again on
    every restart."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from processors.replay import rebuild, verify
    from processors.runtime.assignment import Partitions
    from processors.runtime.store import NO_OFFSET
    from topology.settings import admin_config

    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    finished, p_finished = "lr-done", partition_for("lr-done", settings.partitions)
    runs = [f"lr-{i}" for i in range(8)]
    assert any(partition_for(r, settings.partitions) != p_finished for r in runs)
    with running(settings):
        with Responder(settings, complete_all):
            cmd.start(finished, "three")
            cmd.flush()
            events.wait_for(lambda evs: terminal_of(evs, finished), what="the first run finished")
        for r in runs:
            cmd.start(r, "three")
        cmd.flush()
        events.wait_for(
            lambda evs: all(any(e["run_id"] == r and e["type"] == "RunStarted" for e in evs) for r in runs),
            what="every run started",
        )

    def accepted(run_id: str) -> dict:
        [ev] = [e for e in events.records if e["run_id"] == run_id and e["type"] == "RunAccepted"]
        return ev

    # Retention deletes the RunAccepted of the finished run, and that of the oldest open run of the
    # other partition (nothing comes before it there).
    open_lost = min(
        (accepted(r) for r in runs if partition_for(r, settings.partitions) != p_finished),
        key=lambda e: e["_offset"],
    )["run_id"]
    p_open = partition_for(open_lost, settings.partitions)
    cuts = {p_finished: accepted(finished)["_offset"] + 1, p_open: accepted(open_lost)["_offset"] + 1}
    admin = AdminClient(admin_config(settings))
    deleted = admin.delete_records(
        [TopicPartition(settings.topics.run_events, q, o) for q, o in cuts.items()]
    )
    assert sorted(f.result(30).low_watermark for f in deleted.values()) == sorted(cuts.values())
    shutil.rmtree(settings.state_dir)

    first_read: dict[int, int] = {}
    finish = Partitions._finish_caught_up

    def noting_first_offsets(self: Partitions, consumer: object) -> list[int]:
        for q, r in self.restoring.items():
            if r.first_offset != NO_OFFSET:
                first_read.setdefault(q, r.first_offset)
        return finish(self, consumer)  # type: ignore[arg-type]

    monkeypatch.setattr(Partitions, "_finish_caught_up", noting_first_offsets)
    # the full-log restore (a restore from run-state takes both runs from their snapshots)
    from_log = settings.model_copy(update={"restore_from_state": False})
    with running(from_log) as pt, Responder(settings, complete_all):
        events.wait_for(
            lambda evs: all(terminal_of(evs, r) for r in runs if r != open_lost),
            timeout=60,
            what="every other run terminal",
        )
        assert (
            pt.processor.metrics.events_before_start._value.get() >= 4
        )  # RunStarted, StepScheduled, ... of both
        assert first_read == cuts  # not the store's 0: retention's offsets are no progress
        # their ids stay taken, as a purged run's
        for run_id in (open_lost, finished):
            cmd.start(run_id, "three")
        cmd.flush()
        events.wait_for(
            lambda evs: all(
                any(e["run_id"] == r and e["type"] == "RunRejected" for e in evs)
                for r in (open_lost, finished)
            ),
            what="both starts rejected",
        )
        assert pt.processor.stopping.fatal is None and pt.thread.is_alive()
    for run_id in (open_lost, finished):
        [rejected] = [e for e in events.records if e["run_id"] == run_id and e["type"] == "RunRejected"]
        assert (
            rejected["code"] == "Conflict"
            and "began before the start of the run-events log" in rejected["reason"]
        )
    assert not terminal_of(events.drain(), open_lost)  # its receipt came to a processor that does not know it

    report = verify(settings)
    assert [(d.run_id, d.kind) for d in report.differences] == [(open_lost, "beginning_not_in_log")]
    assert report.expired == 1  # the finished one: not verifiable, nothing lost
    rebuilt = rebuild(settings.model_copy(update={"state_dir": tmp_path / "rebuilt"}))
    assert rebuilt.runs_before_log_start == {open_lost, finished}
    events.close()


# The processor, killed (SIGKILL) the moment it is about to write a purge's commit to its store.
_KILLED_AT_THE_PURGE_WRITE = """
import os, runpy, signal, sys
import processors.runtime.store as store

apply = store.PartitionStore.apply

def killed_at_a_purge(self, changes, applied_offset):
    if changes.purged:  # committed in Kafka; the store write never happens
        os.kill(os.getpid(), signal.SIGKILL)
    return apply(self, changes, applied_offset)

store.PartitionStore.apply = killed_at_a_purge
sys.argv = ["processors.runtime", *sys.argv[1:]]
runpy.run_module("processors.runtime", run_name="__main__")
"""


def _purged(value: bytes | None) -> bool:
    """A purge's record on run-state: its marker (schemas/run_state.py), a tombstone before."""
    return value is None or purged_status(Codec.default().decode("run_state", value)) is not None


def _tombstones(settings: ProcessorSettings, run_id: str) -> int:
    """Run-state tombstones of `run_id` committed so far (read_committed, until 1 s of quiet)."""
    consumer = Consumer(consumer_config(settings, f"tombstones-{uuid.uuid4().hex[:8]}"))
    try:
        assign_from_start(consumer, [settings.topics.run_state])
        n = 0
        while (m := consumer.poll(1.0)) is not None:
            if m.error() is None and m.key() == run_id.encode() and _purged(m.value()):
                n += 1
        return n
    finally:
        consumer.close()


def test_a_run_purged_by_a_commit_the_store_never_wrote_stays_purged(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """A purge writes no run event, so restore cannot redo one whose commit a crash kept out
    of the store: the run came back, and a ResumeRun folded before the next purge pass resumed
    it (RunResumed and a new activation). The restarted processor must reject the ResumeRun
    NotFound, as for any purged run, and send the run-state tombstone again."""
    args = [
        "--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix", settings.topic_prefix,
        "--instance-id", settings.instance_id, "--state-dir", str(settings.state_dir),
        "--finished-retention-ms", "1000", "--query-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    log = (tmp_path / "processor.log").open("ab")
    events = Reader(settings, [settings.topics.run_events], "run_events")
    acts = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_AT_THE_PURGE_WRITE, *args], stderr=log, env=env)
    try:
        cmd.start("purged", "one")
        cmd.flush()
        [act] = acts.wait_for(lambda xs: len(xs) >= 1, timeout=60, what="the activation")
        cmd.fail(act, retryable=False)
        cmd.flush()
        events.wait_for(lambda evs: bool(terminal_of(evs, "purged")), timeout=60, what="RunFailed")
        assert proc.wait(60) == -signal.SIGKILL  # at the purge's store write, a second or so later
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _tombstones(settings, "purged") == 1  # the purge committed
    cmd.send("commands", "purged", {"type": "ResumeRun", "budgets": None, "reason": "again"})
    cmd.flush()
    before = len(events.records)
    proc = subprocess.Popen([sys.executable, "-m", "processors.runtime", *args], stderr=log, env=env)
    try:
        events.wait_for(
            lambda evs: any(e["run_id"] == "purged" for e in evs[before:]),
            timeout=90,
            what="the ResumeRun's answer",
        )
        deadline = time.monotonic() + 15
        while _tombstones(settings, "purged") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        owed = _tombstones(settings, "purged")
        acts.drain(0.5)
        purged_metric = _metric(
            _metrics_port(tmp_path / "processor.log"), "runfold_processor_runs_purged_total"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        events.close()
        acts.close()
    answer = [(e["type"], e.get("code")) for e in events.records[before:] if e["run_id"] == "purged"]
    assert answer == [("RunRejected", "NotFound")]
    assert len(acts.records) == 1, "the purged run was dispatched again"
    assert owed == 2, "the restarted processor did not send the purge's tombstone again"
    assert purged_metric == 1.0, "the redone purge is not in runfold_processor_runs_purged_total"
    assert code == 0


def _metrics_port(log: Path) -> int:
    """The /metrics port of the last processor that started with this log (its `processor started` line)."""
    ports = [
        orjson.loads(line)["metrics_port"]
        for line in log.read_bytes().splitlines()
        if b'"processor started"' in line
    ]
    return int(ports[-1])


def _metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)
