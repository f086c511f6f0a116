"""The processor's per-transaction CPU cost without Kafka: fold → snapshots → store write.

Replays the input stream of `processor_bench.py`'s throughput phase (N StartRun of the
3-step workflow, then an instant executor's ActivationCompleted per activation) through
the runtime's own `Folder` and `PartitionOverlay` into a real RocksDB store, in
transactions of `--batch` records, exactly as the loop does between `consume` and
`commit_transaction` — but `produce` only collects the bytes. The stream is recorded in a
first pass (so the timed pass includes no receipt building) and replayed into a fresh
store. Reports input records per CPU-second and which engine ran (`RUNFOLD_ENGINE=interpreted`
to time the engine's sources, which a compiled build of them replaces by default:
processors/native_engine.py); `--profile` prints a cProfile summary.

    .venv/bin/python benchmarks/fold_bench.py [--runs 2000] [--batch 500] [--repeat 1] [--profile] [--digest]

`--digest` prints a sha256 over every output in produce order (topic, key, value, and the
partition/headers arguments) and over the store's final contents (every key/value pair):
the clock is fixed, so a change that keeps the outputs byte-identical keeps the digest.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from processors import native_engine
from processors.engine import Catalog, Ceilings, EngineContext
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore
from schemas import Codec
from topology.catalog import TopicNames

TS = 1_764_400_000_000
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
DEFINITION = {
    "schema": "runfold.workflow/v1",
    "id": "bench3",
    "revision": 1,
    "entry": ["a"],
    "nodes": {n: {"kind": "action", "action": n, "writes": {n: {"from": "output"}}} for n in "abc"},
    "routes": {"a": ["b"], "b": ["c"]},
    "state": {"a": None, "b": None, "c": None},
}


class Sink:
    def __init__(self, digest: bool = False) -> None:
        self.out: list[tuple[str, bytes, bytes | None]] = []
        # (partition, headers) per output, only for --digest: timed runs keep what they always kept
        self.extra: list[tuple[int | None, Any]] | None = [] if digest else None

    def produce(self, topic: str, value: bytes, key: bytes | None, **kw: Any) -> None:
        self.out.append((topic, value, key))  # no delivery reports offline
        if self.extra is not None:
            self.extra.append((kw.get("partition"), kw.get("headers")))


def _frame(h: Any, b: bytes | None) -> None:
    """Length-prefixed, so concatenations cannot collide (None differs from b"")."""
    if b is None:
        h.update(b"\xff" * 8)
    else:
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)


def digest(sink: Sink, store: PartitionStore) -> str:
    """sha256 over every output in order and the store's final key/value pairs."""
    h = hashlib.sha256()
    assert sink.extra is not None
    for (topic, value, key), (partition, headers) in zip(sink.out, sink.extra, strict=True):
        _frame(h, topic.encode())
        _frame(h, key)
        _frame(h, value)
        _frame(h, None if partition is None else str(partition).encode())
        _frame(h, None if headers is None else repr(headers).encode())
    h.update(b"--store--")
    it = store.db.iter()
    it.seek_to_first()
    while it.valid():
        _frame(h, it.key())
        _frame(h, it.value())
        it.next()
    return h.hexdigest()


def make_folder(codec: Codec, topics: TopicNames, sink: Sink) -> Folder:
    catalog = Catalog()
    catalog.register(DEFINITION)
    ctx = EngineContext(catalog=catalog, ceilings=Ceilings(), queues=frozenset({"default", "agents"}))
    return Folder(ctx, codec, topics, sink.produce, lambda e, m: None, lambda: TS)


def transaction(folder: Folder, store: PartitionStore, batch: list[tuple[str, bytes, bytes]]) -> None:
    ov = PartitionOverlay(store)
    counters = TxnCounters()
    for i, (topic, value, key) in enumerate(batch):
        folder.fold_input(ov, counters, topic, 0, i, key, value)
    folder.snapshots(ov, 0, counters)
    ov.write(None)


