"""The runtime's fold into a real RocksDB store, without Kafka: `Folder` + `PartitionOverlay` +
`PartitionStore`, a transaction at a time, outputs collected (tests of the processor's store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from processors.engine import Catalog, EngineContext
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore
from processors.runtime.timers import TimerFirer
from schemas import Codec
from topology.catalog import TopicNames

TS = 1_764_400_000_000
RETENTION = 60_000
CODEC = Codec.default()
TOPICS = TopicNames("t")
ONE = {
    "schema": "runfold.workflow/v1",
    "id": "one",
    "revision": 1,
    "entry": ["a"],
    "state": {"a": None},
    "nodes": {"a": {"kind": "action", "action": "a", "writes": {"a": {"from": "output"}}}},
    "budgets": {"wall_time_ms": 3_600_000},
}


class Rig:
    def __init__(self, path: Path, partition: int = 0) -> None:
        catalog = Catalog()
        catalog.register(ONE)
        self.out: list[tuple[str, bytes]] = []
        self.keyed: list[tuple[str, bytes, bytes | None]] = []  # (topic, key, value), tombstones too
        self.folder = Folder(
            EngineContext(catalog=catalog),
            CODEC,
            TOPICS,
            self._produce,
            lambda err, msg: None,
            lambda: TS,
            RETENTION,
        )
        self.partition = partition
        self.store = PartitionStore(path, partition)

    def _produce(self, topic: str, value: bytes | None, key: bytes, **kw: Any) -> None:
        self.out.append((topic, value))  # type: ignore[arg-type]
        self.keyed.append((topic, key, value))

    def transaction(self, *inputs: tuple[str, dict[str, Any]]) -> None:
        ov, counters = PartitionOverlay(self.store), TxnCounters()
        for i, (kind, msg) in enumerate(inputs):
            topic = TOPICS.commands if kind == "commands" else TOPICS.receipts
            self.folder.fold_input(
                ov, counters, topic, self.partition, i, msg["run_id"].encode(), CODEC.encode(kind, msg)
            )
        self.folder.snapshots(ov, self.partition, counters)
        ov.write(None)

    def activation(self, run_id: str) -> dict[str, Any]:
        """The run's latest activation."""
        acts = [CODEC.decode("activations", v) for t, v in self.out if t == TOPICS.activations("default")]
        return [a for a in acts if a["run_id"] == run_id][-1]

    def events(self) -> list[bytes]:
        return [v for t, v in self.out if t == TOPICS.run_events]


def start(run_id: str) -> tuple[str, dict[str, Any]]:
    return "commands", {
        "type": "StartRun",
        "run_id": run_id,
        "ts_ms": TS,
        "record_id": f"c-{run_id}",
        "definition_id": "one",
        "revision": None,
        "input": {},
    }


def completed(act: dict[str, Any], ts: int) -> tuple[str, dict[str, Any]]:
    return "receipts", {
        "type": "ActivationCompleted",
        "run_id": act["run_id"],
        "ts_ms": ts,
        "record_id": f"r-{act['dispatch_id']}",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        "output": {"ok": 1},
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0},
    }


def stopped(act: dict[str, Any], ts: int) -> tuple[str, dict[str, Any]]:
    """The worker's confirmed stop of `act` after a CancelActivation."""
    return "receipts", {
        "type": "ActivationCancelled",
        "run_id": act["run_id"],
        "ts_ms": ts,
        "record_id": f"s-{act['dispatch_id']}",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        "reason": "cancelled",
        "confirmed": True,
    }


def purge(store: PartitionStore, now_ms: int) -> int:
    """What the loop does: the due runs go through a (committed) transaction's overlay.
    Returns how many runs were purged (not counting stale entries dropped)."""
    due = store.due_purges(now_ms)
    ov = PartitionOverlay(store)
    for xkey, run_id, status in due:
        ov.purge(xkey, run_id, status)
    ov.write(None)
    return sum(status is not None for _, _, status in due)


def timer_ids(store: PartitionStore, run_id: str) -> list[str]:
    it = store.db.iter()
    prefix = b"r" + run_id.encode() + b"\x1f"
    it.seek(prefix)
    out = []
    while it.valid() and it.key().startswith(prefix):
        out.append(it.key()[len(prefix) :].decode())
        it.next()
    return out


