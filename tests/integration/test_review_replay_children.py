"""Adversarial review: replay (`runfold replay`), the child-run executor and downstream
consumers, against the real broker. Each test quotes the promise it checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from processor_support import make_settings, running

from processors.client import RunClient
from processors.client.reader import PartitionReader
from processors.replay import rebuild, verify
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.catalog import topic_names
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
RUNFOLD = Path(sys.executable).parent / "runfold"
APPROVAL = {
    "schema": "runfold.workflow/v1",
    "id": "approval",
    "revision": 1,
    "state": {"approved": False},
    "entry": ["review"],
    "nodes": {
        "review": {
            "kind": "wait",
            "signal": "approval",
            "writes": {"approved": {"from": "signal", "pointer": "/approved"}},
        }
    },
}


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


def _kafka(settings: ProcessorSettings) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix)


def _wait_for(client: RunClient, run_id: str, etype: str, timeout: float = 30) -> None:
    for ev in client.events(run_id, follow=True, timeout=timeout):
        if ev["type"] == etype:
            return
    raise AssertionError(f"{run_id}: no {etype}")


def _trim(settings: KafkaSettings, topic: str, offsets: dict[int, int]) -> None:
    """Delete records below `offsets[p]` (what run-events retention does)."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    futs = admin.delete_records([TopicPartition(topic, p, o) for p, o in offsets.items()])
    for f in futs.values():
        f.result(timeout=30)


def _ends(settings: KafkaSettings, topic: str) -> dict[int, int]:
    reader = PartitionReader(settings, timeout_s=10)
    try:
        return {p: reader.end_offset(topic, p) for p in range(reader.partition_count(topic))}
    finally:
        reader.close()


