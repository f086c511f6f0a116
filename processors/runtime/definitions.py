"""The definitions table: every processor reads all of `<p>.definitions` into its Catalog.

At startup `catch_up` reads every partition from the beginning to its end (read_committed)
before any command is processed, so a StartRun never races a definition that was
registered before the processor started. Lifecycle records (deprecate, promote: engine
lifecycle.py) on the same topic are folded into the Catalog in topic order. Afterwards `poll` picks up new revisions
without blocking, once per loop iteration.
"""

from __future__ import annotations

import threading
import time
from logging import Logger
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from processors.engine import Catalog
from processors.engine.lifecycle import is_lifecycle, parse_lifecycle
from processors.kafka.exits import KEEP_WAITING, StopRequested, until_stopped
from processors.kafka.fetch import first_then_buffered
from processors.kafka.watermarks import Offsets
from processors.runtime.metrics import ProcessorMetrics
from schemas import Codec, DecodeError

_LEADERLESS = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


WAIT_LOG_S = 10.0  # a wait for the cluster is said this often


class DefinitionsReader:
    def __init__(
        self,
        consumer_config: dict[str, Any],
        topic: str,
        catalog: Catalog,
        codec: Codec,
        metrics: ProcessorMetrics,
        log: Logger,
    ) -> None:
        self.topic = topic
        self.catalog = catalog
        self._decode = codec.decoder("definitions")
        self._metrics = metrics
        self._log = log
        self._consumer = Consumer(consumer_config)
        # never the consumer's own offset queries: they abort while brokers fail over (kafka/watermarks.py)
        self._offsets = Offsets.like(consumer_config)
        self.registered = 0
        self.errors = 0

    def catch_up(self, timeout_s: float, stop: threading.Event) -> int:
        """Assign every partition from the beginning; read to the end. Returns definitions read.
        A stop request ends the wait (StopRequested)."""
        meta = until_stopped(lambda t: self._consumer.list_topics(self.topic, timeout=t), stop, timeout_s)
        tmeta = meta.topics.get(self.topic)
        if tmeta is None or tmeta.error is not None:
            raise RuntimeError(
                f"definitions topic {self.topic} is missing ({tmeta.error if tmeta else 'absent'}); "
                "create the topology first (runfold topology create)"
            )
        parts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(tmeta.partitions)]
        self._consumer.assign(parts)
        # A cluster that cannot serve a partition (its leader lost, two brokers of three down) is
        # waited for, however long, and said every WAIT_LOG_S (issue 48: no process gives up
        # because of an outage); `timeout_s` is how long before the first such line.
        deadline = time.monotonic() + timeout_s
        pending = set()
        for tp in parts:
            low, high = self._watermarks(tp.partition, deadline, stop)
            if high > low:
                pending.add(tp.partition)
        while pending:
            if stop.is_set():
                raise StopRequested
            if time.monotonic() > deadline:
                self._log.warning(
                    "definitions: not caught up yet; waiting for the cluster",
                    extra={"topic": self.topic, "behind": sorted(pending)},
                )
                deadline = time.monotonic() + WAIT_LOG_S
            for msg in first_then_buffered(self._consumer, 500, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                self._apply(msg.key(), msg.value())
        self._metrics.definitions.set(self.registered)
        return self.registered

    def _watermarks(self, partition: int, deadline: float, stop: threading.Event) -> tuple[int, int]:
        """Watermarks, retried while a just-created topic has no leader yet (`topology create` then start)."""
        while True:
            if stop.is_set():
                raise StopRequested
            try:
                return self._offsets.watermarks(
                    TopicPartition(self.topic, partition), max(0.1, min(1.0, deadline - time.monotonic()))
                )
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() and err.code() not in _LEADERLESS and err.code() not in KEEP_WAITING:
                    raise
                if time.monotonic() > deadline:
                    self._log.warning(
                        "definitions: partition offsets unavailable; waiting for the cluster",
                        extra={"topic": self.topic, "partition": partition, "error": err.str()},
                    )
                    deadline = time.monotonic() + WAIT_LOG_S
                stop.wait(0.2)

    def poll(self) -> int:
        """Non-blocking: apply whatever new definition records are buffered."""
        n = 0
        for msg in self._consumer.consume(100, 0):
            if msg.error() is None:
                self._apply(msg.key(), msg.value())
                n += 1
        if n:
            self._metrics.definitions.set(self.registered)
        return n

    def read_to_now(self, timeout_s: float) -> bool:
        """Apply every definition record written before this call (each partition's end as it
        is now), waiting at most `timeout_s`; whether it got there. For a StartRun that
        names a definition this catalog lacks: registered a moment before the command, it may
        not have reached `poll` yet, and a rejection (NotFound) would be wrong."""
        deadline = time.monotonic() + timeout_s
        parts = self._consumer.assignment()
        ends: dict[int, int] = {}
        for tp in parts:
            try:
                low, high = self._offsets.watermarks(tp, max(0.05, deadline - time.monotonic()))
            except KafkaException:
                return False
            if high > low:  # an empty partition has no position to reach
                ends[tp.partition] = int(high)
        n = 0
        done = False
        while not done and time.monotonic() < deadline:
            positions = self._consumer.position([TopicPartition(self.topic, p) for p in ends])
            done = all(tp.offset >= ends[tp.partition] for tp in positions)
            if not done:
                for msg in self._consumer.consume(100, min(0.05, max(0.0, deadline - time.monotonic()))):
                    if msg.error() is None:
                        self._apply(msg.key(), msg.value())
                        n += 1
        if n:
            self._metrics.definitions.set(self.registered)
        return done

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return  # compaction tombstone: revisions are immutable, nothing to unregister
        try:
            record = self._decode(value)
            body = record["definition"]
            if is_lifecycle(body):  # deprecate/promote: lifecycle.py
                event = parse_lifecycle(body)
                self.catalog.apply(event)
                self._log.info("definition lifecycle", extra={"event": event.event, "target": event.target})
                return
            self.catalog.register(body)
            self.registered += 1
        except (DecodeError, ValueError, KeyError, TypeError) as e:
            # DefinitionError is a ValueError. The CLI validates before publishing, so this
            # is a foreign or conflicting record: count it, name it, keep going.
            self.errors += 1
            self._metrics.definition_errors.inc()
            self._log.warning(
                "definition record rejected",
                extra={"key": (key or b"").decode(errors="replace"), "error": str(e)[:500]},
            )

    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()
