"""Replay against a real broker: verify after a mixed workload, detect a corrupted snapshot,
rebuild a processor's store byte-for-byte and run on it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from executor_support import WorkerThread
from processor_support import make_settings, running
from rocksdict import Options, Rdict

import processors.demo.actions  # noqa: F401  (registers demo.flaky)
from processors.client import RunClient
from processors.executors import Worker
from processors.replay import RebuildError, rebuild, verify
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from topology.admin import create_topology
from topology.catalog import topic_names
from topology.settings import KafkaSettings, producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"
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
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


def _workload(client: RunClient) -> list[str]:
    """Succeeded, retried, signalled, cancelled, rejected and still-waiting runs."""
    ids = [client.start("one-step", {"text": f"t{i}"}) for i in range(6)]
    ids += [client.start("noop-3", {}) for _ in range(4)]
    ids += [client.start("flaky-retry", {"fail_times": 1, "key": str(i)}) for i in range(3)]
    approved, cancelled, waiting = (client.start("approval", {}) for _ in range(3))
    client.start("one-step", {"text": "dup"}, run_id="dup-1")
    client.start("one-step", {"text": "different"}, run_id="dup-1")  # conflicting duplicate: rejected
    for rid in [*ids, "dup-1"]:
        assert client.wait(rid, timeout=60).status == "succeeded"
    for rid in (approved, cancelled, waiting):
        for ev in client.events(rid, follow=True, timeout=30):
            if ev["type"] == "RunWaiting":
                break
    client.signal(approved, "approval", {"approved": True})
    client.cancel(cancelled, "test")
    assert client.wait(approved, timeout=30).status == "succeeded"
    assert client.wait(cancelled, timeout=30).status == "cancelled"
    return [*ids, approved, cancelled, waiting, "dup-1"]


def _corrupt_snapshot(settings: KafkaSettings, client: RunClient, run_id: str) -> None:
    """Produce a snapshot for `run_id` whose state was tampered with (its digest is self-consistent)."""
    snap, _ = client.snapshot(run_id) or (None, None)
    assert snap is not None
    state = {**snap["state"], "output": {"text": "tampered"}}
    raw = orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
    bad = {**snap, "state": state, "state_digest": hashlib.sha256(raw).hexdigest()}
    producer = Producer(producer_config(settings))
    producer.produce(
        topic_names(settings).run_state,
        Codec.default().encode("run_state", bad),
        run_id.encode(),
        partition=client.partition_of(run_id),
    )
    assert producer.flush(10) == 0


def _store(path: Path, kinds: bytes) -> dict[bytes, bytes]:
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        return {k: v for k, v in db.items() if k[:1] in kinds or k == b"m:offset"}
    finally:
        db.close()


def test_verify_clean_then_detects_exactly_the_corrupted_run_and_rebuild_matches(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix)
    with RunClient(kafka, timeout_s=10) as client:
        for name in ("one-step.yaml", "flaky-retry.yaml", "noop-3.yaml"):
            client.register(EXAMPLES / name)
        client.register(APPROVAL)
        with running(settings), WorkerThread(Worker(name="replay-test"), settings):
            run_ids = _workload(client)
            report = verify(kafka)  # while the processor still runs
        assert report.ok, report.differences
        assert report.runs == len(set(run_ids)) and report.runs_checked == report.runs
        assert report.rejected >= 1 and report.events > 5 * len(run_ids)

        victim = run_ids[3]
        _corrupt_snapshot(kafka, client, victim)
        report = verify(kafka)
        assert [(d.run_id, d.kind) for d in report.differences] == [(victim, "digest_mismatch")]
        diff = report.differences[0]
        assert diff.expected_digest != diff.actual_digest and diff.snapshot_sequence == diff.folded_sequence

        # the CLI says the same, through the real entry point, with exit code 1
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        }
        out = subprocess.run(
            [str(RUNFOLD), "replay", "--verify", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 1, out.stderr
        body = orjson.loads(out.stdout)
        assert [d["run_id"] for d in body["differences"]] == [victim]

    # rebuild: the same bytes the processor's own store holds (states, event log, timers, offset)
    live_root = settings.store_root()
    rebuilt = settings.model_copy(update={"state_dir": tmp_path / "rebuilt"})
    result = rebuild(rebuilt)
    assert result.events == report.events
    with pytest.raises(RebuildError, match="--replace"):
        rebuild(rebuilt)  # never overwrites a store silently
    assert rebuild(rebuilt, replace=True).events == report.events
    # the CLI (real entry point) rebuilds the same way and reports its rate
    out = subprocess.run(
        [str(RUNFOLD), "replay", "--rebuild", "--state-dir", str(tmp_path / "cli"), "--json"],
        env={**env, "RUNFOLD_PARTITIONS": str(settings.partitions)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    cli_report = orjson.loads(out.stdout)
    assert cli_report["events"] == report.events and cli_report["events_per_s"] > 0
    for p in range(settings.partitions):
        # run states, event logs and the applied offset: byte-equal
        assert _store(rebuilt.store_root() / f"p{p}", b"se") == _store(live_root / f"p{p}", b"se")
        # timers: every live timer is rebuilt. The restore path (runtime Folder.fold_committed, reused
        # here) cannot see the TimerFired inputs that cleared fired timers live, so it may keep a fired
        # retry-backoff timer, which fires once more after a restart and is dropped by the engine as stale.
        live_timers = _store(live_root / f"p{p}", b"tr")
        assert live_timers.items() <= _store(rebuilt.store_root() / f"p{p}", b"tr").items()
    # and a processor runs on the rebuilt store: the waiting run can still be approved
    with RunClient(kafka, timeout_s=10) as client, running(rebuilt):
        waiting = run_ids[-2]
        client.signal(waiting, "approval", {"approved": True})
        assert client.wait(waiting, timeout=30).status == "succeeded"
