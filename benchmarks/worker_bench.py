"""Action-worker throughput: no-op activations through the broker, end to end.

Pre-produces N `noop` activations on `<prefix>.activations.default`, starts ONE worker process
(`python -m processors.cli.worker worker`), and reads `<prefix>.receipts` until every
activation has its ActivationAccepted + ActivationCompleted (2 receipts each). Reports
activations/s from the first receipt to the last (steady state) and including worker startup.

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 .venv/bin/python benchmarks/worker_bench.py --n 20000

Results go to benchmarks/results/worker_bench.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer

from processors.engine.ids import dispatch_id
from schemas import Codec
from topology.admin import create_topology, delete_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, consumer_config, producer_config

ROOT = Path(__file__).resolve().parent.parent


def preproduce(settings: KafkaSettings, n: int) -> float:
    codec = Codec.default()
    topic = TopicNames(settings.topic_prefix).activations("default")
    producer = Producer(producer_config(settings, linger_ms=20))
    now = int(time.time() * 1000)
    start = time.perf_counter()
    for i in range(n):
        run = f"bench-{i}"
        msg = {
            "type": "ActionActivation",
            "run_id": run,
            "ts_ms": now,
            "record_id": f"a{i}",
            "node": "n",
            "lineage": "",
            "attempt": 1,
            "dispatch_id": dispatch_id(run, "n", "", 1),
            "definition_id": "bench",
            "root_run_id": run,
            "kind": "action",
            "action": "noop",
            "queue": "default",
            "input": {},
            "deadline_ms": None,
            "lease_ms": 30_000,
            "heartbeat_ms": 10_000,
            "capabilities": [],
        }
        while True:
            try:
                producer.produce(topic, codec.encode("activations", msg), key=run.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        topic_prefix=f"bench{uuid.uuid4().hex[:6]}",
        partitions=args.partitions,
        activation_queues=("default",),
    )
    create_topology(settings)
    worker = None
    try:
        produce_s = preproduce(settings, args.n)
        reader = Consumer(
            consumer_config(settings, f"bench-reader-{uuid.uuid4().hex[:6]}", fetch_wait_max_ms=10)
        )
        reader.subscribe([TopicNames(settings.topic_prefix).receipts])
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        }
        launched = time.perf_counter()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "processors.cli.worker",
                "worker",
                "--queue",
                "default",
                "--concurrency",
                str(args.concurrency),
                "--log-level",
                "WARNING",
            ],
            env=env,
            cwd=ROOT,
        )
        want, seen, first, last, sample = 2 * args.n, 0, None, None, None
        deadline = time.perf_counter() + args.timeout
        while seen < want and time.perf_counter() < deadline:
            msgs = reader.consume(num_messages=1000, timeout=0.2)
            if msgs:
                now = time.perf_counter()
                first = first or now
                last = now
                seen += sum(1 for m in msgs if m.error() is None)
                sample = msgs[-1].value()
        reader.close()
        kinds = Codec.default().decode("receipts", sample)["type"] if sample else None
        steady = (args.n / (last - first)) if first and last and last > first else 0.0
        result = {
            "benchmark": "worker_noop_end_to_end",
            "activations": args.n,
            "receipts_seen": seen,
            "partitions": args.partitions,
            "concurrency": args.concurrency,
            "cpus": os.cpu_count(),
            "preproduce_s": round(produce_s, 3),
            "first_to_last_receipt_s": round((last or 0) - (first or 0), 3),
            "activations_per_s_steady": round(steady, 1),
            "activations_per_s_with_startup": round(args.n / ((last or launched) - launched), 1),
            "receipts_per_s_steady": round(2 * steady, 1),
            "last_receipt_type": kinds,
        }
        print(json.dumps(result, indent=2))
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "worker_bench.json").write_text(json.dumps(result, indent=2))
        if seen < want:
            sys.exit(f"only {seen} of {want} receipts within {args.timeout}s")
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        delete_topology(settings)


if __name__ == "__main__":
    main()
