"""How long the processor's commit (PartitionStore.write) waits while run queries read a long
event log through the query endpoint: the store's lock is what both take.

A store with `--events` run events of `--blob` bytes each (one run), a QueryServer on it, two
clients reading the whole log again and again (every page), and the test thread writing one
small batch every 5 ms for `--seconds`: the write latencies' median, p99 and max. No broker.

    .venv/bin/python benchmarks/query_commit_stall.py --events 200 --blob 100000 --seconds 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import orjson
from rocksdict import WriteBatch

from processors.runtime.query import QueryServer
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import ChangeSet, PartitionStore, event_key, state_key
from schemas import Codec

RUN = "run-1"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--blob", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    codec = Codec.default()
    store = PartitionStore(Path(tempfile.mkdtemp()) / "p0", 0)
    batch = WriteBatch(raw_mode=True)
    for seq in range(1, args.events + 1):
        event = {
            "type": "RunAccepted",
            "run_id": RUN,
            "ts_ms": seq,
            "record_id": f"e{seq}",
            "sequence": seq,
            "definition_id": "wf",
            "revision": 1,
            "bundle_hash": "h",
            "bundle": {},
            "input": {"blob": "y" * args.blob},
            "parent": None,
            "budgets": {},
            "labels": {},
        }
        batch.put(event_key(RUN, seq), codec.encode("run_events", event))
    batch.put(
        state_key(RUN),
        orjson.dumps({"run_id": RUN, "status": "succeeded", "sequence": args.events, "waits": {}}),
    )
    store.apply(ChangeSet(batch), None)

    class Partitions:
        restoring: set[int] = set()

        def store(self, partition: int) -> PartitionStore:
            return store

        def owned(self) -> list[int]:
            return [0]

    ready = threading.Event()
    ready.set()
    processor = SimpleNamespace(
        codec=codec,
        partitions=Partitions(),
        partition_count=1,
        watchdog=None,
        ready=ready,
        settings=ProcessorSettings(http_host="127.0.0.1"),
    )
    server = QueryServer(processor, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/runs/{RUN}/events"
    stop = threading.Event()

    def read_all() -> None:
        while not stop.is_set():
            since: int | None = 0
            while since is not None and not stop.is_set():
                since = (
                    httpx.get(url, params={"since": since, "limit": 1000}, timeout=60)
                    .json()
                    .get("next_since")
                )

    readers = [threading.Thread(target=read_all) for _ in range(2)]
    for reader in readers:
        reader.start()
    waits: list[float] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        small = WriteBatch(raw_mode=True)
        small.put(b"z%d" % len(waits), b"v")
        started = time.perf_counter()
        store.apply(ChangeSet(small), None)
        waits.append(time.perf_counter() - started)
        time.sleep(0.005)
    stop.set()
    for reader in readers:
        reader.join()
    server.close()
    store.close()
    waits.sort()
    print(
        f"{len(waits)} writes: median {statistics.median(waits) * 1000:.2f} ms, "
        f"p99 {waits[int(len(waits) * 0.99)] * 1000:.1f} ms, max {waits[-1] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
