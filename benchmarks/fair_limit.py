"""A fair physical limit for the 3-step fold: raw transactional consume -> produce with the fold's shape.

The old passthrough baseline (`passthrough_bench.py`) writes one record per input; the fold
writes ~5 (events, activations, one snapshot per run per transaction), so "fold / passthrough"
compared different jobs. This benchmark measures both, paired in one round:

    fold:  `processor_bench.throughput`: N StartRun of the 3-step `bench3` workflow preloaded
           while one processor (`python -m processors.runtime`) and the instant responder run;
           input records/s = (1 command + 3 receipts per run) / time to the last run succeeded.
           Then every record the round left in its topics is read back (read_committed): the
           inputs (commands, receipts) and the outputs (run-events, activations, run-state).
    limit: the same input records (the fold's own payloads, keys and partitions: commands first,
           then the receipts, phase by phase) preloaded into fresh topics of the same configs;
           a raw confluent-kafka loop with the processor's batch size, commit interval and commit
           rule (commit when the input is drained, the batch is full or the interval passed)
           consumes them read_committed and, per input, produces to the same output topics the
           same number of records as the fold did per input (the fold's own payloads, cycled,
           so sizes and lz4 compressibility match), plus one run-state snapshot per run key per
           transaction, each to the input's partition; then send_offsets + commit.
           No decoding, no engine, no store, no responder.

    fold_vs_limit = fold input records/s / limit input records/s (target >= 0.5)

The output of both is reported per input (events, activations, snapshots, bytes), so a reader
can check the shapes match. The limit runs on one transactional producer; the processor
alternates two (docs/runtime.md, "Where the time goes"): the limit does not get that help.

    runfold bench fair-limit [--runs 3000] [--rounds 3]
    .venv/bin/python -m benchmarks.fair_limit --runs 500 --rounds 1 --warmup 0   # a few seconds
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from benchmarks.harness import Bench, RoundContext, error_text
from benchmarks.passthrough_bench import transactional_loop
from benchmarks.processor_bench import register, spawn, stop_rig, throughput
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology, delete_topology
from topology.settings import consumer_config, producer_config

Record = tuple[bytes | None, bytes, int]  # key, value, partition


@dataclass
class Shape:
    """What one fold round read and wrote, per topic role."""

    inputs: list[Record] = field(default_factory=list)  # commands then receipts, phase by phase
    input_topics: list[str] = field(default_factory=list)  # parallel to `inputs`: "commands"/"receipts"
    outputs: dict[str, list[Record]] = field(default_factory=dict)  # role -> records

    def per_input(self) -> dict[str, float]:
        n = max(len(self.inputs), 1)
        out = {f"{role}_per_input": round(len(recs) / n, 3) for role, recs in self.outputs.items()}
        total = sum(len(k or b"") + len(v) for recs in self.outputs.values() for k, v, _ in recs)
        out["output_bytes_per_input"] = round(total / n, 1)
        out["input_bytes_mean"] = round(sum(len(v) for _, v, _ in self.inputs) / n, 1)
        return out


def read_topic(settings: ProcessorSettings, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every committed record of `topic`, partition by partition in offset order."""
    c = Consumer(
        consumer_config(
            settings, f"{settings.topic_prefix}-fl-read-{uuid.uuid4().hex[:6]}", enable_partition_eof=True
        )
    )
    parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    pending = set(parts)
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for m in c.consume(2000, 0.5):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
                continue
            value = m.value()
            if value is not None:
                out.append((m.key(), value, int(m.partition() or 0)))
    c.close()
    return out


