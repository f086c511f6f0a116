"""Finished-run purge rate without Kafka: N finished 3-step runs, all past their retention,
purged a page (`store.PURGE_PAGE`) per transaction as the processor's housekeeping does
(`due_purges`, the page's record, then the overlay's commit-time write). Reports runs purged
per second and the slowest page: while a backlog drains, each page holds up the loop.

    .venv/bin/python -m benchmarks.purge_bench [--runs 20000] [--page 1000]   (from the checkout)

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import orjson

from benchmarks.fold_bench import TS, Sink, make_folder, record, transaction
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PURGE_PAGE, PartitionStore
from schemas import Codec
from topology.catalog import TopicNames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument(
        "--page",
        type=int,
        default=PURGE_PAGE,
        help="runs a page (the loop's idle passes take 1,000 a partition; after a transaction that folded input, 100 plus its inputs)",
    )
    args = ap.parse_args()
    codec, topics = Codec.default(), TopicNames("bench")
    root = Path(tempfile.mkdtemp(prefix="runfold-purge-bench-"))
    try:
        stream = record(args.runs, 500, codec, topics, root)
        folder = make_folder(codec, topics, Sink())
        folder.finished_retention_ms = 1_000
        store = PartitionStore(root / "store", 0)
        for i in range(0, len(stream), 500):
            transaction(folder, store, stream[i : i + 500])
        pages: list[float] = []
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            due = store.due_purges(TS + 10_000_000, args.page)
            if not due:
                break
            store.mark_purging(due)  # the page's record, before its transaction (housekeeping.py)
            ov = PartitionOverlay(store)
            for xkey, run_id, status in due:
                ov.purge(xkey, run_id, status)
            ov.write(None)
            pages.append(time.perf_counter() - t0)
        seconds = time.perf_counter() - started
        left = store.stats.get("status.succeeded", 0)
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        orjson.dumps(
            {
                "bench": "purge",
                "runs": args.runs,
                "page": args.page,
                "pages": len(pages),
                "left": left,
                "seconds": round(seconds, 3),
                "runs_per_s": round(args.runs / seconds),
                "page_ms_median": round(sorted(pages)[len(pages) // 2] * 1000, 1),
                "page_ms_max": round(max(pages) * 1000, 1),
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