def _cli(settings: KafkaSettings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
    }
    return subprocess.run([str(RUNFOLD), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_verify_counts_finished_runs_whose_whole_history_retention_deleted_as_expired(
    settings: ProcessorSettings,
) -> None:
    """docs/client.md, "Replay": "`beginning_not_in_log` (a run still open whose `RunAccepted`
    the log no longer holds: run-events retention deleted it ...; a finished one lost nothing
    and is only counted, `expired`)". docs/runtime.md, "Run-events retention shorter than a
    run": "A run that had finished lost nothing".

    Run-events retention deletes a finished run's whole history while its snapshot (compacted
    run-state, kept until `finished_retention_ms`, default 7 days) remains: that run lost
    nothing and must be counted `expired`; the one still open is `beginning_not_in_log`.
    """
    kafka = _kafka(settings)
    topic = topic_names(kafka).run_events
    with RunClient(kafka, timeout_s=10) as client:
        client.register(APPROVAL)
        with running(settings):
            done = [client.start("approval", {}, run_id=f"done-{i}") for i in range(3)]
            open_run = client.start("approval", {}, run_id="still-open")
            for rid in [*done, open_run]:
                _wait_for(client, rid, "RunWaiting")
            for rid in done:
                client.cancel(rid, "finish it")
            for rid in done:
                assert client.wait(rid, timeout=30).status == "cancelled"
            assert verify(kafka).ok
            # retention deletes everything written so far on run-events
            _trim(kafka, topic, _ends(kafka, topic))
            t0 = time.monotonic()
            report = verify(kafka, timeout_s=40)
            took = time.monotonic() - t0
    kinds = {d.run_id: d.kind for d in report.differences}
    assert took < 30, f"verify over a trimmed log took {took:.1f}s"
    assert kinds == {open_run: "beginning_not_in_log"}, report.differences
    assert report.expired == len(done)


def test_verify_and_rebuild_over_a_partially_trimmed_log(settings: ProcessorSettings, tmp_path: Path) -> None:
    """docs/client.md, "Replay": a finished run whose `RunAccepted` retention deleted "is only
    counted, `expired`"; an open one is `beginning_not_in_log`; "`--rebuild` skips such runs and
    names them (`runs_before_log_start` in `--json`)". The CLI exits 1 on differences and its
    `--json` carries them.

    Trim each partition just past the first record (a RunAccepted): the runs keep later events.
    """
    kafka = _kafka(settings)
    topic = topic_names(kafka).run_events
    with RunClient(kafka, timeout_s=10) as client:
        client.register(APPROVAL)
        with running(settings):
            ids = [client.start("approval", {}, run_id=f"r{i}") for i in range(6)]
            for rid in ids:
                _wait_for(client, rid, "RunWaiting")
            finished = ids[:3]
            for rid in finished:
                client.cancel(rid, "finish")
            for rid in finished:
                assert client.wait(rid, timeout=30).status == "cancelled"
            parts = {rid: client.partition_of(rid) for rid in ids}
            # the first RunAccepted of each partition that has runs: offset of that run's first event
            first_run: dict[int, str] = {}
            reader = PartitionReader(kafka, timeout_s=10)
            try:
                from confluent_kafka import OFFSET_BEGINNING

                from schemas import Codec

                dec = Codec.default().decoder("run_events")
                cut: dict[int, int] = {}
                for msg in reader.read({(topic, p): OFFSET_BEGINNING for p in set(parts.values())}):
                    if msg is None:
                        continue
                    ev = dec(msg.value())
                    p = msg.partition()
                    if p not in first_run and ev["type"] == "RunAccepted":
                        first_run[p] = ev["run_id"]
                        cut[p] = msg.offset() + 1
            finally:
                reader.close()
            _trim(kafka, topic, cut)
            report = verify(kafka, timeout_s=40)
            out = _cli(kafka, "replay", "--verify", "--json")
    lost = set(first_run.values())
    expected = {rid: "beginning_not_in_log" for rid in lost if rid not in finished}
    assert {d.run_id: d.kind for d in report.differences} == expected
    assert report.expired == len([r for r in lost if r in finished])
    assert out.returncode == (1 if expected else 0), out.stderr
    body = orjson.loads(out.stdout)
    assert {d["run_id"] for d in body["differences"]} == set(expected)
    result = rebuild(settings.model_copy(update={"state_dir": tmp_path / "rebuilt"}))
    assert result.runs_before_log_start == lost


# ------------------------------------------------------------------ the child executor

KID = {
    "schema": "runfold.workflow/v1",
    "id": "kid",
    "revision": 1,
    "state": {},
    "entry": ["hold"],
    "nodes": {"hold": {"kind": "wait", "signal": "go"}},
}
MOM = {
    "schema": "runfold.workflow/v1",
    "id": "mom",
    "revision": 1,
    "state": {"out": None},
    "entry": ["child"],
    "nodes": {
        "child": {"kind": "workflow", "workflow": "kid", "revision": 1, "writes": {"out": {"from": "output"}}}
    },
}
KILL_AFTER_START = """
import os, signal, sys
import processors.executors.child_executor as ce
started = []
_start, _commit = ce.start_command, ce.commit_resuming
def start(*a, **k):
    started.append(1)
    return _start(*a, **k)
def commit(*a, **k):
    if started:  # StartRun produced and flushed (send_offsets_flushing ran): die before the commit
        os.kill(os.getpid(), signal.SIGKILL)
    return _commit(*a, **k)
ce.start_command, ce.commit_resuming = start, commit
sys.argv = ["runfold", "child-executor", "--log-level", "WARNING"]
from processors.cli.main import app
app()
"""


class ChildExecutorThread:
    def __init__(self, settings: KafkaSettings) -> None:
        from processors.executors.child_executor import ChildExecutor

        self.executor = ChildExecutor(settings)
        self.thread = threading.Thread(target=lambda: self.executor.run(install_signals=False), daemon=True)

    def __enter__(self) -> Any:
        self.thread.start()
        return self.executor

    def __exit__(self, *exc: object) -> None:
        self.executor.request_stop()
        self.thread.join(20)


def _all(settings: KafkaSettings, topic: str, kind: str) -> list[dict[str, Any]]:
    from schemas import Codec

    dec = Codec.default().decoder(kind)
    reader = PartitionReader(settings, timeout_s=10)
    try:
        return [dec(m.value()) for m in reader.read_all(topic)]
    finally:
        reader.close()


def _count(records: list[dict[str, Any]], rtype: str, run_id: str, key: str = "run_id") -> int:
    return sum(1 for r in records if r["type"] == rtype and r.get(key) == run_id)


def test_kill_9_between_starting_children_and_committing_starts_each_child_once(
    settings: ProcessorSettings,
) -> None:
    """child_executor.py (docs/executors.md, child executor): "Each polled batch is one Kafka
    transaction: the produced commands/receipts and the consumed offsets commit together, so a
    crash neither loses nor duplicates an outcome." README: replaying run-events "rebuilds every
    run's state byte for byte".

    The executor is SIGKILLed after its StartRun commands reached the broker (flushed, in its open
    transaction) and before the commit; a restarted executor goes on. Each child starts once, each
    parent gets one ChildRunFinished, and `replay --verify` finds nothing.
    """
    kafka = _kafka(settings)
    names = topic_names(kafka)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
    }
    with RunClient(kafka, timeout_s=10) as client:
        client.register(KID)
        client.register(MOM)
        with running(settings):
            parents = [client.start("mom", {}, run_id=f"mom-{i}") for i in range(3)]
            kids = [f"{p}/child" for p in parents]
            for p in parents:
                _wait_for(client, p, "StepScheduled")
            doomed = subprocess.Popen(
                [sys.executable, "-c", KILL_AFTER_START], env=env, cwd=Path(__file__).resolve().parents[2]
            )
            assert doomed.wait(timeout=60) == -signal.SIGKILL
            with ChildExecutorThread(kafka):
                for k in kids:
                    _wait_for(client, k, "RunWaiting")
                for k in kids:
                    client.signal(k, "go", {})
                for p in parents:
                    assert client.wait(p, timeout=40).status == "succeeded"
            report = verify(kafka, timeout_s=40)
    events = _all(kafka, names.run_events, "run_events")
    receipts = _all(kafka, names.receipts, "receipts")
    for k, p in zip(kids, parents, strict=True):
        assert _count(events, "RunAccepted", k) == 1
        assert _count(events, "RunSucceeded", k) == 1
        assert _count(receipts, "ChildRunFinished", k, "child_run_id") == 1
        assert _count(events, "RunSucceeded", p) == 1
    assert report.ok, report.differences


def test_cancels_propagate_both_ways_also_while_the_child_starts(settings: ProcessorSettings) -> None:
    """docs/semantics.md, "Child workflows": "A parent step cancelled or timed out while its child
    runs is `stopping` until the child's own terminal event says it stopped
    (`ChildRunFinished`)"; "failed/cancelled → `StepFailed` code `ChildFailed`".

    (a) A parent cancelled after its ChildRunActivation was written but before any executor ran:
    the child must not be left running, the parent ends `cancelled`, one ChildRunFinished.
    (b) A child cancelled on its own: its parent's step fails `ChildFailed` and the parent fails.
    """
    kafka = _kafka(settings)
    names = topic_names(kafka)
    with RunClient(kafka, timeout_s=10) as client:
        client.register(KID)
        client.register(MOM)
        with running(settings):
            early = client.start("mom", {}, run_id="early")
            other = client.start("mom", {}, run_id="other")
            for p in (early, other):
                _wait_for(client, p, "StepScheduled")
            client.cancel(early, "cancelled while its child starts")
            _wait_for(client, early, "RunCancelling")
            with ChildExecutorThread(kafka):
                assert client.wait(early, timeout=40).status == "cancelled"
                _wait_for(client, f"{other}/child", "RunWaiting")
                client.cancel(f"{other}/child", "cancelled on its own")
                assert client.wait(other, timeout=40).status == "failed"
                time.sleep(1.0)  # anything the executor would still send for them
            kid_early = (
                client.get(f"{early}/child")
                if _count(_all(kafka, names.run_events, "run_events"), "RunAccepted", f"{early}/child")
                else None
            )
            report = verify(kafka, timeout_s=40)
    events = _all(kafka, names.run_events, "run_events")
    receipts = _all(kafka, names.receipts, "receipts")
    if kid_early is not None:
        assert kid_early.status == "cancelled", kid_early
    assert _count(receipts, "ChildRunFinished", f"{early}/child", "child_run_id") == 1
    assert _count(receipts, "ChildRunFinished", f"{other}/child", "child_run_id") == 1
    [failed] = [e for e in events if e["type"] == "StepFailed" and e["run_id"] == other]
    assert failed["failure"]["code"] == "ChildFailed"
    assert report.ok, report.differences


FAN = {
    "schema": "runfold.workflow/v1",
    "id": "fan",
    "revision": 1,
    "state": {},
    "entry": ["child"],
    "nodes": {
        "child": {
            "kind": "workflow",
            "workflow": "kid",
            "revision": 1,
            "map": {"from": "input", "pointer": "/items"},
        }
    },
}
TWO_WAITS = {
    "schema": "runfold.workflow/v1",
    "id": "two-waits",
    "revision": 1,
    "state": {},
    "entry": ["w1"],
    "nodes": {"w1": {"kind": "wait", "signal": "one"}, "w2": {"kind": "wait", "signal": "two"}},
    "routes": {"w1": ["w2"]},
}


def _store(path: Path, kinds: bytes) -> dict[bytes, bytes]:
    from rocksdict import Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True))
    try:
        return {k: v for k, v in db.items() if k[:1] in kinds}
    finally:
        db.close()