def capture(settings: ProcessorSettings) -> Shape:
    t = settings.topics
    shape = Shape()
    commands = read_topic(settings, t.commands)
    receipts = read_topic(settings, t.receipts)
    # The fold's closed loop with the responder puts each of a run's inputs in its own
    # transaction. The limit's preloaded inputs keep them apart too: receipts in phase order
    # (every run's 1st receipt, then every run's 2nd, ...), the odd phases rotated by half the
    # runs, because the limit reads the 1st receipts while it still reads the commands (N/2 runs
    # apart is more than a batch from 1,000 runs on).
    index = {rec[0]: i for i, rec in enumerate(commands)}
    n = max(len(commands), 1)
    seen: dict[bytes | None, int] = {}
    phased: list[tuple[int, int, Record]] = []
    for rec in receipts:
        k = seen[rec[0]] = seen.get(rec[0], 0) + 1
        phased.append((k, (index.get(rec[0], 0) + (n // 2) * (k % 2)) % n, rec))
    shape.inputs = commands + [rec for _, _, rec in sorted(phased, key=lambda x: (x[0], x[1]))]
    shape.input_topics = ["commands"] * len(commands) + ["receipts"] * len(receipts)
    shape.outputs = {
        "events": read_topic(settings, t.run_events),
        "activations": read_topic(settings, t.activations("default")),
        "snapshots": read_topic(settings, t.run_state),
    }
    return shape


def fold_round(settings: ProcessorSettings, runs: int, metrics_port: int) -> tuple[dict[str, Any], Shape]:
    create_topology(settings)
    register(settings)
    log = open(f"{settings.state_dir}.log", "wb")  # noqa: SIM115 - lives as long as the subprocesses
    procs = [spawn(settings, "processor", log, metrics_port), spawn(settings, "responder", log)]
    try:
        tp = throughput(settings, runs, [metrics_port], timeout=300)
        time.sleep(0.5)  # the last transaction's snapshots and the responder's last receipts land
        shape = capture(settings)
    finally:
        stop_rig(procs, settings, str(settings.state_dir))
        log.close()
    return tp, shape


def preload(settings: ProcessorSettings, shape: Shape) -> None:
    p = Producer(producer_config(settings))
    topics = {"commands": settings.topics.commands, "receipts": settings.topics.receipts}
    for (key, value, partition), role in zip(shape.inputs, shape.input_topics, strict=True):
        while True:
            try:
                p.produce(topics[role], value, key, partition=partition)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)


class Emitter:
    """Per input, the fold's records per input of each output role (error diffusion, so the totals
    match exactly), payloads cycled from the fold's own records."""

    def __init__(self, shape: Shape, topics: dict[str, str]) -> None:
        n = max(len(shape.inputs), 1)
        self.rate = {role: len(shape.outputs[role]) / n for role in ("events", "activations")}
        self.acc = dict.fromkeys(self.rate, 0.0)
        self.payloads = {role: [v for _, v, _ in recs] or [b"x"] for role, recs in shape.outputs.items()}
        self.cursor = dict.fromkeys(self.payloads, 0)
        self.topics = topics
        self.sent = dict.fromkeys(self.payloads, 0)

    def _next(self, role: str) -> bytes:
        values = self.payloads[role]
        i = self.cursor[role]
        self.cursor[role] = (i + 1) % len(values)
        return values[i]

    def emit(self, p: Producer, role: str, key: bytes | None, partition: int) -> None:
        while True:
            try:
                p.produce(self.topics[role], self._next(role), key, partition=partition)
                break
            except BufferError:
                p.poll(0.01)
        self.sent[role] += 1

    def per_input(self, p: Producer, key: bytes | None, partition: int) -> None:
        for role, r in self.rate.items():
            self.acc[role] += r
            while self.acc[role] >= 1.0:
                self.acc[role] -= 1.0
                self.emit(p, role, key, partition)


def limit_loop(settings: ProcessorSettings, shape: Shape) -> dict[str, Any]:
    t = settings.topics
    emitter = Emitter(
        shape, {"events": t.run_events, "activations": t.activations("default"), "snapshots": t.run_state}
    )
    consumer = Consumer(settings.input_consumer_config())
    producer = Producer(settings.producer_config())
    producer.init_transactions(30)
    consumer.subscribe([t.commands, t.receipts])
    touched: dict[bytes | None, int] = {}  # run key -> partition, this transaction

    def fold_like(m: Message, _topic: str, partition: int, _offset: int) -> None:
        key = m.key()
        emitter.per_input(producer, key, partition)
        touched[key] = partition

    def snapshots() -> None:  # one snapshot per run per transaction
        for key, partition in touched.items():
            emitter.emit(producer, "snapshots", key, partition)
        touched.clear()

    r = transactional_loop(settings, consumer, [producer], len(shape.inputs), fold_like, snapshots)
    consumer.close()
    done, txns, elapsed, commit_s = r
    n = max(done, 1)
    return {
        "input_records": done,
        "seconds": round(elapsed, 3),
        "input_records_per_s": round(done / elapsed, 1),
        "output_records_per_s": round(sum(emitter.sent.values()) / elapsed, 1),
        "transactions": txns,
        "mean_batch": round(done / max(txns, 1), 1),
        "mean_commit_ms": round(1000 * commit_s / max(txns, 1), 2),
        **{f"{role}_per_input": round(c / n, 3) for role, c in emitter.sent.items()},
    }


def limit_round(settings: ProcessorSettings, shape: Shape) -> dict[str, Any]:
    settings = settings.model_copy(
        update={
            "topic_prefix": f"{settings.topic_prefix}lim",
            "instance_id": "fair-limit",
            "group_id": f"{settings.topic_prefix}lim-fair-limit",
        }
    )
    create_topology(settings)
    try:
        preload(settings, shape)
        return limit_loop(settings, shape)
    finally:
        delete_topology(settings)


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    runs = max(200, p["runs"] // 5) if ctx.warmup else p["runs"]
    settings = ProcessorSettings(
        topic_prefix=ctx.prefix,
        partitions=p["partitions"],
        state_dir=Path(f"/tmp/runfold-fair-{ctx.prefix}"),
        batch_size=p["batch_size"],
        commit_interval_ms=p["commit_interval_ms"],
    )
    out: dict[str, dict[str, Any]] = {}
    try:
        tp, shape = fold_round(settings, runs, p["metrics_port"])
    except BaseException as e:  # throughput() gives up with SystemExit
        return {"fold": {"error": error_text(e)}}
    out["fold"] = {
        "runs": runs,
        "runs_per_s": tp["runs_per_s"],
        "input_records": len(shape.inputs),
        "input_records_per_s": tp["input_records_per_s"],
        "output_records_per_s": tp["output_records_per_s"],
        "mean_batch": tp["mean_batch"],
        "processor_cpu_us_per_input": tp["processor_cpu_us_per_input"],
        **shape.per_input(),
    }
    try:
        out["limit"] = limit_round(settings, shape)
    except Exception as e:
        out["limit"] = {"error": error_text(e)}
    fold, lim = out["fold"]["input_records_per_s"], out["limit"].get("input_records_per_s")
    if lim:
        out["fold"]["fold_vs_limit"] = round(fold / lim, 3)
    return out


def run(
    runs: int = 3000,
    partitions: int = 2,
    batch_size: int = 500,
    commit_interval_ms: int = 50,
    rounds: int = 3,
    warmup: int = 1,
    metrics_port: int = 19312,
) -> Bench:
    bench = Bench(
        "fair_limit",
        params={
            "runs": runs,
            "partitions": partitions,
            "batch_size": batch_size,
            "commit_interval_ms": commit_interval_ms,
            "metrics_port": metrics_port,
            "workflow": "bench3 (3 sequential actions, instant responder)",
        },
        rounds=rounds,
        warmup=warmup,
    )
    bench.notes.append(
        "fold and limit paired in each round on the same broker; the limit replays the fold's own "
        "inputs and output payloads (same topics, counts per input, sizes), one snapshot per run "
        "key per transaction, one transactional producer, no responder"
    )
    bench.run(round_fn)
    bench.ratio("fold_vs_limit", "fold", "limit", "input_records_per_s", target=0.5)
    bench.save(
        plot=[("input records/s", "input_records_per_s"), ("output records/s", "output_records_per_s")]
    )
    return bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--commit-interval-ms", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--metrics-port", type=int, default=19312)
    a = ap.parse_args()
    b = run(a.runs, a.partitions, a.batch_size, a.commit_interval_ms, a.rounds, a.warmup, a.metrics_port)
    print(b.table(["input_records_per_s", "output_records_per_s", "snapshots_per_input", "fold_vs_limit"]))
    print(b.ratios)


if __name__ == "__main__":
    main()
