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
from processors.engine import Catalog, EngineContext
from processors.runtime.fold import Folder
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import PartitionStore
from schemas import Codec, DecodeError

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
    seconds: float = 0.0

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "store_root": self.store_root, "events": self.events, "undecodable": self.undecodable,
                "seconds": round(self.seconds, 3), "events_per_s": round(self.events_per_s, 1),
                "partitions": {str(p): v for p, v in sorted(self.partitions.items())}}


def _noop(*_: Any, **__: Any) -> None:
    return None


def rebuild(settings: ProcessorSettings, *, replace: bool = False, partitions: list[int] | None = None,
            codec: Codec | None = None, progress: Progress | None = None) -> RebuildReport:
    """Rebuild the stores under `settings.store_root()` (one per run-events partition)."""
    codec = codec or Codec.default()
    topics = settings.topics
    root = settings.store_root()
    folder = Folder(EngineContext(catalog=Catalog()), codec, topics, _noop, _noop, lambda: 0)
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
                    raise RebuildError(f"{path} already holds a store; pass --replace to rebuild it "
                                       "(stop the processor that uses it first)")
                PartitionStore.destroy(path)
        total = sum(reader.end_offset(topics.run_events, p) for p in wanted)
        done = 0
        for p in wanted:
            stats = _rebuild_partition(reader, folder, root / f"p{p}", p, topics.run_events, report,
                                       lambda n, base=done: progress(base + n, total) if progress else None)
            report.partitions[p] = stats
            done += stats["records"]
            if progress is not None:
                progress(done, max(total, done))
    finally:
        reader.close()
    report.seconds = time.monotonic() - started
    return report


def _rebuild_partition(reader: PartitionReader, folder: Folder, path: Path, p: int, topic: str,
                       report: RebuildReport, progress: Callable[[int], None]) -> dict[str, int]:
    try:
        store = PartitionStore(path, p)
    except Exception as e:  # rocksdict raises a bare Exception when another process holds the lock
        raise RebuildError(f"cannot open the store at {path}: {e}") from None
    runs: set[str] = set()
    records = events = 0
    try:
        overlay = PartitionOverlay(store)
        last_offset: int | None = None
        for msg in reader.read({(topic, p): OFFSET_BEGINNING}):
            if msg is None:
                continue
            records += 1
            try:
                folder.fold_committed(overlay, msg.value())
                events += 1
            except DecodeError:
                report.undecodable += 1
            last_offset = msg.offset()
            if records % _CHUNK == 0:
                runs.update(overlay.states)
                Folder.dump_all(overlay)
                overlay.write(last_offset)
                overlay = PartitionOverlay(store)
                progress(records)
        runs.update(overlay.states)
        Folder.dump_all(overlay)
        overlay.write(last_offset)
        applied = store.applied_offset
    finally:
        store.close()
    report.events += events
    return {"events": events, "records": records, "runs": len(runs), "applied_offset": applied}
