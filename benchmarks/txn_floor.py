"""The floor Kafka's transactions put under a one-step run's latency, beside runfold's (real broker).

A one-step run is two transactions of the processor (StartRun -> events + activation, receipt ->
events) with an executor's receipt between them, and a client that sees the terminal event only
once the second one committed (read_committed). Exactly-once for state and events cannot do with
fewer. This benchmark measures that chain without runfold, next to runfold, in one command:

    runfold: the processor (`python -m processors.runtime`) and the instant responder of
             `processor_bench.py`; 1-step `bench1` runs sent open-loop (t0 = the send, t4 =
             RunSucceeded seen by a read_committed reader of run-events).
    floor:   a raw confluent-kafka loop in place of the processor, with its consumer and
             transactional producer settings and its batch and commit rule
             (`passthrough_bench.transactional_loop`: commit when the input is drained, the batch
             is full or commit_interval_ms passed), two producers alternated as the processor's
             are. Per StartRun it writes what the runfold case
             wrote per StartRun (its events, one activation), per receipt what it wrote per
             receipt (its events), one run-state snapshot per run per transaction: runfold's own
             payloads (sampled from the runfold case's topics), so counts, sizes and lz4
             compression match; no decoding, no engine, no store. A raw responder (the instant
             responder's settings) answers each activation read_committed with one receipt. The
             same open loop (`end_to_end`) sends real StartRun records and times the terminal
             record; it decodes every run event for both systems, so both pay the same.

Both rigs are up side by side; each rate is measured runfold, then floor, `--rounds` times, so
the ratio runfold / floor comes from the same minutes. What the floor pays is the transaction
protocol (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, the markers and the LSO,
twice) plus two consumer fetches and a receipt's produce; what runfold pays above it is its own.

    runfold bench txn-floor [--rates 2.5,60,150] [--seconds 12] [--rounds 2]
    .venv/bin/python -m benchmarks.txn_floor [--rate 2.5,60,150] [--seconds 12] [--rounds 2]

Prints one JSON object (and a table on stderr); writes benchmarks/results/txn_floor.json.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, Producer

try:  # the `bench` extra: without it the CPU of each side's processes is not reported
    import psutil
except ImportError:  # pragma: no cover - depends on the installed extras
    psutil = None

from benchmarks.harness import results_dir
from benchmarks.latency_probe import _reader, _take, pct
from benchmarks.passthrough_bench import transactional_loop
from benchmarks.processor_bench import (
    CODEC,
    _produce,
    commit_stats,
    register,
    scrape,
    spawn,
    start_command,
    stop_rig,
)
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import consumer_config, producer_config

# marks the record the probe waits for
TERMINAL: list[tuple[str, str | bytes | None]] = [("runfold-floor", b"terminal")]


# ---- the runfold case's shape: what it wrote per StartRun and per receipt --------------------
def sample_shape(settings: ProcessorSettings) -> dict[str, Any]:
    """Read back (read_committed) what the runfold rig wrote for its runs so far: per run, the
    events produced with the activation (the StartRun's fold) and after it (the receipt's), the
    snapshots; one payload of each kind to replay and the mean sizes."""
    names = settings.topics
    topics = [names.run_events, names.activations("default"), names.run_state, names.receipts]
    reader = Consumer(
        consumer_config(
            settings, f"{settings.topic_prefix}-shape-{uuid.uuid4().hex[:6]}", enable_partition_eof=True
        )
    )
    reader.subscribe(topics)
    eofs: set[tuple[str, int]] = set()
    records: list[tuple[str, bytes, int]] = []  # topic, value, CreateTime
    end = time.monotonic() + 60
    while len(eofs) < len(topics) * settings.partitions and time.monotonic() < end:
        m = reader.poll(0.2)
        if m is None:
            continue
        topic, value = m.topic(), m.value()
        assert topic is not None
        if m.error() is not None:
            eofs.add((topic, m.partition() or 0))
        elif value:  # a null run-state record is a purge's tombstone
            records.append((topic, value, m.timestamp()[1]))
    reader.close()
    dec_ev, dec_act = CODEC.decoder("run_events"), CODEC.decoder("activations")
    activated_at: dict[str, int] = {}  # run -> the activation's CreateTime (its fold's produce)
    for topic, value, ts in records:
        if topic == names.activations("default") and (a := dec_act(value))["type"] == "ActionActivation":
            activated_at[a["run_id"]] = ts
    command_events: list[bytes] = []
    receipt_events: list[bytes] = []
    sample: dict[str, list[bytes]] = {"command": [], "receipt": []}  # one run's, replayed by the floor
    sample_run = next(iter(activated_at), None)
    types: Counter[str] = Counter()
    for topic, value, ts in records:
        if topic != names.run_events:
            continue
        ev = dec_ev(value)
        at = activated_at.get(ev["run_id"])
        if at is None:
            continue
        types[ev["type"]] += 1
        phase = "command" if ts <= at else "receipt"
        (command_events if phase == "command" else receipt_events).append(value)
        if ev["run_id"] == sample_run:
            sample[phase].append(value)
    runs = len(activated_at)
    snapshots = [v for t, v, _ in records if t == names.run_state]
    activations = [v for t, v, _ in records if t == names.activations("default")]
    receipts = [v for t, v, _ in records if t == names.receipts]
    if not runs or not receipt_events or not command_events:
        raise SystemExit(f"the runfold case left no complete runs to sample ({len(records)} records read)")
    per_cmd = round(len(command_events) / runs)
    per_rc = round(len(receipt_events) / runs)

    def mean(vs: list[bytes]) -> float:
        return round(sum(map(len, vs)) / max(1, len(vs)), 1)

    return {
        "runs_sampled": runs,
        "event_types": dict(types),
        "events_per_start": per_cmd,
        "events_per_receipt": per_rc,
        "snapshots_per_run": round(len(snapshots) / runs, 2),
        "bytes": {
            "event": mean(command_events + receipt_events),
            "activation": mean(activations),
            "snapshot": mean(snapshots),
            "receipt": mean(receipts),
        },
        # one payload of each kind, replayed by the floor
        "payloads": {
            "command_events": [base64.b64encode(v).decode() for v in sample["command"]],
            "receipt_events": [base64.b64encode(v).decode() for v in sample["receipt"]],
            "activation": base64.b64encode(activations[0]).decode(),
            "snapshot": base64.b64encode(snapshots[0]).decode(),
            "receipt": base64.b64encode(receipts[0]).decode(),
        },
    }


# ---- the floor's roles (subprocesses) --------------------------------------------------------
def raw_fold(settings: ProcessorSettings, shape: dict[str, Any]) -> None:
    """The processor's I/O without the processor: runs until SIGTERM."""
    pay = shape["payloads"]
    command_events = [base64.b64decode(v) for v in pay["command_events"]]
    receipt_events = [base64.b64decode(v) for v in pay["receipt_events"]]
    activation, snapshot = base64.b64decode(pay["activation"]), base64.b64decode(pay["snapshot"])
    names = settings.topics
    activations = names.activations("default")
    consumer = Consumer(settings.input_consumer_config())
    consumer.subscribe([names.commands, names.receipts])
    # two transactional producers, alternated after each commit, as the processor's
    # (`alternate_producers`): the next transaction need not wait for the last one's markers
    producers = [Producer(settings.producer_config(slot)) for slot in (0, 1)]
    for producer in producers:
        producer.init_transactions(30)
    touched: dict[bytes, int] = {}  # run key -> partition, of the open transaction

    def on_record(m: Message, topic: str, partition: int, _offset: int) -> None:
        key = m.key()
        producer = producers[0]
        if topic == names.commands:
            for v in command_events:
                producer.produce(names.run_events, v, key, partition=partition)
            producer.produce(activations, activation, key, partition=partition)
        else:
            *rest, last = receipt_events
            for v in rest:
                producer.produce(names.run_events, v, key, partition=partition)
            producer.produce(names.run_events, last, key, partition=partition, headers=TERMINAL)
        assert key is not None
        touched[key] = partition

    def before_commit() -> None:
        for key, partition in touched.items():
            producers[0].produce(names.run_state, snapshot, key, partition=partition)
        touched.clear()

    transactional_loop(settings, consumer, producers, 1 << 62, on_record, before_commit)


