"""Durable timers: fire due timers as `TimerFired` receipts inside the transaction.

Timers live in each partition's store, indexed by due time (see store.py). A due
timer becomes a `TimerFired` record on `<p>.receipts` (key run_id, same partition),
produced in the open transaction, and is deleted in the overlay. The receipt comes
back as input, so the decider acts on it deterministically, using the record's
timestamp, exactly like any other receipt.

Firing is at-least-once: if the process dies after the commit but before the store
write, the restored store still holds the timer and fires it again; the engine drops
the second `TimerFired` (the timer id no longer matches a pending wait). The input
path also deletes a timer when its `TimerFired` comes back, so that window is short.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, due_of, timer_ref_key
from schemas import Codec


class TimerFirer:
    def __init__(
        self,
        codec: Codec,
        receipts_topic: str,
        produce: Callable[..., None],
        metrics: ProcessorMetrics,
        limit: int,
    ) -> None:
        self._encode = codec.encoder("receipts")
        self._topic = receipts_topic
        self._produce = produce
        self._metrics = metrics
        self._limit = limit

    @staticmethod
    def any_due(store: PartitionStore, now_ms: int) -> bool:
        return store.next_due_ms is not None and store.next_due_ms <= now_ms

    def fire_due(self, store: PartitionStore, overlay: PartitionOverlay, now_ms: int) -> int:
        """Produce TimerFired for the store's due timers not yet fired in this transaction."""
        t0 = time.perf_counter()
        fired = 0
        lateness: list[float] = []
        for tkey, body in store.due_timers(now_ms, self._limit):
            timer: dict[str, Any] = orjson.loads(body)
            run_id: str = timer["run_id"]
            timer_id: str = timer["timer_id"]
            if not overlay.timer_pending(timer_ref_key(run_id, timer_id), tkey):
                continue
            due = due_of(tkey)
            receipt = {
                **timer,
                "type": "TimerFired",
                "run_id": run_id,
                "ts_ms": now_ms,
                "record_id": f"timer:{timer_id}@{due}",
            }
            self._produce(self._topic, self._encode(receipt), run_id.encode(), partition=store.partition)
            overlay.clear_timer(run_id, timer_id)
            lateness.append((now_ms - due) / 1000.0)
            fired += 1
        self._metrics.timer_check.observe(time.perf_counter() - t0)
        if fired:
            self._metrics.timers_fired.inc(fired)
            for late in lateness:
                self._metrics.timer_lateness.observe(late)
            overlay.count("timers_fired", fired)
        return fired
