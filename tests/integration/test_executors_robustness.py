"""Executors against the real broker when what they get or must send is not ordinary: a null
record, a receipt too large or not encodable, a receipt the broker refuses, a rebalance with a
backlog. Each activation still ends with a terminal receipt, or is left uncommitted for the next
reader; nothing is run twice that the design says runs once."""

from __future__ import annotations

import asyncio
import base64
import collections
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import actions_for_tests  # noqa: F401  (registers test.* actions on the module-level registry)
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from executor_support import TERMINAL, ReceiptReader, WorkerThread, activation, committed_offsets, produce

from processors.engine.ids import dispatch_id
from processors.executors import Worker
from processors.executors.child_executor import ChildExecutor
from processors.kafka.exits import ExitCode
from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, admin_config, producer_config, transactional_producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def ks(kafka_settings: KafkaSettings) -> Iterator[KafkaSettings]:
    create_topology(kafka_settings)
    yield kafka_settings


def _null(ks: KafkaSettings, topic: str, key: bytes) -> None:
    producer = Producer(producer_config(ks))
    producer.produce(topic, None, key=key)
    assert producer.flush(10) == 0


def test_a_null_activation_is_dead_lettered_and_the_next_one_runs(ks: KafkaSettings) -> None:
    names = TopicNames(ks.topic_prefix)
    topic = names.activations("default")
    _null(ks, topic, b"r-x")
    act = activation("r-x", "echo", {"ok": 1})  # same key: the same partition, after the null
    produce(ks, topic, "activations", [act])
    reader = ReceiptReader(ks)
    dead = ReceiptReader(ks, kind="dead_letters", topic=names.dead_letters)
    with WorkerThread(Worker(name="rb", queues=["default"], concurrency=2), ks) as wt:
        reader.poll_until(
            lambda r: act["dispatch_id"] in {x["dispatch_id"] for x in r if x["type"] in TERMINAL}, 20
        )
        dead.poll_until(lambda r: bool(r), 20)
        alive = wt._thread.is_alive()
    assert alive and "null value" in dead.records[0]["error"]


def test_a_receipt_too_large_or_not_encodable_becomes_a_failure_and_the_offset_moves(
    ks: KafkaSettings,
) -> None:
    w = Worker(name="rb", queues=["default"], concurrency=2, commit_interval_ms=50)

    @w.action("rb.big")
    async def big(ctx: object, input: dict) -> dict:
        return {"blob": "x" * input["n"]}

    @w.action("rb.fs")
    def fs(ctx: object, input: dict) -> None:
        name = b"report-\xff.csv".decode("utf-8", "surrogateescape")  # as os.listdir names such a file
        raise FileNotFoundError(f"no such file: {name}")

    topic = TopicNames(ks.topic_prefix).activations("default")
    acts = [
        activation("r-big", "rb.big", {"n": 1_100_000}),
        activation("r-big", "rb.fs", {}, node="f"),
        activation("r-big", "echo", {"after": True}, node="m"),
    ]  # one partition, in this order
    produce(ks, topic, "activations", acts)
    reader = ReceiptReader(ks)
    with WorkerThread(w, ks) as wt:
        reader.poll_until(
            lambda r: (
                {a["dispatch_id"] for a in acts} <= {x["dispatch_id"] for x in r if x["type"] in TERMINAL}
            ),
            30,
        )
        deadline = time.monotonic() + 10
        while wt.runner.running and time.monotonic() < deadline:
            time.sleep(0.1)
        stuck = list(wt.runner.running)
        started = time.monotonic()
        wt.stop(60)
        stop_s = time.monotonic() - started
    terminal = reader.terminal()
    too_large, not_encodable = terminal[acts[0]["dispatch_id"]], terminal[acts[1]["dispatch_id"]]
    assert (too_large["type"], too_large["code"], too_large["retryable"]) == (
        "ActivationFailed",
        "InvalidOutput",
        False,
    )
    assert "over the" in too_large["message"] and "limit of a receipt" in too_large["message"]
    assert (not_encodable["type"], not_encodable["code"]) == ("ActivationFailed", "InvalidOutput")
    assert "not encodable" in not_encodable["message"]
    assert terminal[acts[2]["dispatch_id"]]["type"] == "ActivationCompleted"
    assert stuck == [] and stop_s < 15  # no slot held for good, no drain waiting for it
    assert max(committed_offsets(ks, w.settings.group_id(ks.topic_prefix), topic).values()) == 3


