"""runfold's runtime as a keyed fold: the processor's own loop and stores, a different fold.

`KeyedFoldProcessor` IS `processors.runtime.loop.Processor` (read_committed consume,
write overlay, one transaction per batch with `send_offsets_to_transaction`, RocksDB
write batch after the commit, restore from the output log on assignment). Only the
per-record fold is swapped: `KeyedFolder` has the four methods the loop, the commit and
the restore call on `processors.runtime.fold.Folder` (`fold_input`, `snapshots`,
`fold_committed`, `dump_all`). Per key it keeps `{"count", "sum"}` and emits the new
aggregate to `<p>.run-events` (the fold's changelog *and* output, as for runs: restore
folds it back), so there is no separate changelog topic.

Input: `<p>.commands`, key = the fold key, value = JSON `{"k": key, "v": int}`.
Run as a peer process by benchmarks/keyed_fold.py:

    python -m benchmarks.peers.runfold_fold --prefix P --state-dir D --first-file F
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from processors.runtime.fold import TxnCounters
from processors.runtime.loop import Processor
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.settings import ProcessorSettings
from topology.catalog import TopicNames


class KeyedFolder:
    """Per key: count and sum. Same interface as the runtime's `Folder`."""

    def __init__(
        self, topics: TopicNames, produce: Any, on_event_delivery: Any, first_file: Path | None
    ) -> None:
        self.out = topics.run_events
        self._produce = produce
        self._on_delivery = on_event_delivery
        self._first_file = first_file
        self._loads = orjson.loads

    def fold_input(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int = 0,
        headers: Any = None,
    ) -> None:
        if self._first_file is not None:
            self._first_file.write_text(repr(time.time()))
            self._first_file = None
        counters.records_in[topic] = counters.records_in.get(topic, 0) + 1
        if key is None or value is None:
            return
        k = key.decode()
        v = self._loads(value)["v"]
        agg = overlay.state(k, self._loads)
        agg = {"count": 1, "sum": v} if agg is None else {"count": agg["count"] + 1, "sum": agg["sum"] + v}
        overlay.states[k] = agg
        self._produce(
            self.out, orjson.dumps({"key": k, **agg}), key, partition=partition, on_delivery=self._on_delivery
        )

    def snapshots(self, overlay: PartitionOverlay, partition: int, counters: TxnCounters) -> None:
        """Commit time: serialise the touched aggregates for the RocksDB write batch (no
        snapshot topic: the output log is the changelog)."""
        dumps = orjson.dumps
        for k, agg in overlay.states.items():
            if agg is not None:
                overlay.dumped[k] = dumps(agg)

    def fold_committed(self, overlay: PartitionOverlay, value: bytes) -> None:
        """Restore: the last emitted aggregate of a key is its state."""
        rec = self._loads(value)
        overlay.states[rec["key"]] = {"count": rec["count"], "sum": rec["sum"]}

    @staticmethod
    def dump_all(overlay: PartitionOverlay) -> None:
        for k, agg in overlay.states.items():
            if agg is not None:
                overlay.dumped[k] = orjson.dumps(agg)


class KeyedFoldProcessor(Processor):
    def __init__(self, settings: ProcessorSettings, stop: threading.Event, first_file: Path | None) -> None:
        super().__init__(settings, stop=stop)
        self.folder = KeyedFolder(self.topics, self.txn.produce, self.txn.on_event_delivery, first_file)  # type: ignore[assignment]
        self.txn.attach(self.folder.snapshots, self.failures, self.housekeeping.refresh_statuses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--first-file", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--commit-interval-ms", type=int, default=None)
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    kw: dict[str, Any] = {
        "topic_prefix": args.prefix,
        "state_dir": Path(args.state_dir),
        "instance_id": "fold",
        "log_level": "WARNING",
    }
    if args.batch_size:
        kw["batch_size"] = args.batch_size
    if args.commit_interval_ms:
        kw["commit_interval_ms"] = args.commit_interval_ms
    settings = ProcessorSettings(**kw)
    from processors.runtime import logs

    logs.configure(settings.log_level)
    first = Path(args.first_file) if args.first_file else None
    raise SystemExit(KeyedFoldProcessor(settings, stop, first).run())


if __name__ == "__main__":
    main()