def raw_responder(settings: ProcessorSettings, shape: dict[str, Any]) -> None:
    """The instant responder's I/O: one receipt per activation, read_committed. Until SIGTERM."""
    receipt = base64.b64decode(shape["payloads"]["receipt"])
    c = Consumer(consumer_config(settings, f"{settings.topic_prefix}-floor-responder"))
    c.subscribe([settings.topics.activations("default")])
    p = Producer(producer_config(settings, linger_ms=1))
    while True:
        first = c.poll(0.05)
        for m in [first, *c.consume(499, 0)] if first is not None else []:
            if m.error() is None:
                key = m.key()
                assert key is not None
                _produce(p, settings.topics.receipts, receipt, key)
        p.poll(0)


def end_to_end(
    settings: ProcessorSettings,
    rate: float,
    seconds: float,
    fetch_wait_ms: int,
    terminal: Callable[[Message], bool],
    procs: list[subprocess.Popen[bytes]] | None = None,
) -> dict[str, Any]:
    """The one open loop both systems are timed with: 1-step StartRun records sent at `rate`,
    t0 at the send, t4 when `terminal` says a run-events record read_committed is the run's
    last. It reads only run-events and decodes each record for both, so both pay the same.
    With `procs` (fold, executor): the % of a core each used meanwhile."""
    reader = _reader(settings, [settings.topics.run_events], True, fetch_wait_ms)
    p = Producer(producer_config(settings, linger_ms=0))
    # a new producer's first send waits ~0.5 s for its producer id: not the system's latency
    _produce(
        p, settings.topics.commands, start_command(f"e2e-warm-{uuid.uuid4().hex[:6]}", "bench1"), b"warm"
    )
    p.flush(10)
    sent: dict[bytes, float] = {}
    e2e: list[float] = []
    terminal_commit: list[float] = []  # the terminal record's produce -> seen committed
    n = int(rate * seconds)
    tag = uuid.uuid4().hex[:6]
    cpu_before = cpu_s(procs or [])
    start = time.perf_counter()
    i = 0
    while i < n or (len(e2e) < n and time.perf_counter() - start < seconds + 20):
        now = time.perf_counter()
        while i < n and now - start >= i / rate:
            rid = f"e2e-{tag}-{i}"
            sent[rid.encode()] = time.time() * 1000
            _produce(p, settings.topics.commands, start_command(rid, "bench1"), rid.encode())
            i += 1
        p.poll(0)
        for m in _take(reader):
            if m.error() is None and terminal(m) and (t0 := sent.pop(m.key() or b"", None)) is not None:
                seen = time.time() * 1000
                e2e.append(seen - t0)
                terminal_commit.append(seen - m.timestamp()[1])
    wall = time.perf_counter() - start
    reader.close()
    out: dict[str, Any] = {
        "runs": n,
        "complete": len(e2e),
        "end_to_end": {"p50": pct(e2e, 0.5), "p90": pct(e2e, 0.9), "p99": pct(e2e, 0.99)},
        "terminal_commit": {"p50": pct(terminal_commit, 0.5), "p99": pct(terminal_commit, 0.99)},
    }
    if cpu_before:
        used = zip(("fold", "executor"), cpu_before, cpu_s(procs or []), strict=True)
        out["cpu_pct"] = {role: round(100 * (b - a) / wall, 1) for role, a, b in used}
    return out