def test_receipts_fit_a_receipts_topic_with_a_lowered_record_limit(ks: KafkaSettings) -> None:
    names = TopicNames(ks.topic_prefix)
    admin = AdminClient(admin_config(ks))
    limit = ConfigResource(
        "topic",
        names.receipts,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([limit]).values():
        future.result(10)
    time.sleep(1)
    w = Worker(name="rb", queues=["default"], concurrency=2, commit_interval_ms=50)

    @w.action("rb.noisy")
    async def noisy(ctx: object, input: dict) -> dict:
        return {"blob": base64.b64encode(os.urandom(60_000)).decode()}  # ~80 KB, incompressible

    act = activation("r-refused", "rb.noisy", {})
    # small receipts, many (their batches would pass 20 KB): none may share the large one's fate
    small = [
        activation("r-refused", "test.identity", {"i": i, "pad": "p" * 400}, node=f"s{i}") for i in range(60)
    ]
    topic = names.activations("default")
    produce(ks, topic, "activations", [act, *small])
    reader = ReceiptReader(ks)
    with WorkerThread(w, ks):
        reader.poll_until(lambda r: len({x["dispatch_id"] for x in r if x["type"] in TERMINAL}) == 61, 30)
    terminal = reader.terminal()
    receipt = terminal[act["dispatch_id"]]
    assert (receipt["type"], receipt["code"]) == ("ActivationFailed", "InvalidOutput")
    assert "over the 18976-byte limit of a receipt" in receipt["message"]  # 20000 less the margin
    assert {terminal[a["dispatch_id"]]["type"] for a in small} == {"ActivationCompleted"}
    assert max(committed_offsets(ks, w.settings.group_id(ks.topic_prefix), topic).values()) == 61


CALLS: dict[str, list[str]] = collections.defaultdict(list)  # dispatch -> the workers that ran it


def _slow_worker(name: str) -> Worker:
    w = Worker(name=name, queues=["default"], concurrency=1, backlog=32, drain_timeout_ms=1000)

    @w.action("rb.slow")
    async def slow(ctx: object, input: dict) -> dict:
        CALLS[ctx.dispatch_id].append(ctx.worker_id)  # type: ignore[attr-defined]
        await asyncio.sleep(0.7)
        return {"i": input["i"]}

    return w


def test_a_rebalance_hands_the_revoked_backlog_over_without_running_it_twice(ks: KafkaSettings) -> None:
    topic = TopicNames(ks.topic_prefix).activations("default")
    acts = [activation(f"r{i}", "rb.slow", {"i": i}) for i in range(16)]  # over both partitions
    produce(ks, topic, "activations", acts)
    reader = ReceiptReader(ks)
    a, b = WorkerThread(_slow_worker("A"), ks), WorkerThread(_slow_worker("B"), ks)
    with a:
        reader.poll_until(lambda r: any(x["type"] == "ActivationAccepted" for x in r), 30)
        time.sleep(1.0)
        waiting_in_a = len(a.runner.backlog)
        with b:  # B joins: A's partitions are revoked, one of them goes to B
            reader.poll_until(
                lambda r: len({x["dispatch_id"] for x in r if x["type"] in TERMINAL}) >= len(acts), 60
            )
            b.stop(30)
        a.stop(30)
    twice = [d for d in (x["dispatch_id"] for x in acts) if len(CALLS[d]) > 1]
    assert waiting_in_a >= 4  # there was a backlog to hand over
    # at most the handler A was running when its partition moved runs again (documented)
    assert len(twice) <= 1, twice


def test_the_child_executor_dead_letters_a_null_child_activation_and_goes_on(ks: KafkaSettings) -> None:
    names = TopicNames(ks.topic_prefix)
    _null(ks, names.child_activations, b"parent-1")
    cancel = {
        "type": "ChildRunCancel",
        "run_id": "parent-1",
        "ts_ms": int(time.time() * 1000),
        "record_id": uuid.uuid4().hex,
        "node": "n",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": dispatch_id("parent-1", "n", "", 1),
        "child_run_id": "parent-1/n",
        "reason": "x",
    }
    produce(ks, names.child_activations, "child_activations", [cancel])
    commands = ReceiptReader(ks, kind="commands", topic=names.commands)
    executor = ChildExecutor(ks)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(executor.run(install_signals=False)), daemon=True)
    thread.start()
    try:
        commands.poll_until(lambda r: any(x["type"] == "CancelRun" for x in r), 25)
        alive = thread.is_alive()
    finally:
        executor.request_stop()
        thread.join(10)
    assert alive and executor.counts["dead_letters"] == 1 and result == [0]


def test_a_fenced_child_executor_process_exits_3_and_commits_nothing(ks: KafkaSettings) -> None:
    """The `runfold child-executor` process end to end: a second instance with its instance id
    fences it; its next transaction fails, and the process exits 3 (fenced: the processor's
    code, so a supervisor does not restart it in a loop) instead of hanging or committing the
    batch."""
    names = TopicNames(ks.topic_prefix)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": ks.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": ks.topic_prefix,
    }
    env.pop("RUNFOLD_BOOTSTRAP_SERVERS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "processors.cli.worker", "child-executor", "--instance-id", "x"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    reading = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    reading.start()
    try:
        end = time.monotonic() + 30
        while not any("child executor consuming" in line for line in stderr) and time.monotonic() < end:
            assert proc.poll() is None, "".join(stderr)
            time.sleep(0.1)
        time.sleep(3)  # its group join settles: it owns every partition
        usurper = Producer(transactional_producer_config(ks, f"{ks.topic_prefix}-child-executor-x"))
        usurper.init_transactions(30)  # a new epoch for the id: the running process is fenced
        cancels = []
        for parent in ("parent-1", "parent-2", "parent-3", "parent-4"):
            cancels.append(
                {
                    "type": "ChildRunCancel",
                    "run_id": parent,
                    "ts_ms": int(time.time() * 1000),
                    "record_id": uuid.uuid4().hex,
                    "node": "n",
                    "lineage": "",
                    "attempt": 1,
                    "dispatch_id": dispatch_id(parent, "n", "", 1),
                    "child_run_id": f"{parent}/n",
                    "reason": "x",
                }
            )
        produce(ks, names.child_activations, "child_activations", cancels)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reading.join(5)
    log = "".join(stderr)
    assert code == ExitCode.FENCED, log
    assert "child executor stopped: fenced" in log, log
    commands = ReceiptReader(ks, kind="commands", topic=names.commands)
    time.sleep(2)
    assert commands.poll_until(lambda r: False, 5) == []  # nothing of the fenced batch committed
    commands.close()
