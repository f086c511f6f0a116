"""Memory of decoded run states, as the processor's state cache holds them, without Kafka.

N 3-step runs are started (each waits for its first activation) into a real store; every
state is then read back from RocksDB twice: with `load_state` (the bundle becomes the pin's
one shared object) and with a plain JSON parse (each state its own bundle copy: what a
restored or re-read state held before 2026-11-30). tracemalloc gives the bytes per state.

    .venv/bin/python -m benchmarks.state_memory [--runs 10000]   (from the checkout)

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.fold_bench import TS, Sink, make_folder, transaction
from processors.engine import load_state
from processors.runtime.store import PartitionStore, state_key
from schemas import Codec
from topology.catalog import TopicNames


def bytes_per_state(raws: list[bytes], load: Callable[[bytes], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    states = [load(raw) for raw in raws]
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del states
    return round(used / len(raws))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10_000)
    args = ap.parse_args()
    codec, topics = Codec.default(), TopicNames("bench")
    enc = codec.encoder("commands")
    root = Path(tempfile.mkdtemp(prefix="runfold-state-memory-"))
    try:
        folder = make_folder(codec, topics, Sink())
        store = PartitionStore(root / "store", 0)
        starts = [
            (
                topics.commands,
                enc(
                    {
                        "type": "StartRun",
                        "run_id": f"m-{i}",
                        "ts_ms": TS,
                        "record_id": f"c{i}",
                        "definition_id": "bench3",
                        "revision": None,
                        "input": {},
                    }
                ),
                f"m-{i}".encode(),
            )
            for i in range(args.runs)
        ]
        for i in range(0, len(starts), 500):
            transaction(folder, store, starts[i : i + 500])
        raws = [store.get(state_key(f"m-{i}")) for i in range(args.runs)]
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    present = [raw for raw in raws if raw is not None]
    assert len(present) == args.runs, "every run's state is in the store"
    load_state(present[0])  # the pin is cached by the fold already; this is not what is measured
    shared, copied = bytes_per_state(present, load_state), bytes_per_state(present, orjson.loads)
    print(
        orjson.dumps(
            {
                "bench": "state_memory",
                "runs": args.runs,
                "state_json_bytes": len(present[0]),
                "bytes_per_state_shared_bundle": shared,
                "bytes_per_state_own_bundle": copied,
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
