"""What forwarding a misrouted command costs (docs/contract.md, "Partitioning"): StartRun ->
RunAccepted latency, one run at a time, from a murmur2 producer (lands on its owner) and from a
CRC32 producer (librdkafka's default; every run id chosen so that it lands elsewhere and is
forwarded). A processor runs in this process on fresh topics of 2 partitions.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/python scripts/forward_latency.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
from processor_support import CODEC, Reader, make_settings, running, setup_topology

from processors.kafka.partitioning import partition_for
from topology.admin import delete_topology
from topology.settings import producer_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="runs per partitioner")
    args = ap.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    s = make_settings(
        bootstrap, f"lat{uuid.uuid4().hex[:6]}", Path(tempfile.mkdtemp()) / "state", partitions=2
    )
    setup_topology(s)
    try:
        events = Reader(s, [s.topics.run_events], "run_events")
        crc_cfg = producer_config(s, linger_ms=0)
        del crc_cfg["partitioner"]  # librdkafka's default: consistent_random (CRC32)
        producers = {
            "murmur2": Producer(producer_config(s, linger_ms=0)),
            "crc32_forwarded": Producer(crc_cfg),
        }
        took: dict[str, list[float]] = {name: [] for name in producers}
        with running(s):
            for producer in producers.values():  # warm: producer ids, metadata, the processor's first txn
                producer.produce(
                    s.topics.commands,
                    CODEC.encode(
                        "commands",
                        {
                            "type": "CancelRun",
                            "run_id": "warm",
                            "ts_ms": time.time_ns() // 1_000_000,
                            "record_id": "w",
                        },
                    ),
                    b"warm",
                )
                producer.flush(10)
            time.sleep(1)
            events.drain(0.3)
            for i in range(2 * args.runs):
                name = "murmur2" if i % 2 == 0 else "crc32_forwarded"
                while zlib.crc32((run_id := f"l-{uuid.uuid4().hex[:8]}").encode()) % 2 == partition_for(
                    run_id, 2
                ):
                    pass  # a run id CRC32 puts on the other partition
                t0 = time.perf_counter()
                producers[name].produce(
                    s.topics.commands,
                    CODEC.encode(
                        "commands",
                        {
                            "type": "StartRun",
                            "run_id": run_id,
                            "ts_ms": time.time_ns() // 1_000_000,
                            "record_id": "x",
                            "definition_id": "one",
                            "input": {},
                        },
                    ),
                    run_id.encode(),
                )
                producers[name].flush(10)
                while not any(
                    e["run_id"] == run_id and e["type"] == "RunAccepted" for e in events.poll(0.005)
                ):
                    pass
                took[name].append((time.perf_counter() - t0) * 1000)
        for name, ms in took.items():
            ms.sort()
            print(
                f"{name}: n={len(ms)} median {statistics.median(ms):.1f} ms, p90 {ms[int(len(ms) * 0.9)]:.1f} ms"
            )
        events.close()
    finally:
        delete_topology(s)


if __name__ == "__main__":
    main()
