"""Helpers for the executor integration tests: produce activations, run a worker, read receipts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from processor_support import assign_from_start

from processors.engine.ids import dispatch_id
from processors.executors.runner import WorkerRunner
from processors.executors.sdk import Worker
from schemas import Codec
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, consumer_config, producer_config

TERMINAL = {"ActivationCompleted", "ActivationFailed", "ActivationCancelled"}


def committed_offsets(settings: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of `topic` (-1001: none)."""
    consumer = Consumer(consumer_config(settings, group))
    try:
        parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
    finally:
        consumer.close()


def activation(
    run_id: str,
    action: str = "echo",
    input: Any = None,
    queue: str = "default",
    node: str = "n",
    lineage: str = "",
    attempt: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    msg = {
        "type": "ActionActivation",
        "run_id": run_id,
        "ts_ms": int(time.time() * 1000),
        "record_id": uuid.uuid4().hex,
        "node": node,
        "lineage": lineage,
        "attempt": attempt,
        "dispatch_id": dispatch_id(run_id, node, lineage, attempt),
        "definition_id": "test",
        "root_run_id": run_id,
        "kind": "action",
        "action": action,
        "queue": queue,
        "input": input if input is not None else {},
        "deadline_ms": None,
        "lease_ms": 10_000,
        "heartbeat_ms": 1_000,
        "capabilities": [],
        "agent": None,
    }
    msg.update(extra)
    return msg


def cancel_notice(act: dict[str, Any], reason: str = "test cancel") -> dict[str, Any]:
    return {
        "type": "CancelActivation",
        "run_id": act["run_id"],
        "ts_ms": int(time.time() * 1000),
        "record_id": uuid.uuid4().hex,
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "reason": reason,
    }


def produce(
    settings: KafkaSettings,
    topic: str,
    kind: str,
    msgs: list[dict[str, Any]],
    producer: Producer | None = None,
) -> None:
    """Send `msgs` and wait for them; through `producer` when a test times what follows (a new
    producer's first record can wait ~0.5 s for its producer id)."""
    codec = Codec.default()
    producer = producer or Producer(producer_config(settings))
    for m in msgs:
        producer.produce(topic, codec.encode(kind, m), key=m["run_id"].encode())
        producer.poll(0)
    assert producer.flush(15) == 0


class ReceiptReader:
    """Reads receipts (read_committed) and collects them by dispatch id."""

    def __init__(self, settings: KafkaSettings, kind: str = "receipts", topic: str | None = None) -> None:
        self.codec = Codec.default()
        self.kind = kind
        self.consumer = Consumer(consumer_config(settings, f"reader-{uuid.uuid4().hex[:8]}"))
        assign_from_start(self.consumer, [topic or TopicNames(settings.topic_prefix).receipts])
        self.records: list[dict[str, Any]] = []

    def poll_until(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30, step_s: float = 0.2
    ) -> list[dict[str, Any]]:
        """Read until `done(records)`; `step_s` is how long one read may hold a partial batch."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not done(self.records):
            for m in self.consumer.consume(num_messages=500, timeout=step_s):
                if m.error() is None:
                    self.records.append(self.codec.decode(self.kind, m.value()))
        return self.records

    def terminal(self) -> dict[str, dict[str, Any]]:
        return {r["dispatch_id"]: r for r in self.records if r["type"] in TERMINAL}

    def close(self) -> None:
        self.consumer.close()


class WorkerThread:
    """A WorkerRunner on its own event loop in a thread; `stop()` drains it like SIGTERM."""

    def __init__(self, worker: Worker, settings: KafkaSettings) -> None:
        self.runner = WorkerRunner(worker, settings)
        self.exit_code: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        self.exit_code = self._loop.run_until_complete(self.runner.run(install_signals=False))

    def __enter__(self) -> WorkerThread:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30) -> int | None:
        self._loop.call_soon_threadsafe(self.runner.request_stop)
        self._thread.join(timeout_s)
        return self.exit_code

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.stop()


HERE = Path(__file__).resolve().parent


def spawn_worker(
    settings: KafkaSettings,
    name: str,
    module: str = "actions_for_tests",
    queues: Sequence[str] = ("default",),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`runfold worker` in a process of its own (to be `kill -9`ed), serving `module` (a file of
    tests/integration) on `queues`, with `env` added to its environment."""
    full = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent.parent)]),
        **(env or {}),
    }
    args = [sys.executable, "-m", "processors.cli.worker", "worker", "--module", module]
    for queue in queues:
        args += ["--queue", queue]
    args += ["--name", name, "--log-level", "WARNING"]
    return subprocess.Popen(args, env=full, cwd=HERE.parent.parent)
