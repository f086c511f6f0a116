"""What one Kafka transaction costs the broker's CPU, without runfold (real broker).

At 25 % of runfold's max a one-step run is two small transactions of the processor, and a
2-core host's broker then spends more CPU than the processor does (`runfold bench peers`:
broker 0.6-0.8 of a core at ~190 runs/s, 0.2-0.25 at the 850 runs/s max, where transactions
are 500 inputs each). This benchmark isolates Kafka's part: a raw confluent-kafka producer with
the processor's transactional settings (`ProcessorSettings.producer_config`) commits tiny
transactions at fixed rates, one after the other, nothing reading them, and the broker's CPU
(user + system, from /proc) is divided by the transactions committed, after subtracting what
the broker used while idle just before.

Shapes:
    one-partition   3 small records to one partition, no offsets: the cheapest transaction.
    processor       what a one-input transaction of the processor writes: 3 run events
                    (181 B each), 1 activation (132 B) and 1 run-state snapshot (1,947 B) to
                    partition 0 of three topics (runfold's average payload sizes, see
                    txn_floor), and send_offsets_to_transaction for one input partition
                    (AddOffsetsToTxn + TxnOffsetCommit to the group coordinator).

    runfold bench txn-cost [--rates 50,150,300] [--seconds 8] [--broker-pid PID]
    .venv/bin/python -m benchmarks.txn_cost [--rates 50,150,300] [--seconds 8] [--shapes one-partition,processor]

The broker's pid: `--broker-pid`, else the local launcher's broker when it listens at the
bootstrap address (`runfold kafka up`); without one only commit times are reported. Prints one
JSON object; writes benchmarks/results/txn_cost.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.harness import results_dir
from benchmarks.latency_probe import pct
from processors.runtime.settings import ProcessorSettings
from topology.local_kafka import LocalKafkaConfig, get_status
from topology.settings import admin_config, consumer_config

SHAPES = ("one-partition", "processor")
EVENT, ACTIVATION, SNAPSHOT = b"e" * 181, b"a" * 132, b"s" * 1947
WARMUP_TXNS = 20


def broker_pid(bootstrap: str) -> int | None:
    """The local launcher's broker, if it is the one at `bootstrap`."""
    try:
        status = get_status(LocalKafkaConfig.from_env())
    except Exception:  # no launcher state here: not ours to measure
        return None
    if status.running and status.pid is not None and status.bootstrap in bootstrap.split(","):
        return status.pid
    return None


def cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) process `pid` has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Rig:
    """Three topics of one partition each and the input topic whose offsets are committed."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        prefix = settings.topic_prefix
        self.events, self.activations, self.snapshots, self.inputs = (
            f"{prefix}.{name}" for name in ("events", "activations", "snapshots", "inputs")
        )
        self.admin = AdminClient(admin_config(settings))
        topics = [self.events, self.activations, self.snapshots, self.inputs]
        for future in self.admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
            future.result(30)
        self.producer = Producer(settings.producer_config(0))
        self.producer.init_transactions(30)
        # a consumer only for its group metadata (send_offsets_to_transaction); it never reads
        self.consumer = Consumer(consumer_config(settings, f"{prefix}-txn-cost"))
        self.offset = 0

    def transaction(self, shape: str) -> None:
        p = self.producer
        p.begin_transaction()
        for _ in range(3):
            p.produce(self.events, EVENT, b"run", partition=0)
        if shape == "processor":
            p.produce(self.activations, ACTIVATION, b"run", partition=0)
            p.produce(self.snapshots, SNAPSHOT, b"run", partition=0)
            self.offset += 1
            p.send_offsets_to_transaction(
                [TopicPartition(self.inputs, 0, self.offset)], self.consumer.consumer_group_metadata(), 10
            )
        p.commit_transaction(10)

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(10)
        topics = [self.events, self.activations, self.snapshots, self.inputs]
        for future in self.admin.delete_topics(topics).values():
            with contextlib.suppress(Exception):  # cleanup only
                future.result(30)


def measure(rig: Rig, shape: str, rate: float, seconds: float, pid: int | None) -> dict[str, Any]:
    """Transactions of `shape` begun every 1/rate s (or back to back when one takes longer)."""
    idle = None
    if pid is not None:  # what the broker uses with nothing sent: subtracted per transaction
        c0, t0 = cpu_s(pid), time.monotonic()
        time.sleep(min(2.0, seconds / 4))
        idle = (cpu_s(pid) - c0) / (time.monotonic() - t0)
    for _ in range(WARMUP_TXNS):
        rig.transaction(shape)
    commits: list[float] = []
    c0 = cpu_s(pid) if pid is not None else 0.0
    start = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        due = start + len(commits) / rate
        if due > now:
            time.sleep(due - now)
        t = time.perf_counter()
        rig.transaction(shape)
        commits.append((time.perf_counter() - t) * 1000)
    wall = time.monotonic() - start
    n = len(commits)
    out: dict[str, Any] = {
        "shape": shape,
        "planned_per_s": rate,
        "transactions": n,
        "transactions_per_s": round(n / wall, 1),
        "transaction_ms": {"p50": pct(commits, 0.5), "p99": pct(commits, 0.99)},
    }
    if pid is not None and idle is not None:
        used = cpu_s(pid) - c0
        out["broker_cpu_pct"] = round(100 * used / wall, 1)
        out["broker_idle_cpu_pct"] = round(100 * idle, 1)
        out["broker_cpu_ms_per_transaction"] = round(1000 * max(0.0, used - idle * wall) / n, 2)
    return out


def run(
    rates: list[float], seconds: float = 8.0, shapes: tuple[str, ...] = SHAPES, pid: int | None = None
) -> dict[str, Any]:
    settings = ProcessorSettings(topic_prefix=f"txncost{uuid.uuid4().hex[:6]}", instance_id="txn-cost")
    if pid is not None and not os.path.exists(f"/proc/{pid}/stat"):
        raise ValueError(f"broker pid {pid}: no such process on this host")
    pid = pid if pid is not None else broker_pid(settings.bootstrap_servers)
    rig = Rig(settings)
    try:
        cases = [measure(rig, shape, rate, seconds, pid) for shape in shapes for rate in rates]
    finally:
        rig.close()
    out = {
        "bench": "txn_cost",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": " ".join(["python -m benchmarks.txn_cost", *sys.argv[1:]]),
        "bootstrap": settings.bootstrap_servers,
        "broker_pid": pid,
        "loadavg_1m": os.getloadavg()[0],
        "cases": cases,
    }
    (results_dir() / "txn_cost.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return out


def table(out: dict[str, Any]) -> str:
    lines = []
    for c in out["cases"]:
        t = c["transaction_ms"]
        lines.append(
            f"{c['shape']:>13} {c['transactions_per_s']:>7}/s  transaction p50 {t['p50']} ms, p99 {t['p99']} ms;"
            f"  broker {c.get('broker_cpu_pct', 'n/a')} % of a core"
            f" ({c.get('broker_cpu_ms_per_transaction', 'n/a')} ms CPU per transaction)"
        )
    if out["broker_pid"] is None:
        lines.append("broker CPU not measured: no --broker-pid and no local broker at " + out["bootstrap"])
    return "\n".join(lines)


def parse_rates(text: str) -> list[float]:
    """'50,150,300' -> [50.0, 150.0, 300.0]; ValueError saying what is wrong."""
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        rates = []
    if not rates or min(rates) <= 0:
        raise ValueError(f"rates {text!r}: give positive transactions per second, e.g. 50,150,300")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="50,150,300", help="transactions/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--broker-pid", type=int, default=None)
    a = ap.parse_args()
    shapes = tuple(s.strip() for s in a.shapes.split(",") if s.strip())
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    try:
        rates = parse_rates(a.rates)
    except ValueError as e:
        ap.error(f"--{e}")
    try:
        out = run(rates, a.seconds, shapes, a.broker_pid)
    except ValueError as e:
        ap.error(str(e))
    print(table(out), file=sys.stderr)
    print(orjson.dumps(out).decode())


if __name__ == "__main__":
    main()
