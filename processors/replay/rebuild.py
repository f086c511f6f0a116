"""`replay --rebuild`: restore a processor's stores from `<p>.run-events` (disaster recovery).

It writes exactly what the processor's own restore path writes — the same
`PartitionStore` layout, filled through the runtime's `Folder.fold_committed`
(state, event log, timers) and `PartitionOverlay.write` (with the applied offset) —
so a processor started on the rebuilt directory only catches up on events newer
than the rebuild. Stop the processor that owns the directory first (RocksDB
allows one writer; the rebuild refuses an existing store unless told to replace it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING

from processors.client.reader import PartitionReader
from processors.engine import Catalog, EngineContext, EventBeforeStart
from processors.kafka.records import coordinates
from processors.runtime.fold import Folder
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import LOST_STATUS, PartitionStore
from schemas import Codec, DecodeError
from schemas.run_state import purged_status

Progress = Callable[[int, int], None]
_CHUNK = 2_000


class RebuildError(RuntimeError):
    """The rebuild cannot proceed (an existing store, a store in use)."""


@dataclass
class RebuildReport:
    store_root: str
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)  # p -> {events, runs, applied_offset}
    events: int = 0
    undecodable: int = 0
    # runs whose RunAccepted the log no longer holds (run-events retention): not rebuilt
    runs_before_log_start: set[str] = field(default_factory=set)
    ids_kept: int = 0  # run ids the log no longer holds, kept taken from run-state (purged markers)
    seconds: float = 0.0

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "store_root": self.store_root,
            "events": self.events,
            "undecodable": self.undecodable,
            "runs_before_log_start": sorted(self.runs_before_log_start),
            "ids_kept": self.ids_kept,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.events_per_s, 1),
            "partitions": {str(p): v for p, v in sorted(self.partitions.items())},
        }


def _noop(*_: Any, **__: Any) -> None:
    return None


def rebuild(
    settings: ProcessorSettings,
    *,
    replace: bool = False,
    partitions: list[int] | None = None,
    codec: Codec | None = None,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild the stores under `settings.store_root()` (one per run-events partition)."""
    codec = codec or Codec.default()
    topics = settings.topics
    root = settings.store_root()
    folder = Folder(
        EngineContext(catalog=Catalog()),
        codec,
        topics,
        _noop,
        _noop,
        lambda: 0,
        settings.finished_retention_ms,
    )  # the same purge times the processor's restore sets
    report = RebuildReport(store_root=str(root))
    started = time.monotonic()
    reader = PartitionReader(settings, timeout_s=30.0)
    try:
        count = reader.partition_count(topics.run_events)
        wanted = sorted(partitions) if partitions is not None else list(range(count))
        for p in wanted:
            path = root / f"p{p}"
            if path.exists() and any(path.iterdir()):
                if not replace:
                    raise RebuildError(
                        f"{path} already holds a store; pass --replace to rebuild it "
                        "(stop the processor that uses it first)"
                    )
                PartitionStore.destroy(path)
        total = sum(reader.end_offset(topics.run_events, p) for p in wanted)
        _rebuild_partitions(reader, folder, root, wanted, topics.run_events, report, progress, total)
        _keep_ids(reader, codec, root, wanted, topics.run_state, report)
    finally:
        reader.close()
    report.seconds = time.monotonic() - started
    return report


def _keep_ids(
    reader: PartitionReader, codec: Codec, root: Path, wanted: list[int], topic: str, report: RebuildReport
) -> None:
    """Every run id `<p>.run-state` holds (a snapshot or a purged run's marker) that the rebuilt
    store does not know (its events gone with retention, or purged) stays taken: a purged-run
    marker in the store (its final status; `lost` for a run whose snapshot is all that is
    left), so a processor on this store rejects a new StartRun of it `Conflict`."""
    decode = codec.decoder("run_state")
    latest: dict[int, dict[bytes, bytes | None]] = {p: {} for p in wanted}
    for msg in reader.read({(topic, p): OFFSET_BEGINNING for p in wanted}):
        key = msg.key() if msg is not None else None
        if msg is None or key is None:
            continue
        latest[coordinates(msg)[1]][key] = msg.value()
    for p in wanted:
        store = PartitionStore(root / f"p{p}", p)
        try:
            ov = PartitionOverlay(store)
            for key, value in latest[p].items():
                if value is None:
                    continue  # a tombstone (a purge before markers): the id is forgotten
                run_id = key.decode()
                if store.state_bytes(run_id) is not None or store.purged_status(run_id) is not None:
                    continue
                try:
                    snap = decode(value)
                except DecodeError:
                    report.undecodable += 1
                    continue
                ov.marked[run_id] = purged_status(snap) or LOST_STATUS.decode()
            report.ids_kept += len(ov.marked)
            if ov.marked:
                ov.write(None)
        finally:
            store.close()


class _Target:
    """One partition's store being rebuilt and its open chunk."""

    def __init__(self, path: Path, partition: int) -> None:
        try:
            self.store = PartitionStore(path, partition)
        except Exception as e:  # rocksdict raises a bare Exception when another process holds the lock
            raise RebuildError(f"cannot open the store at {path}: {e}") from None
        self.overlay = PartitionOverlay(self.store)
        self.runs: set[str] = set()
        self.records = self.events = self.pending = 0
        self.last_offset: int | None = None

    def flush(self) -> None:
        self.runs.update(self.overlay.states)
        Folder.dump_all(self.overlay)
        self.overlay.write(self.last_offset)
        self.overlay = PartitionOverlay(self.store)
        self.pending = 0


def _rebuild_partitions(
    reader: PartitionReader,
    folder: Folder,
    root: Path,
    wanted: list[int],
    topic: str,
    report: RebuildReport,
    progress: Progress | None,
    total: int,
) -> None:
    """One pass over every wanted partition at once (their fetches overlap), a chunked write per
    partition every _CHUNK records, so memory stays bounded."""
    targets: dict[int, _Target] = {}
    try:
        for p in wanted:
            targets[p] = _Target(root / f"p{p}", p)
        done = 0
        for msg in reader.read({(topic, p): OFFSET_BEGINNING for p in wanted}):
            if msg is None:
                continue
            t = targets[coordinates(msg)[1]]
            t.records += 1
            done += 1
            try:
                folder.fold_committed(t.overlay, msg.value())
                t.events += 1
            except DecodeError:
                report.undecodable += 1
            except EventBeforeStart as e:  # as the processor's restore does (assignment.py)
                report.runs_before_log_start.add(e.run_id)
                t.overlay.lost.add(e.run_id)
            t.last_offset = msg.offset()
            t.pending += 1
            if t.pending >= _CHUNK:
                t.flush()
                if progress is not None:
                    progress(done, max(total, done))
        for p, t in targets.items():
            t.flush()
            report.events += t.events
            report.partitions[p] = {
                "events": t.events,
                "records": t.records,
                "runs": len(t.runs),
                "applied_offset": t.store.applied_offset,
            }
        if progress is not None:
            progress(done, max(total, done))
    finally:
        for t in targets.values():
            t.store.close()
