"""The runtime's fold into a real RocksDB store, without Kafka: `Folder` + `PartitionOverlay` +
`PartitionStore`, a transaction at a time, outputs collected (tests of the processor's store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processors.engine import Catalog, EngineContext
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore
from schemas import Codec
from topology.catalog import TopicNames

TS = 1_764_400_000_000
RETENTION = 60_000
CODEC = Codec.default()
TOPICS = TopicNames("t")
ONE = {"schema": "runfold.workflow/v1", "id": "one", "revision": 1, "entry": ["a"], "state": {"a": None},
       "nodes": {"a": {"kind": "action", "action": "a", "writes": {"a": {"from": "output"}}}},
       "budgets": {"wall_time_ms": 3_600_000}}  # fmt: skip


class Rig:
    def __init__(self, path: Path) -> None:
        catalog = Catalog()
        catalog.register(ONE)
        self.out: list[tuple[str, bytes]] = []
        self.folder = Folder(EngineContext(catalog=catalog), CODEC, TOPICS,
                             lambda topic, value, key, **kw: self.out.append((topic, value)),
                             lambda err, msg: None, lambda: TS, RETENTION)  # fmt: skip
        self.store = PartitionStore(path, 0)

    def transaction(self, *inputs: tuple[str, dict[str, Any]]) -> None:
        ov, counters = PartitionOverlay(self.store), TxnCounters()
        for i, (kind, msg) in enumerate(inputs):
            topic = TOPICS.commands if kind == "commands" else TOPICS.receipts
            self.folder.fold_input(ov, counters, topic, 0, i, msg["run_id"].encode(), CODEC.encode(kind, msg))
        self.folder.snapshots(ov, 0, counters)
        ov.write(None)

    def activation(self, run_id: str) -> dict[str, Any]:
        """The run's latest activation."""
        acts = [CODEC.decode("activations", v) for t, v in self.out if t == TOPICS.activations("default")]
        return [a for a in acts if a["run_id"] == run_id][-1]

    def events(self) -> list[bytes]:
        return [v for t, v in self.out if t == TOPICS.run_events]


def start(run_id: str) -> tuple[str, dict[str, Any]]:
    return "commands", {"type": "StartRun", "run_id": run_id, "ts_ms": TS, "record_id": f"c-{run_id}",
                        "definition_id": "one", "revision": None, "input": {}}  # fmt: skip


def completed(act: dict[str, Any], ts: int) -> tuple[str, dict[str, Any]]:
    return "receipts", {"type": "ActivationCompleted", "run_id": act["run_id"], "ts_ms": ts,
                        "record_id": f"r-{act['dispatch_id']}", "node": act["node"], "lineage": act["lineage"],
                        "attempt": act["attempt"], "dispatch_id": act["dispatch_id"], "worker_id": "w",
                        "output": {"ok": 1}, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}}  # fmt: skip


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
        out.append(it.key()[len(prefix):].decode())
        it.next()
    return out