def test_verify_and_rebuild_after_maps_children_resumes_pauses_and_purges(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """README: "Replaying `<p>.run-events` rebuilds every run's state byte for byte."
    docs/runtime.md, "Retention of finished runs": "`replay --verify` counts a finished run whose
    snapshot is a tombstone as `purged`, not as a difference. Restore computes the same purge time
    from the same terminal event, so a rebuilt store purges the same runs (`replay --rebuild` sets
    them too)."

    Mapped child runs, a child cancelled on its own (parent failed) then the parent resumed (a
    second child attempt), a run paused by its step budget and resumed, one left open; finished
    runs purged after a 1.5 s retention. Verify: no difference, the purged counted. Rebuild, let a
    processor run on it: its run states and event logs equal the live store's.
    """
    settings = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", finished_retention_ms=1500)
    create_topology(settings)
    kafka = _kafka(settings)
    with RunClient(kafka, timeout_s=10) as client:
        for d in (KID, MOM, FAN, TWO_WAITS):
            client.register(d)
        with running(settings), ChildExecutorThread(kafka):
            fan = client.start("fan", {"items": [1, 2, 3]}, run_id="fan-1")
            mom = client.start("mom", {}, run_id="mom-r")
            steps = client.start("two-waits", {}, run_id="steps-1", budgets={"max_steps": 1})
            still = client.start("mom", {}, run_id="open-1")
            for i in range(3):
                _wait_for(client, f"{fan}/child[{i}]", "RunWaiting")
                client.signal(f"{fan}/child[{i}]", "go", {})
            _wait_for(client, f"{mom}/child", "RunWaiting")
            client.cancel(f"{mom}/child", "on its own")
            assert client.wait(mom, timeout=30).status == "failed"
            client.resume(mom, reason="again")
            _wait_for(client, f"{mom}/child#2", "RunWaiting")
            client.signal(f"{mom}/child#2", "go", {})
            _wait_for(client, steps, "RunWaiting")
            client.signal(steps, "one", {})
            _wait_for(client, steps, "RunPaused")
            client.resume(steps, budgets={"max_steps": 5})
            _wait_for(client, steps, "RunResumed")
            client.signal(steps, "two", {})
            for rid in (fan, mom, steps):
                assert client.wait(rid, timeout=30).status == "succeeded"
            _wait_for(client, f"{still}/child", "RunWaiting")
            time.sleep(4.0)  # past the retention and a purge pass
            report = verify(kafka, timeout_s=40)
        assert report.ok, report.differences
        assert report.purged >= 3 + 3 + 2  # fan + its kids, mom + its 2 kids, steps (≥ 8 of them)
        rebuilt = settings.model_copy(update={"state_dir": tmp_path / "rebuilt"})
        rebuild(rebuilt)
        with running(rebuilt):
            time.sleep(3.0)  # its purge pass
    for p in range(settings.partitions):
        live = _store(settings.store_root() / f"p{p}", b"se")
        again = _store(rebuilt.store_root() / f"p{p}", b"se")
        assert set(again) == set(live), sorted(set(again) ^ set(live))[:10]
        assert again == live


def test_verify_while_runs_start_between_reading_snapshots_and_events(
    settings: ProcessorSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/client.md, "Replay": "It is exact while the processor runs: a snapshot and the events
    it reflects commit in one transaction, and events are read after snapshots, so the comparison
    is made at the snapshot's sequence, never at a moving end." README: `runfold replay --verify`
    is safe while the processor runs (the CLI's help: "Safe while the processor runs").

    A run started (and committed) after verify read the snapshots but before it read the events is
    not a difference: nothing is wrong with it.
    """
    import importlib

    verify_mod = importlib.import_module("processors.replay.verify")

    kafka = _kafka(settings)
    with RunClient(kafka, timeout_s=10) as client:
        client.register(APPROVAL)
        with running(settings):
            first = client.start("approval", {}, run_id="before")
            _wait_for(client, first, "RunWaiting")
            real = verify_mod.read_snapshots

            def snapshots_then_a_new_run(*a: Any, **k: Any) -> Any:
                out = real(*a, **k)
                client.start("approval", {}, run_id="during")  # answered: its RunAccepted is committed
                return out

            monkeypatch.setattr(verify_mod, "read_snapshots", snapshots_then_a_new_run)
            report = verify(kafka, timeout_s=40)
            assert report.ok, report.differences
            monkeypatch.undo()
            # a run whose events have no snapshot at all is still a difference
            from confluent_kafka import Producer

            from schemas import Codec
            from topology.settings import producer_config

            codec = Codec.default()
            names = topic_names(kafka)
            [accepted] = [
                e for e in _all(kafka, names.run_events, "run_events") if e["type"] == "RunAccepted"
            ][:1]
            forged = {**accepted, "run_id": "forged", "record_id": "forged#1"}
            producer = Producer(producer_config(kafka))
            producer.produce(names.run_events, codec.encode("run_events", forged), b"forged")
            assert producer.flush(10) == 0
            report = verify(kafka, timeout_s=40)
    assert [(d.run_id, d.kind) for d in report.differences] == [("forged", "no_snapshot")]


def test_a_child_start_rejected_conflict_fails_the_parent_step_instead_of_hanging(
    settings: ProcessorSettings,
) -> None:
    """docs/executors.md, "Child-run executor": "A `RunRejected` of a child's `StartRun` (depth,
    input, budget) → `ChildRunFinished` failed with the rejection's code, so the parent never
    waits forever."

    A run with the child's id already exists (a root run a client started under that id), so the
    child's StartRun is rejected `Conflict`. The parent's step must fail, not wait for good.
    """
    kafka = _kafka(settings)
    with RunClient(kafka, timeout_s=10) as client:
        client.register(KID)
        client.register(MOM)
        with running(settings), ChildExecutorThread(kafka):
            squatter = client.start("kid", {"mine": True}, run_id="victim/child")
            _wait_for(client, squatter, "RunWaiting")
            parent = client.start("mom", {}, run_id="victim")
            view = client.wait(parent, timeout=20)
    assert view.status == "failed", view


def test_a_store_rebuilt_from_a_trimmed_log_keeps_the_ids_of_runs_retention_deleted(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/seed-checklist.md, "retention of terminal runs": a finished run leaves "a tiny marker so
    its id is never reused (a later StartRun is rejected `Conflict`)"; docs/runtime.md, "Run-events
    retention shorter than a run": a run that cannot be rebuilt keeps "its id ... taken (a
    purged-run marker ...: a new StartRun of it is rejected `Conflict`)".

    A finished run whose every event retention deleted (its snapshot still in `<p>.run-state`):
    a processor started on `replay --rebuild`'s store must still refuse a new run under its id.
    """
    from processors.client.errors import RunRejected

    kafka = _kafka(settings)
    topic = topic_names(kafka).run_events
    with RunClient(kafka, timeout_s=10) as client:
        client.register(APPROVAL)
        with running(settings):
            done = client.start("approval", {}, run_id="gone-1")
            _wait_for(client, done, "RunWaiting")
            client.cancel(done, "finish")
            assert client.wait(done, timeout=30).status == "cancelled"
        _trim(kafka, topic, _ends(kafka, topic))
        rebuilt = settings.model_copy(update={"state_dir": tmp_path / "rebuilt"})
        rebuild(rebuilt)
        with running(rebuilt), pytest.raises(RunRejected) as err:
            client.start("approval", {"other": 1}, run_id=done)
    assert err.value.code == "Conflict"