_METRICS = ProcessorMetrics()


def fire(rig: Rig, now_ms: int) -> list[dict[str, Any]]:
    """What the loop does when timers are due: TimerFired records, the timers cleared."""
    fired: list[bytes] = []
    firer = TimerFirer(
        CODEC, TOPICS.receipts, lambda topic, value, key, **kw: fired.append(value), _METRICS, 100
    )
    ov = PartitionOverlay(rig.store)
    firer.fire_due(rig.store, ov, now_ms)
    ov.write(None)
    return [CODEC.decode("receipts", raw) for raw in fired]


def restore(rig: Rig, path: Path) -> PartitionStore:
    """A new owner's store: every committed run event folded (Folder.fold_committed)."""
    store = PartitionStore(path, 0)
    ov = PartitionOverlay(store)
    for raw in rig.events():
        rig.folder.fold_committed(ov, raw)
    Folder.dump_all(ov)
    ov.write(None)
    return store


def run_state(rig: Rig) -> dict[bytes, bytes | None]:
    """`<p>.run-state` as compaction leaves it: each key's last record, in the order last written."""
    latest: dict[bytes, bytes | None] = {}
    for topic, key, value in rig.keyed:
        if topic == TOPICS.run_state:
            latest.pop(key, None)
            latest[key] = value
    return latest


def restore_from_state(
    rig: Rig, path: Path, events_from: int | None = None, crash: str | None = None
) -> PartitionStore:
    """A new owner's store restored from run-state (assignment.py: `_seed`, then the run
    events): each run's latest record as compaction leaves it, then the run events from index
    `events_from` on (default: none; an earlier index is a run-events end E0 taken before the
    snapshots were read). `crash`: "before-seed" (the seed batch never written: the store is
    new again and is seeded again) or "after-chunk" (the process dies after writing half of
    the run events: the store reopened, the restore goes on from it)."""
    latest = run_state(rig)
    events = rig.events()
    start = len(events) if events_from is None else events_from

    def seeded(crashing: bool) -> PartitionStore:
        store = PartitionStore(path, 0)
        ov = PartitionOverlay(store)
        for value in latest.values():
            if value is not None:
                rig.folder.seed_snapshot(ov, value)
        Folder.dump_all(ov)
        store.mark_seeded(start)
        if crashing:
            store.close()
            return seeded(False)
        ov.write(start - 1 if start > 0 else None)
        return store

    store = seeded(crash == "before-seed")
    mid = start + (len(events) - start) // 2 if crash == "after-chunk" else len(events)
    for chunk in (events[start:mid], events[mid:]):
        if not chunk:
            continue
        if store.closed:  # the crash after the first chunk's write: reopened
            store = PartitionStore(path, 0)
        ov = PartitionOverlay(store)
        for raw in chunk:
            rig.folder.fold_committed(ov, raw)
        Folder.dump_all(ov)
        ov.write(None)
        store.close()
    return PartitionStore(path, 0) if store.closed else store


def contents(store: PartitionStore) -> dict[str, Any]:
    """What must be equal between a live store and one restored from the run events: states,
    timers (id -> due), purge entries, purged ids and the runs-per-status counts."""
    out: dict[str, Any] = {"states": {}, "timers": {}, "purges": [], "purged": {}}
    it = store.db.iter()
    it.seek_to_first()
    while it.valid():
        key, value = it.key(), it.value()
        if key[:1] == b"s":
            out["states"][key[1:].decode()] = orjson.loads(value)
        elif key[:1] == b"t":
            body = orjson.loads(value)
            out["timers"][body["timer_id"]] = body["due_ms"]
        elif key[:1] == b"x":
            out["purges"].append((int.from_bytes(key[1:9], "big"), key[9:].decode()))
        elif key[:1] == b"g":
            out["purged"][key[1:].decode()] = value.decode()
        it.next()
    out["status_counts"] = {k: v for k, v in store.stats.items() if k.startswith("status.") and v}
    return out


def state(store: PartitionStore, run_id: str) -> dict[str, Any]:
    raw = store.state_bytes(run_id)
    assert raw is not None, f"no state of {run_id}"
    return orjson.loads(raw)  # type: ignore[no-any-return]
