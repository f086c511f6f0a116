"""What each Kafka compression codec would cost on runfold's output topics (docs/contract.md,
"Compression"): the outputs of benchmarks/fold_bench.py's 2,000 three-step runs (real run
events, snapshots, activations), compressed in batches of 200 records as a producer batch is,
with cramjam's LZ4 (frame), snappy and zstd (level 3) and zlib's gzip (level 6).

    .venv/bin/python -m scripts.compression_cost [--runs 2000] [--batch 200]   (from the checkout)

Prints, per topic: records, bytes per record, and per codec the compression ratio and the CPU
microseconds per record. Not librdkafka's own codec calls: an estimate of the relative cost.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
import time
from pathlib import Path

import cramjam

import benchmarks.fold_bench as fb
from processors.runtime.store import PartitionStore
from schemas import Codec
from topology.catalog import TopicNames

CODECS = {
    "lz4": lambda b: bytes(cramjam.lz4.compress(b)),
    "gzip": lambda b: gzip.compress(b, 6),
    "snappy": lambda b: bytes(cramjam.snappy.compress_raw(b)),
    "zstd": lambda b: bytes(cramjam.zstd.compress(b, 3)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=200)
    args = ap.parse_args()
    codec, topics = Codec.default(), TopicNames("bench")
    root = Path(tempfile.mkdtemp(prefix="runfold-compression-"))
    try:
        stream = fb.record(args.runs, 500, codec, topics, root)
        sink = fb.Sink()
        folder = fb.make_folder(codec, topics, sink)
        store = PartitionStore(root / "replay", 0)
        for i in range(0, len(stream), 500):
            fb.transaction(folder, store, stream[i : i + 500])
        store.close()
        by_topic: dict[str, list[bytes]] = {}
        for topic, value, _ in sink.out:
            by_topic.setdefault(topic, []).append(value)
        for topic in (topics.run_events, topics.run_state, topics.activations("default")):
            recs = by_topic[topic]
            raw = sum(len(r) for r in recs)
            batches = [b"".join(recs[i : i + args.batch]) for i in range(0, len(recs), args.batch)]
            print(f"{topic}: {len(recs)} records, {raw / len(recs):.0f} bytes each")
            for name, compress in CODECS.items():
                t0 = time.process_time()
                out = sum(len(compress(b)) for b in batches)
                cpu = time.process_time() - t0
                print(f"  {name:6s} ratio {raw / out:5.2f}  {1e6 * cpu / len(recs):6.2f} us/record")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