_DECODE_EVENT = CODEC.decoder("run_events")


def runfold_terminal(m: Message) -> bool:
    return bool(_DECODE_EVENT(m.value())["type"] == "RunSucceeded")


def floor_terminal(m: Message) -> bool:
    _DECODE_EVENT(m.value())  # runfold's payload, decoded as runfold's are: the same cost
    return bool(m.headers())


def cpu_s(procs: list[subprocess.Popen[bytes]]) -> list[float]:
    """CPU-seconds (user + system) each process has used so far; [] without psutil."""
    if psutil is None:
        return []
    times = [psutil.Process(p.pid).cpu_times() for p in procs]
    return [t.user + t.system for t in times]


def _spawn_role(
    settings: ProcessorSettings, role: str, shape_file: Path, log: Any
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "RUNFOLD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_PARTITIONS": str(settings.partitions),
    }
    args = [
        sys.executable,
        "-m",
        "benchmarks.txn_floor",
        "--role",
        role,
        "--shape-file",
        str(shape_file),
        "--batch-size",
        str(settings.batch_size),
        "--commit-interval-ms",
        str(settings.commit_interval_ms),
    ]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)


def run(
    rates: list[float],
    seconds: float = 12.0,
    rounds: int = 2,
    partitions: int = 2,
    commit_interval_ms: int = 50,
    batch_size: int = 500,
    metrics_port: int = 19312,
    fetch_wait_ms: int = 50,
) -> dict[str, Any]:
    """Both rigs side by side, each rate measured runfold then floor, `rounds` times; the result
    also goes to benchmarks/results/txn_floor.json."""

    def rig_settings(kind: str) -> ProcessorSettings:
        prefix = f"{kind}{uuid.uuid4().hex[:6]}"
        return ProcessorSettings(
            topic_prefix=prefix,
            partitions=partitions,
            state_dir=Path(f"/tmp/runfold-floor-{prefix}"),
            commit_interval_ms=commit_interval_ms,
            batch_size=batch_size,
        )

    ours, floor = rig_settings("flr"), rig_settings("flf")
    create_topology(ours)
    register(ours)
    create_topology(floor)
    log_path = f"{ours.state_dir}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the subprocesses
    shape_file = Path(f"{floor.state_dir}.shape.json")
    ours_procs = [spawn(ours, "processor", log, metrics_port), spawn(ours, "responder", log)]
    floor_procs: list[subprocess.Popen[bytes]] = []
    cases: dict[float, dict[str, list[dict[str, Any]]]] = {r: {"runfold": [], "floor": []} for r in rates}
    try:
        end_to_end(ours, 20, 2, fetch_wait_ms, runfold_terminal)  # warm-up, and the runs to sample
        shape = sample_shape(ours)
        shape_file.write_bytes(orjson.dumps(shape))
        floor_procs = [
            _spawn_role(floor, "raw-fold", shape_file, log),
            _spawn_role(floor, "raw-responder", shape_file, log),
        ]
        end_to_end(floor, 20, 2, fetch_wait_ms, floor_terminal)  # warm-up
        for _ in range(rounds):
            for r in rates:
                before = scrape(metrics_port)
                ran = end_to_end(ours, r, seconds, fetch_wait_ms, runfold_terminal, ours_procs)
                ran["processor"] = commit_stats(before, scrape(metrics_port))
                cases[r]["runfold"].append(ran)
                cases[r]["floor"].append(
                    end_to_end(floor, r, seconds, fetch_wait_ms, floor_terminal, floor_procs)
                )
    finally:
        stop_rig(floor_procs, floor, str(floor.state_dir))
        stop_rig(ours_procs, ours, str(ours.state_dir))
        shape_file.unlink(missing_ok=True)
        log.close()
    summary = []
    for r, both in cases.items():
        row: dict[str, Any] = {"rate": r}
        for q in ("p50", "p99"):
            ratios = [
                round(a["end_to_end"][q] / b["end_to_end"][q], 2)
                for a, b in zip(both["runfold"], both["floor"], strict=True)
                if b["end_to_end"][q] > 0
            ]
            row[f"runfold_{q}_ms"] = [a["end_to_end"][q] for a in both["runfold"]]
            row[f"floor_{q}_ms"] = [b["end_to_end"][q] for b in both["floor"]]
            row[f"runfold_over_floor_{q}"] = ratios
        summary.append(row)
    shape.pop("payloads")
    out = {
        "bench": "txn_floor",
        "partitions": partitions,
        "commit_interval_ms": commit_interval_ms,
        "batch_size": batch_size,
        "shape": shape,
        "summary": summary,
        "cases": {str(r): c for r, c in cases.items()},
        "log": log_path,
    }
    (results_dir() / "txn_floor.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return out


def table(out: dict[str, Any]) -> str:
    """One line per rate: runfold's and the floor's end-to-end p50 / p99 per round, and the ratios."""
    lines = ["runs/s   runfold p50 / p99 ms        floor p50 / p99 ms        runfold / floor p50, p99"]
    for row in out["summary"]:
        ours = ", ".join(
            f"{a} / {b}" for a, b in zip(row["runfold_p50_ms"], row["runfold_p99_ms"], strict=True)
        )
        floor = ", ".join(f"{a} / {b}" for a, b in zip(row["floor_p50_ms"], row["floor_p99_ms"], strict=True))
        lines.append(
            f"{row['rate']:<8} {ours:<27} {floor:<25} {row['runfold_over_floor_p50']}, {row['runfold_over_floor_p99']}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["bench", "raw-fold", "raw-responder"], default="bench")
    ap.add_argument("--shape-file", type=Path, default=None)
    ap.add_argument("--rate", default="2.5,60,150", help="runs/s; comma-separated")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--commit-interval-ms", type=int, default=50, help="the processor's and the floor's")
    ap.add_argument("--batch-size", type=int, default=500, help="the processor's and the floor's")
    ap.add_argument("--metrics-port", type=int, default=19312)
    ap.add_argument("--reader-fetch-wait-ms", type=int, default=50)
    args = ap.parse_args()
    if args.role != "bench":
        settings = ProcessorSettings(batch_size=args.batch_size, commit_interval_ms=args.commit_interval_ms)
        shape = orjson.loads(args.shape_file.read_bytes())
        (raw_fold if args.role == "raw-fold" else raw_responder)(settings, shape)
        return
    out = run(
        [float(r) for r in args.rate.split(",")],
        args.seconds,
        args.rounds,
        args.partitions,
        args.commit_interval_ms,
        args.batch_size,
        args.metrics_port,
        args.reader_fetch_wait_ms,
    )
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    print(table(out), file=sys.stderr)


if __name__ == "__main__":
    main()
