"""Finished runs leave the processor's local store after `finished_retention_ms` (no broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processors.engine import Catalog, EngineContext
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, timer_ref_key
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
        acts = [CODEC.decode("activations", v) for t, v in self.out if t == TOPICS.activations("default")]
        return next(a for a in acts if a["run_id"] == run_id)

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


def test_a_finished_run_is_purged_after_its_retention_and_a_running_one_is_not(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("done"), start("busy"))
    finished_at = TS + 500
    rig.transaction(completed(rig.activation("done"), finished_at))
    store = rig.store
    assert store.stats["status.succeeded"] == 1 and store.stats["status.running"] == 1
    assert store.state_bytes("done") is not None and len(store.events("done")) >= 4
    assert store.next_purge_ms == finished_at + RETENTION
    assert purge(store, finished_at + RETENTION - 1) == 0  # not yet
    assert store.state_bytes("done") is not None
    assert purge(store, finished_at + RETENTION) == 1
    assert store.state_bytes("done") is None and store.events("done") == []
    assert store.stats["status.succeeded"] == 0 and store.stats["status.running"] == 1
    assert store.next_purge_ms is None and purge(store, finished_at + 10 * RETENTION) == 0
    # the running run, its events and its wall-time timer are untouched
    assert store.state_bytes("busy") is not None and len(store.events("busy")) >= 3
    assert store.get(timer_ref_key("busy", next(iter(_timer_ids(store, "busy"))))) is not None
    # its id is not reused: a late duplicate StartRun is rejected, not started afresh
    before = len(rig.events())
    rig.transaction(start("done"))
    [rejected] = [CODEC.decode("run_events", raw) for raw in rig.events()[before:]]
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Conflict"
    assert "already ran (succeeded) and was purged" in rejected["reason"] and store.state_bytes("done") is None
    # the purged counts survive a reopen
    store.close()
    again = PartitionStore(tmp_path / "live", 0)
    assert again.stats["status.succeeded"] == 0 and again.state_bytes("done") is None
    again.close()


def test_restore_from_the_events_sets_the_same_purge_time(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("done"))
    rig.transaction(completed(rig.activation("done"), TS + 500))
    restored = PartitionStore(tmp_path / "restored", 0)
    ov = PartitionOverlay(restored)
    for raw in rig.events():
        rig.folder.fold_committed(ov, raw)
    Folder.dump_all(ov)
    ov.write(None)
    assert restored.next_purge_ms == rig.store.next_purge_ms == TS + 500 + RETENTION
    assert purge(restored, TS + 500 + RETENTION) == 1 and restored.state_bytes("done") is None
    restored.close()
    rig.store.close()


def purge(store: PartitionStore, now_ms: int) -> int:
    """What the loop does: the due runs go through a (committed) transaction's overlay."""
    due = store.due_purges(now_ms)
    ov = PartitionOverlay(store)
    for xkey, run_id, status in due:
        ov.purge(xkey, run_id, status)
    ov.write(None)
    return len(due)


def _timer_ids(store: PartitionStore, run_id: str) -> list[str]:
    it = store.db.iter()
    prefix = b"r" + run_id.encode() + b"\x1f"
    it.seek(prefix)
    out = []
    while it.valid() and it.key().startswith(prefix):
        out.append(it.key()[len(prefix):].decode())
        it.next()
    return out
