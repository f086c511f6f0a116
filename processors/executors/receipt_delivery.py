"""Receipts out and offsets committed: a terminal receipt settles its activation only once the
broker has it; one refused as such is replaced by a small failure; offsets commit at the
per-partition low watermark. A part of the `WorkerRunner` (runner.py)."""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from processors.executors import receipts
from processors.executors.inflight import Entry, now_ms
from processors.executors.metrics import WorkerMetrics
from processors.executors.offsets import OffsetTracker
from processors.executors.settings import WorkerSettings
from topology.catalog import TopicNames

log = logging.getLogger("runfold.worker")
RECENT_FINISHED = 10_000
# A terminal receipt the broker refused as such (not for an outage). Sent again once (the broker
# refuses whole batches, so a small receipt can share the fate of a large one), then replaced.
_REFUSED = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
    }
)


class ReceiptDelivery:
    def __init__(
        self,
        settings: WorkerSettings,
        names: TopicNames,
        worker_id: str,
        metrics: WorkerMetrics,
        tracker: OffsetTracker,
        encode_receipt: Callable[[dict[str, Any]], bytes],
        running: dict[str, Entry],
        counts: dict[str, int],
        producer: Producer,
        receipt_limit: int,
        on_lost: Callable[[str], None],
    ) -> None:
        """`running`: the started activations (dispatch_id -> entry), shared with the runner;
        `counts`: the worker's outcome counts; `on_lost(why)`: a terminal receipt could not be
        delivered, the worker must stop (exit 1)."""
        self._settings = settings
        self._names = names
        self._worker_id = worker_id
        self._metrics = metrics
        self._tracker = tracker
        self._encode_receipt = encode_receipt
        self._running = running
        self._counts = counts
        self._on_lost = on_lost
        self.producer = producer  # replaced (before anything is produced) to fit the receipts topic
        self.receipt_limit = receipt_limit  # bytes a receipt may take
        self.finished: OrderedDict[str, None] = OrderedDict()  # recently settled dispatch ids
        self.unacked = 0  # terminal receipts produced, delivery not yet reported
        self._last_commit_ms = 0

    def flush(self, timeout_s: float) -> int:
        return self.producer.flush(timeout_s)

    def produce(
        self,
        activation: dict[str, Any],
        receipt: dict[str, Any],
        on_delivery: Any = None,
        payload: bytes | None = None,
    ) -> None:
        if payload is None:
            payload = self._encode_receipt(receipt)
        key = activation["run_id"].encode()
        self._metrics.count_receipt(receipt["type"])
        while True:
            try:
                self.producer.produce(self._names.receipts, payload, key=key, on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: serve delivery reports and retry
                self.producer.poll(0.05)

    def send_terminal(self, entry: Entry, receipt: dict[str, Any]) -> None:
        """Produce the receipt that settles `entry`; one that cannot be encoded, or is too large
        for the broker, is replaced by a small failure saying why (`receipts.undeliverable`)."""
        payload: bytes | None = None
        try:
            encoded = self._encode_receipt(receipt)
            if len(encoded) > self.receipt_limit:
                receipt = self._substitute(
                    entry,
                    receipt,
                    f"{len(encoded)} bytes, over the {self.receipt_limit}-byte limit of a receipt",
                )
            else:
                payload = encoded
        except Exception as exc:  # not encodable (e.g. a lone surrogate in a message, a usage over 64 bits)
            receipt = self._substitute(entry, receipt, f"not encodable: {exc}")
        kind = receipt["type"]
        self._counts[
            {"ActivationCompleted": "completed", "ActivationCancelled": "cancelled"}.get(kind, "failed")
        ] += 1
        self._metrics.count_outcome(entry.label, kind, receipt.get("code"))
        self._produce_terminal(entry, receipt, payload)

    def _produce_terminal(self, entry: Entry, receipt: dict[str, Any], payload: bytes | None = None) -> None:
        entry.delivery_attempts += 1
        self.unacked += 1
        done = functools.partial(self._terminal_delivered, entry, receipt)
        try:
            self.produce(entry.activation, receipt, done, payload)
        except KafkaException as exc:  # refused at once (the broker was never asked)
            self.unacked -= 1
            self._undelivered(entry, receipt, exc.args[0])

    def _substitute(self, entry: Entry, receipt: dict[str, Any], why: str) -> dict[str, Any]:
        entry.substituted = True
        log.error(
            "receipt %s for %s cannot be sent (%s): sending a failure instead",
            receipt["type"],
            receipt["dispatch_id"],
            why,
        )
        self._metrics.count("receipt_errors", "substituted")
        return receipts.undeliverable(entry.activation, self._worker_id, receipt["type"], why)

    def _terminal_delivered(
        self, entry: Entry, receipt: dict[str, Any], err: KafkaError | None, _msg: Message
    ) -> None:
        self.unacked -= 1
        if err is not None:
            self._undelivered(entry, receipt, err)
            return
        self._settle(entry)

    def _undelivered(self, entry: Entry, receipt: dict[str, Any], err: KafkaError) -> None:
        """A terminal receipt the broker does not have. Its offset is never marked done without
        it (a crash must deliver the activation again): refused as such → a small failure
        instead; not delivered in time (an outage) → again, for as long as it takes; anything
        else, or a failure refused too → the worker stops (exit 1) and leaves the activation
        uncommitted for whoever reads it next."""
        if err.code() in _REFUSED and not entry.substituted and not err.fatal():
            if entry.delivery_attempts < 2:  # maybe refused with a large neighbour in its batch
                self._produce_terminal(entry, receipt)
            else:
                self._produce_terminal(
                    entry, self._substitute(entry, receipt, f"refused by the broker: {err.str()}")
                )
            return
        if err.code() == KafkaError._MSG_TIMED_OUT or (err.retriable() and entry.delivery_attempts < 3):
            log.warning(
                "receipt %s not delivered (%s, attempt %d); sending it again",
                receipt["type"],
                err,
                entry.delivery_attempts,
            )
            self._metrics.count("receipt_errors", "retried")
            self._produce_terminal(entry, receipt)
            return
        self._metrics.count("receipt_errors", "lost")
        self._running.pop(entry.activation["dispatch_id"], None)  # its offset stays uncommitted
        self._on_lost(f"receipt {receipt['type']} for {receipt['dispatch_id']} not delivered: {err.str()}")

    def _settle(self, entry: Entry) -> None:
        dispatch = entry.activation["dispatch_id"]
        self._running.pop(dispatch, None)
        self.finished[dispatch] = None
        if len(self.finished) > RECENT_FINISHED:
            self.finished.popitem(last=False)
        for offset in entry.offsets:
            self._tracker.done(entry.tp, offset)
        for tp, offset in entry.extra:
            self._tracker.done(tp, offset)

    def commit(self, consumer: Consumer, force: bool, synchronous: bool = False) -> None:
        now = now_ms()
        if not force and now - self._last_commit_ms < self._settings.commit_interval_ms:
            return
        self._last_commit_ms = now
        commits = self._tracker.take_commits()
        if not commits:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in commits.items()]
        try:
            if synchronous:
                consumer.commit(offsets=offsets, asynchronous=False)
            else:
                consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # e.g. a rebalance in progress: the next owner re-runs, leases cover it
            log.warning("offset commit failed: %s", exc)
            self._metrics.count("offset_commits", "failed")
            return
        self._metrics.count("offset_commits", "requested")
        self._metrics.count("offsets_committed", n=len(offsets))
