"""The Faust integration against a real broker: examples/faust_app.py in a subprocess keeps
exact per-(definition, status) counts from committed run events only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from schemas import Codec
from topology.admin import create_topology
from topology.catalog import topic_names
from topology.settings import (
    KafkaSettings,
    admin_config,
    producer_config,
    transactional_producer_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "cost_micros": 3}


def _event(kind: str, run_id: str, seq: int, **body: object) -> dict:
    return {
        "type": kind,
        "run_id": run_id,
        "sequence": seq,
        "ts_ms": 1_700_000_000_000 + seq,
        "record_id": f"{run_id}#{seq}",
        **body,
    }


def _life(run_id: str, definition: str, end: str) -> list[dict]:
    evs = [
        _event(
            "RunAccepted",
            run_id,
            1,
            definition_id=definition,
            revision=1,
            bundle_hash="h",
            bundle={},
            input={},
            budgets={},
            labels={},
        ),
        _event("RunStarted", run_id, 2, superstep=1),
    ]
    if end == "succeeded":
        evs.append(_event("RunSucceeded", run_id, 3, output={"ok": True}, usage=USAGE))
    elif end == "failed":
        evs.append(
            _event(
                "RunFailed",
                run_id,
                3,
                usage=USAGE,
                failure={"code": "ExecutionFailed", "message": "boom", "retryable": False},
            )
        )
    elif end == "waiting":
        evs.append(_event("RunWaiting", run_id, 3, node="review", lineage="", signal="approval"))
    return evs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_faust_app_counts_runs_per_definition_and_status(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    create_topology(kafka_settings)
    codec = Codec.default()
    topic = topic_names(kafka_settings).run_events
    committed = (
        [_life(f"a-{i}", "alpha", "succeeded") for i in range(5)]
        + [_life(f"b-{i}", "beta", "failed") for i in range(3)]
        + [_life(f"w-{i}", "beta", "waiting") for i in range(2)]
    )
    producer = Producer(producer_config(kafka_settings))
    for life in committed:
        for ev in life:
            producer.produce(topic, codec.encode("run_events", ev), ev["run_id"].encode())
    # a redelivered event (same run, same sequence) must not count twice
    producer.produce(topic, codec.encode("run_events", committed[0][-1]), b"a-0")
    # a rejected start: sequence 0, never a run
    producer.produce(
        topic,
        codec.encode(
            "run_events",
            _event(
                "RunRejected",
                "bad-1",
                0,
                code="InvalidInput",
                reason="no",
                definition_id="alpha",
                command_type="StartRun",
            ),
        ),
        b"bad-1",
    )
    assert producer.flush(15) == 0
    # events of an aborted processor transaction: a read_committed reader never sees them
    txn = Producer(transactional_producer_config(kafka_settings, f"{kafka_settings.topic_prefix}-aborter"))
    txn.init_transactions(15)
    txn.begin_transaction()
    for i in range(4):
        for ev in _life(f"ghost-{i}", "ghost", "succeeded"):
            txn.produce(topic, codec.encode("run_events", ev), ev["run_id"].encode())
    txn.flush(15)
    txn.abort_transaction(15)

    app_id = f"{kafka_settings.topic_prefix}-faust-{uuid.uuid4().hex[:6]}"
    port = _free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "RUNFOLD_PARTITIONS": str(kafka_settings.partitions),
        "RUNFOLD_FAUST_APP_ID": app_id,
        "RUNFOLD_FAUST_WEB_PORT": str(port),
        "RUNFOLD_FAUST_DATADIR": str(tmp_path / "faust"),
    }
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"{app_id}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "faust_app.py"), "worker", "-l", "info"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    expected = {"alpha|succeeded": 5, "beta|failed": 3, "beta|waiting": 2}
    counts: dict = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and counts != expected:
            assert proc.poll() is None, f"faust worker exited with {proc.returncode}; see {log.name}"
            time.sleep(1.0)
            try:
                counts = httpx.get(f"http://127.0.0.1:{port}/runs/counts/", timeout=2).json()
            except httpx.HTTPError:
                continue
        # nothing more arrives later (the duplicate and the aborted events stay out)
        time.sleep(3.0)
        counts = httpx.get(f"http://127.0.0.1:{port}/runs/counts/", timeout=2).json()
        assert counts == expected, f"see {log.name}"
        # one of the waiting runs finishes: it moves from beta|waiting to beta|succeeded
        producer.produce(
            topic,
            codec.encode("run_events", _event("RunSucceeded", "w-0", 4, output=None, usage=USAGE)),
            b"w-0",
        )
        assert producer.flush(15) == 0
        want = {"alpha|succeeded": 5, "beta|failed": 3, "beta|waiting": 1, "beta|succeeded": 1}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and counts != want:
            time.sleep(1.0)
            counts = httpx.get(f"http://127.0.0.1:{port}/runs/counts/", timeout=2).json()
        assert counts == want
        # its local data went where it was told, not into the working directory
        assert (tmp_path / "faust").is_dir() and not (Path.cwd() / f"{app_id}-data").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        admin = AdminClient(admin_config(kafka_settings))
        faust_topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id)]
        if faust_topics:
            for f in admin.delete_topics(faust_topics).values():
                f.result(30)
