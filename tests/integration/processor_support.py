"""Test support for the processor integration tests: a processor in a thread, test code
acting as executors (real Kafka traffic, Avro via the codec), and read_committed readers.

Imported by tests/integration/test_processor*.py (no tests here).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from processors.engine import Catalog
from processors.engine.catalog import content_hash
from processors.kafka.fetch import first_then_buffered
from processors.runtime.loop import Processor
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from topology.admin import create_topology
from topology.settings import consumer_config, producer_config

CODEC = Codec.default()
ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
TERMINAL = frozenset({"RunSucceeded", "RunFailed", "RunCancelled"})


def action(name: str = "do", **extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": name, "writes": {name: {"from": "output"}}, **extra}


def workflow(
    wid: str, nodes: dict[str, Any], routes: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": wid,
        "revision": 1,
        "entry": [next(iter(nodes))],
        "nodes": nodes,
        "routes": routes or {},
        "state": {n: None for n in nodes},
        **extra,
    }


DEFINITIONS = [
    workflow("one", {"a": action("a")}),
    workflow("three", {"a": action("a"), "b": action("b"), "c": action("c")}, {"a": ["b"], "b": ["c"]}),
    workflow("retry", {"a": action("a", retry={"max_attempts": 3, "backoff_ms": 300})}),
    workflow(
        "sleepy",
        {"a": action("a"), "s": {"kind": "sleep", "duration_ms": 400}, "b": action("b")},
        {"a": ["s"], "s": ["b"]},
    ),
]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def make_settings(bootstrap: str, prefix: str, state_dir: Path, **kw: Any) -> ProcessorSettings:
    base: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "topic_prefix": prefix,
        "partitions": 2,
        "state_dir": state_dir,
        "commit_interval_ms": 20,
        "instance_id": "p1",
        "transaction_timeout_ms": 10_000,
        "activation_queues": ("default", "agents"),
    }
    base.update(kw)
    return ProcessorSettings(**base)


def setup_topology(settings: ProcessorSettings, definitions: list[dict[str, Any]] | None = None) -> None:
    create_topology(settings)
    register_definitions(settings, definitions if definitions is not None else DEFINITIONS)


def register_definitions(settings: ProcessorSettings, definitions: list[dict[str, Any]]) -> None:
    """Publish definitions to the definitions topic as `runfold defs register` does."""
    producer = Producer(producer_config(settings))
    catalog = Catalog()
    for raw in definitions:
        defn = catalog.register(raw)
        record = {
            "definition_id": defn.id,
            "revision": defn.revision,
            "content_hash": content_hash(defn),
            "definition": raw,
            "registered_ms": now_ms(),
        }
        producer.produce(
            settings.topics.definitions,
            CODEC.encode("definitions", record),
            f"{defn.id}@{defn.revision}".encode(),
        )
    producer.flush(10)


class ProcessorThread:
    """A processor running in a thread of the test process, stopped by an event."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.processor = Processor(settings)
        self.exit_code: int | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"processor-{settings.instance_id}", daemon=True
        )

    def _run(self) -> None:
        self.exit_code = self.processor.run()

    def start(self, timeout: float = 30) -> ProcessorThread:
        self.thread.start()
        if not self.processor.ready.wait(timeout):
            raise AssertionError("processor did not become ready")
        return self

    def stop(self, timeout: float = 30) -> int | None:
        self.processor.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "processor thread did not stop"
        return self.exit_code

    def wait_owned(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            parts = self.processor.partitions
            if parts is not None and len(parts.owned()) == n and not parts.restoring:
                return
            time.sleep(0.05)
        raise AssertionError(f"processor did not own {n} ready partitions in {timeout}s")


@contextlib.contextmanager
def running(settings: ProcessorSettings, partitions: int | None = 2) -> Iterator[ProcessorThread]:
    pt = ProcessorThread(settings).start()
    try:
        if partitions:
            pt.wait_owned(partitions)
        yield pt
    finally:
        pt.stop()


class Commands:
    """Sends commands and receipts as a service or an executor would; `flush` makes sure they
    arrived."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.producer = Producer(producer_config(settings, linger_ms=0))
        self.topics = settings.topics
        self._undelivered: dict[int, tuple[str, bytes | None, bytes | None]] = {}
        self._next = 0
        self.resent = 0

    def _produce(self, topic: str, value: bytes | None, key: bytes | None) -> None:
        n = self._next = self._next + 1
        self._undelivered[n] = (topic, value, key)

        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                self._undelivered.pop(n, None)

        self.producer.produce(topic, value, key, on_delivery=delivered)

    def send(self, kind: str, run_id: str, body: dict[str, Any], topic: str | None = None) -> None:
        msg = {"run_id": run_id, "ts_ms": now_ms(), "record_id": uuid.uuid4().hex, **body}
        target = topic or (self.topics.commands if kind == "commands" else self.topics.receipts)
        self._produce(target, CODEC.encode(kind, msg), run_id.encode())
        self.producer.poll(0)

    def start(self, run_id: str, definition_id: str, input: Any = None) -> None:
        self.send(
            "commands",
            run_id,
            {"type": "StartRun", "definition_id": definition_id, "revision": None, "input": input or {}},
        )

    def cancel(self, run_id: str, reason: str = "test") -> None:
        self.send("commands", run_id, {"type": "CancelRun", "reason": reason})

    def receipt(self, act: dict[str, Any], rtype: str, **fields: Any) -> None:
        ident = {k: act[k] for k in ("node", "lineage", "attempt", "dispatch_id")}
        self.send("receipts", act["run_id"], {"type": rtype, **ident, "worker_id": "test-worker", **fields})

    def complete(self, act: dict[str, Any], output: Any = None) -> None:
        self.receipt(
            act,
            "ActivationCompleted",
            output=output if output is not None else {"ok": True},
            usage=ZERO_USAGE,
        )

    def fail(self, act: dict[str, Any], retryable: bool) -> None:
        self.receipt(
            act,
            "ActivationFailed",
            code="ExecutionFailed",
            message="boom",
            retryable=retryable,
            usage=ZERO_USAGE,
        )

    def raw(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._produce(topic, value, key)

    def flush(self, timeout: float = 60.0) -> None:
        """Every record sent so far is delivered, or the test fails saying so. A broker just back
        from a freeze or a restart can take seconds to take writes again, and a librdkafka
        producer was seen stuck for good after one (stale broker handles, as in
        docs/runtime.md): after 20 s a new producer resends what was not delivered, as a
        service would (commands and receipts are idempotent by run and record id)."""
        deadline = time.monotonic() + timeout
        self.producer.flush(min(20.0, timeout))
        if self._undelivered:
            with contextlib.suppress(Exception):
                self.producer.purge()
            self.producer.flush(0)  # serves the purged records' reports
            self.producer = Producer(producer_config(self.settings, linger_ms=0))
            pending, self._undelivered = list(self._undelivered.values()), {}
            self.resent += len(pending)
            for topic, value, key in pending:
                self._produce(topic, value, key)
            self.producer.flush(max(0.0, deadline - time.monotonic()))
        left = len(self._undelivered)
        assert left == 0, f"{left} command/receipt records still undelivered after {timeout} s"


def assign_from_start(consumer: Consumer, topics: list[str], timeout: float = 15.0) -> int:
    """Assign every partition of `topics` from its first offset; returns how many partitions.

    Test readers observe a topic; they do not share it. Assignment keeps them out of group
    coordination, which a broker stall (tests/chaos/test_stalls.py) can leave a subscriber waiting on
    for longer than the test's deadline while the topic itself is complete and readable.
    """
    deadline = time.monotonic() + timeout
    while True:  # all topics, not by name: a by-name request can auto-create a topic
        meta = consumer.list_topics(timeout=timeout).topics
        missing = {
            t: meta[t].error if t in meta else "not found"
            for t in topics
            if t not in meta or meta[t].error is not None or not meta[t].partitions
        }
        if not missing:
            break
        if time.monotonic() > deadline:  # a broker's metadata may lag the one that created it
            raise AssertionError(f"no partitions to read after {timeout:.0f}s: {missing}")
        time.sleep(0.2)
    parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in sorted(meta[t].partitions)]
    consumer.assign(parts)
    return len(parts)


class Reader:
    """A read_committed reader of one or more topics (from the beginning), decoding as `kind`."""

    def __init__(self, settings: ProcessorSettings, topics: list[str], kind: str) -> None:
        self.consumer = Consumer(consumer_config(settings, f"reader-{uuid.uuid4().hex[:8]}"))
        assign_from_start(self.consumer, topics)
        self.kind = kind
        self.records: list[dict[str, Any]] = []
        self.raw: list[Any] = []

    def poll(self, timeout: float = 0.2) -> list[dict[str, Any]]:
        new = []
        for m in first_then_buffered(self.consumer, 500, timeout):
            if m.error() is not None:
                continue
            rec = CODEC.decode(self.kind, m.value())
            rec["_topic"], rec["_partition"], rec["_offset"] = m.topic(), m.partition(), m.offset()
            new.append(rec)
        self.records.extend(new)
        return new

    def drain(self, quiet: float = 0.5) -> list[dict[str, Any]]:
        """Read until nothing new arrives for `quiet` seconds."""
        while self.poll(quiet):
            pass
        return self.records

    def wait_for(
        self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float = 30, what: str = "condition"
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if pred(self.records):
                return self.records
        raise AssertionError(
            f"timed out waiting for {what}; saw {len(self.records)} records: "
            f"{[(r.get('type'), r.get('run_id')) for r in self.records[-20:]]}"
        )

    def of(self, run_id: str, rtype: str | None = None) -> list[dict[str, Any]]:
        return [
            r for r in self.records if r.get("run_id") == run_id and (rtype is None or r["type"] == rtype)
        ]

    def close(self) -> None:
        self.consumer.close()


def settled_value(metric: Any, expected: float, timeout: float = 10.0) -> float:
    """The value of a prometheus counter or gauge child once it equals `expected`, or at
    `timeout`. The processor applies a transaction's metrics after the commit returns, so a
    read_committed reader can see the records a moment before the counters count them."""
    deadline = time.monotonic() + timeout
    while (value := float(metric._value.get())) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def terminal_of(events: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["run_id"] == run_id and e["type"] in TERMINAL]


class Responder:
    """Test code acting as an action executor: answers each activation with `handler`."""

    def __init__(
        self,
        settings: ProcessorSettings,
        handler: Callable[[Commands, dict[str, Any]], None],
        queue: str = "default",
    ) -> None:
        self.reader = Reader(settings, [settings.topics.activations(queue)], "activations")
        self.commands = Commands(settings)
        self.handler = handler
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for act in self.reader.poll(0.05):
                self.seen.append(act)
                self.handler(self.commands, act)
            self.commands.producer.poll(0)

    def __enter__(self) -> Responder:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.thread.join(10)
        self.commands.flush()
        self.reader.close()


def complete_all(commands: Commands, act: dict[str, Any]) -> None:
    if act["type"] == "ActionActivation":
        commands.complete(act, {"node": act["node"]})


def spawn_processor(settings: ProcessorSettings, log: Path) -> subprocess.Popen[bytes]:
    """The run processor in a process of its own (to be `kill -9`ed), its stderr appended to
    `log`, committing every 20 ms; nothing of this process's RUNFOLD_* settings leaks into it."""
    args = [
        sys.executable,
        "-m",
        "processors.runtime",
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
        "--instance-id",
        settings.instance_id,
        "--state-dir",
        str(settings.state_dir),
        "--commit-interval-ms",
        "20",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env)