def record(
    runs: int, batch: int, codec: Codec, topics: TopicNames, root: Path
) -> list[tuple[str, bytes, bytes]]:
    """The input stream: starts, then receipts for the activations each wave produced."""
    enc_cmd, enc_rcp, dec_act = (
        codec.encoder("commands"),
        codec.encoder("receipts"),
        codec.decoder("activations"),
    )
    sink = Sink()
    folder = make_folder(codec, topics, sink)
    store = PartitionStore(root / "record", 0)
    wave = [
        (
            topics.commands,
            enc_cmd(
                {
                    "type": "StartRun",
                    "run_id": f"tp-{i}",
                    "ts_ms": TS,
                    "record_id": f"c{i}",
                    "definition_id": "bench3",
                    "revision": None,
                    "input": {},
                }
            ),
            f"tp-{i}".encode(),
        )
        for i in range(runs)
    ]
    stream: list[tuple[str, bytes, bytes]] = []
    act_topic = topics.activations("default")
    while wave:
        stream += wave
        sink.out.clear()
        for i in range(0, len(wave), batch):
            transaction(folder, store, wave[i : i + batch])
        wave = []
        for topic, value, key in sink.out:
            if topic != act_topic:
                continue
            a = dec_act(value)
            r = {
                "type": "ActivationCompleted",
                "run_id": a["run_id"],
                "ts_ms": TS + 1,
                "record_id": a["dispatch_id"],
                "node": a["node"],
                "lineage": a["lineage"],
                "attempt": a["attempt"],
                "dispatch_id": a["dispatch_id"],
                "worker_id": "bench",
                "output": {"ok": True},
                "usage": ZERO,
            }
            assert key is not None
            wave.append((topics.receipts, enc_rcp(r), key))
    store.close()
    return stream


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1, help="replays (fresh store each); reports the least CPU")
    ap.add_argument(
        "--tune-gc", action="store_true", help="the processor's GC settings (runfold processor does this)"
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="tottime")
    ap.add_argument(
        "--digest", action="store_true", help="sha256 of the outputs and final store (byte-identity check)"
    )
    args = ap.parse_args()
    codec = Codec.default()
    topics = TopicNames("bench")
    root = Path(tempfile.mkdtemp(prefix="runfold-foldbench-"))
    try:
        stream = record(args.runs, args.batch, codec, topics, root)
        if args.tune_gc:
            from processors.cli.processor import tune_gc

            tune_gc()
        prof = cProfile.Profile() if args.profile else None
        cpu = wall = float("inf")
        digests: set[str] = set()
        for n in range(args.repeat):  # each replay into a fresh store; the least CPU counts
            sink = Sink(args.digest)
            folder = make_folder(codec, topics, sink)
            store = PartitionStore(root / f"replay{n}", 0)
            w0, c0 = time.perf_counter(), time.process_time()
            if prof:
                prof.enable()
            # the same wave structure the recording had: replay in order, batch by batch
            for i in range(0, len(stream), args.batch):
                transaction(folder, store, stream[i : i + args.batch])
            if prof:
                prof.disable()
            wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
            succeeded = store.stats.get("status.succeeded", 0)
            if args.digest:
                digests.add(digest(sink, store))
            store.close()
        if prof:
            pstats.Stats(prof, stream=sys.stderr).sort_stats(args.sort).print_stats(35)
        print(
            orjson.dumps(
                {
                    "bench": "fold_offline",
                    "engine": native_engine.running(),  # compiled or interpreted (RUNFOLD_ENGINE)
                    "runs": args.runs,
                    "repeat": args.repeat,
                    "tune_gc": args.tune_gc,
                    "succeeded": succeeded,
                    "input_records": len(stream),
                    "outputs": len(sink.out),
                    "cpu_s": round(cpu, 3),
                    "wall_s": round(wall, 3),
                    "records_per_cpu_s": round(len(stream) / cpu),
                    "us_per_record_cpu": round(1e6 * cpu / len(stream), 1),
                    **(
                        {"digest": digests.pop() if len(digests) == 1 else sorted(digests)}
                        if args.digest
                        else {}
                    ),
                }
            ).decode()
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
