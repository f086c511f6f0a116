"""`RunEventConsumer`: committed run events for a downstream service (analytics, billing, ...).

    from processors.downstream import RunEventConsumer
    with RunEventConsumer(group_id="billing") as events:
        for ev in events:                       # flat dicts (docs/messages.md), in order per run
            if ev["type"] == "RunSucceeded":
                bill(ev["run_id"], ev["usage"])  # make this idempotent: see below

Guarantees, plainly:
- Only committed events: `isolation.level=read_committed`, so an aborted processor
  transaction is never seen.
- Order per run: a run's events live on one partition, in sequence order.
- **At-least-once for the service.** The offset of an event is stored only after the
  loop body for it returned (the next `__next__` call), and committed in the
  background and on close. A crash can replay events handled since the last commit,
  so handlers must be idempotent: `(run_id, sequence)` identifies an event uniquely
  (`record_id` too), e.g. upsert by it or keep the last applied sequence per run.
- Undecodable records (not our contract) are skipped and counted, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from threading import Event
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from processors.kafka.records import coordinates
from schemas import Codec, DecodeError
from topology.catalog import topic_names
from topology.settings import KafkaSettings, consumer_config, load_settings

log = logging.getLogger("runfold.downstream")


class RunEventConsumer:
    def __init__(
        self,
        group_id: str,
        settings: KafkaSettings | None = None,
        *,
        from_beginning: bool = True,
        types: set[str] | None = None,
        codec: Codec | None = None,
        poll_timeout_s: float = 0.5,
        commit_interval_ms: int = 1000,
        **overrides: Any,
    ) -> None:
        self.settings = settings or load_settings()
        self.topic = topic_names(self.settings).run_events
        self.types = types
        self.poll_timeout_s = poll_timeout_s
        self._decode = (codec or Codec.default()).decoder("run_events")
        cfg = consumer_config(
            self.settings,
            group_id,
            read_committed=True,
            auto_offset_reset="earliest" if from_beginning else "latest",
            # offsets are *stored* by us after handling and committed by librdkafka
            enable_auto_commit=True,
            enable_auto_offset_store=False,
            auto_commit_interval_ms=commit_interval_ms,
            partition_assignment_strategy="cooperative-sticky",
            **overrides,
        )
        self._consumer = Consumer(cfg)
        self._consumer.subscribe([self.topic])
        self._pending: Message | None = None
        self.skipped = 0
        self.handled = 0

    def __enter__(self) -> RunEventConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ack(self) -> None:
        """Mark the last yielded event as handled (its offset + 1 becomes committable). Done
        for you when the next event is requested; call it after the last one before `close`."""
        msg = self._pending
        if msg is not None:
            self._pending = None
            self.handled += 1
            try:
                topic, partition, offset = coordinates(msg)
                self._consumer.store_offsets(offsets=[TopicPartition(topic, partition, offset + 1)])
            except KafkaException as e:  # partition revoked meanwhile: the new owner re-delivers it
                log.warning(
                    "could not store offset of %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), e
                )

    def poll(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next committed event (decoded), or None if none arrived within the timeout.
        Calling it again marks the previous event as handled."""
        self.ack()
        msg = self._consumer.poll(self.poll_timeout_s if timeout_s is None else timeout_s)
        if msg is None:
            return None
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
            return None
        try:
            ev = self._decode(msg.value())
        except DecodeError as e:
            self.skipped += 1
            log.error(
                "skipping undecodable record %s[%d]@%d: %s",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                e.reason,
            )
            self._pending = msg  # nothing to handle: committable at once
            return None
        self._pending = msg
        if self.types is not None and ev["type"] not in self.types:
            return None
        return ev

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            ev = self.poll()
            if ev is not None:
                yield ev

    def run(
        self,
        handler: Callable[[dict[str, Any]], None],
        *,
        stop: Event | None = None,
        max_events: int | None = None,
    ) -> int:
        """Call `handler` for every event until `stop` is set (or `max_events` were handled)."""
        n = 0
        while not (stop is not None and stop.is_set()) and (max_events is None or n < max_events):
            ev = self.poll()
            if ev is not None:
                handler(ev)
                n += 1
        self.ack()
        return n

    def commit(self) -> None:
        """Commit the offsets of the handled events now (synchronously)."""
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args and e.args[0].code() != KafkaError._NO_OFFSET:
                raise

    def close(self) -> None:
        """Commit what was handled and leave the group. The last yielded event counts as
        handled only if `ack()` was called: after an exception in the loop body it is delivered
        again (to this group's next consumer)."""
        try:
            self.commit()
        finally:
            self._consumer.close()
