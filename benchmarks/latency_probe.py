"""Where a 1-step run's start → terminal latency goes, hop by hop (real broker).

Starts the processor and an executor as subprocesses — the instant responder of
`processor_bench.py` (default) or the real action worker (`--executor worker`,
`python -m processors.cli.worker worker`, built-in `noop`) — sends 1-step runs at a
fixed rate, and reads (read_committed) the run-events and receipts topics. Every record's
CreateTime is the moment its producer called `produce`, so per run:

    t0  send StartRun                          (the probe's clock when it calls produce)
    tc  broker appended the StartRun            (the commands topic's LogAppendTime)
    t1  processor produced StepScheduled        (fetch of the command + fold)
    t1u activation seen read_uncommitted        (the processor's produce reached the broker)
    t1v activation seen read_committed          (its transaction committed: visible to a worker)
    ta  worker's ActivationAccepted appended    (real worker only: the worker's fetch + produce)
    t2  executor's ActivationCompleted appended (receipts: LogAppendTime)
    t3  processor produced RunSucceeded         (fetch of the receipt + fold)
    t4u RunSucceeded seen read_uncommitted
    t4  RunSucceeded seen read_committed        (the terminal event visible to a client)

So a one-step run's time splits into StartRun -> commit -> activation visible -> receipt ->
commit -> terminal visible, and each commit into the produce (t1 -> t1u) and the wait for the
transaction's commit marker (t1u -> t1v: what read_committed costs that hop). The readers block
only for their first record (`poll`), then take what is buffered, so they add ~1 ms at most.
With the processor's metrics it also reports the transactions of the measured window: how many
per second, the mean commit time (snapshots + send_offsets + commit_transaction) and the share
of wall time spent committing.

    .venv/bin/python -m benchmarks.latency_probe [--rate 60] [--seconds 10] [--executor worker]
        [--commit-interval-ms 50] [--batch-size 500] [--reader-fetch-wait-ms 50]

Prints one JSON object with p50/p90/p99 per hop and end to end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

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

NOOP_1 = {
    "schema": "runfold.workflow/v1",
    "id": "noop1",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "nodes": {"a": {"kind": "action", "action": "noop"}},
    "routes": {},
}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1) if s else -1.0


def _reader(
    settings: ProcessorSettings, topics: list[str], read_committed: bool, fetch_wait_ms: int
) -> Consumer:
    reader = Consumer(
        consumer_config(
            settings,
            f"{settings.topic_prefix}-probe-{uuid.uuid4().hex[:6]}",
            read_committed=read_committed,
            auto_offset_reset="latest",
            fetch_wait_max_ms=fetch_wait_ms,
        )
    )
    reader.subscribe(topics)
    end = time.monotonic() + 20
    # assigned, and every start position resolved: `latest` is looked up after the assignment,
    # and records produced before that lookup would be skipped (runs never seen complete)
    while time.monotonic() < end and (
        len(reader.assignment()) < len(topics) * settings.partitions
        or any(tp.offset < 0 for tp in reader.position(reader.assignment()))
    ):
        reader.poll(0.1)
    return reader


def _take(reader: Consumer) -> list[Any]:
    # block (<= 1 ms) only for the first record: consume(n, timeout) would wait for n records
    first = reader.poll(0.001)
    return [first, *reader.consume(500, 0)] if first is not None else []


def probe(
    settings: ProcessorSettings,
    rate: float,
    seconds: float,
    definition: str,
    metrics_port: int | None = None,
    fetch_wait_ms: int = 50,
) -> dict[str, Any]:
    names = settings.topics
    activations = names.activations("default")
    reader = _reader(
        settings, [names.run_events, names.receipts, names.commands, activations], True, fetch_wait_ms
    )
    dirty = _reader(settings, [names.run_events, activations], False, fetch_wait_ms)
    dec_ev, dec_rc = CODEC.decoder("run_events"), CODEC.decoder("receipts")
    dec_cmd, dec_act = CODEC.decoder("commands"), CODEC.decoder("activations")
    p = Producer(producer_config(settings, linger_ms=0))
    t: dict[str, dict[str, float]] = {}
    n = int(rate * seconds)
    tag = uuid.uuid4().hex[:6]  # run ids of this call only (a repeated StartRun would be a duplicate)
    before = scrape(metrics_port) if metrics_port else {}
    start = time.perf_counter()
    i = 0
    done = 0
    last = start
    while i < n or (done < n and time.perf_counter() - start < seconds + 20):
        now = time.perf_counter()
        while i < n and now - start >= i / rate:
            rid = f"lp-{tag}-{i}"
            t[rid] = {"t0": time.time() * 1000}
            _produce(p, settings.topics.commands, start_command(rid, definition), rid.encode())
            i += 1
        p.poll(0)
        for m in _take(dirty):
            if m.error() is not None:
                continue
            seen = time.time() * 1000
            if m.topic() == activations:
                a = dec_act(m.value())
                rec = t.get(a["run_id"])
                if rec is not None and a["type"] == "ActionActivation":
                    rec.setdefault("t1u", seen)
            else:
                ev = dec_ev(m.value())
                rec = t.get(ev["run_id"])
                if rec is not None and ev["type"] == "RunSucceeded":
                    rec["t4u"] = seen
        for m in _take(reader):
            if m.error() is not None:
                continue
            received = time.time() * 1000
            ts = float(m.timestamp()[1])
            if m.topic() == settings.topics.commands:
                c = dec_cmd(m.value())
                rec = t.get(c["run_id"])
                if rec is not None:
                    rec["tc"] = ts
                continue
            if m.topic() == activations:
                a = dec_act(m.value())
                rec = t.get(a["run_id"])
                if rec is not None and a["type"] == "ActionActivation":
                    rec.setdefault("t1v", received)
                continue
            if m.topic() == settings.topics.receipts:
                r = dec_rc(m.value())
                rec = t.get(r["run_id"])
                if rec is not None and r["type"] == "ActivationCompleted":
                    rec["t2"] = ts
                elif rec is not None and r["type"] == "ActivationAccepted":
                    rec["ta"] = ts
                continue
            ev = dec_ev(m.value())
            rec = t.get(ev["run_id"])
            if rec is None:
                continue
            if ev["type"] == "StepScheduled":
                rec["t1"] = ts
            elif ev["type"] == "RunSucceeded":
                rec["t3"] = ts
                rec["t4"] = received
                done += 1
                last = time.perf_counter()
    wall = last - start
    after = scrape(metrics_port) if metrics_port else {}
    reader.close()
    dirty.close()
    full = [r for r in t.values() if all(k in r for k in ("t1", "t2", "t3", "t4"))]
    hops = {
        "command_to_fold": [r["t1"] - r["t0"] for r in full],
        "commit_to_worker_receipt": [r["t2"] - r["t1"] for r in full],
        "receipt_to_fold": [r["t3"] - r["t2"] for r in full],
        "commit_to_reader": [r["t4"] - r["t3"] for r in full],
        "end_to_end": [r["t4"] - r["t0"] for r in full],
    }
    # the chain StartRun -> commit -> activation visible -> receipt -> commit -> terminal visible,
    # each commit split into produce (reaches the broker) and the wait for its commit marker
    chain = [
        ("1_client_send", "t0", "tc"),
        ("2_fetch_and_fold", "tc", "t1"),
        ("3a_produce_activation", "t1", "t1u"),
        ("3b_commit_marker_activation", "t1u", "t1v"),
        ("4_worker_fetch_run_receipt", "t1v", "t2"),
        ("5_fetch_and_fold_receipt", "t2", "t3"),
        ("6a_produce_terminal", "t3", "t4u"),
        ("6b_commit_marker_terminal", "t4u", "t4"),
    ]
    chained = [r for r in full if all(k in r for _, frm, to in chain for k in (frm, to))]
    breakdown: dict[str, Any] = {}
    for name, frm, to in chain:
        v = [r[to] - r[frm] for r in chained]
        breakdown[name] = {
            "mean": round(sum(v) / len(v), 2) if v else -1.0,
            "p50": pct(v, 0.5),
            "p99": pct(v, 0.99),
        }
    e2e = [r["t4"] - r["t0"] for r in chained]
    if e2e:
        # which hops the slowest 1 % of runs spent their time in (mean over those runs)
        slow = sorted(chained, key=lambda r: r["t4"] - r["t0"])[-max(1, len(chained) // 100) :]
        breakdown["slowest_1pct_mean"] = {
            name: round(sum(r[to] - r[frm] for r in slow) / len(slow), 1) for name, frm, to in chain
        }
        breakdown["read_committed_wait_share_pct"] = round(
            100 * sum((r["t1v"] - r["t1u"]) + (r["t4"] - r["t4u"]) for r in chained) / max(sum(e2e), 1e-9),
            1,
        )
    accepted = [r for r in full if "ta" in r]
    if accepted:
        hops["commit_to_worker_accepted"] = [r["ta"] - r["t1"] for r in accepted]
        hops["accepted_to_completed"] = [r["t2"] - r["ta"] for r in accepted]
    missing = sorted(k for r in t.values() for k in ("t1", "t2", "t3", "t4") if k not in r)
    out: dict[str, Any] = {
        "rate": rate,
        "runs": n,
        "complete": len(full),
        **({"missing": {k: missing.count(k) for k in set(missing)}} if missing else {}),
        **{k: {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99)} for k, v in hops.items()},
        "chain_ms": breakdown,
    }
    if metrics_port:
        c = commit_stats(before, after)
        out["processor"] = {
            **c,
            "transactions_per_s": round(c["transactions"] / wall, 1),
            "committing_pct": round(100 * c["transactions"] * c["mean_commit_ms"] / 1000 / wall, 1),
        }
    return out


def register_noop(settings: ProcessorSettings) -> None:
    from processors.client import RunClient

    with RunClient(settings) as client:
        client.register(NOOP_1)


def spawn_worker(settings: ProcessorSettings, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "RUNFOLD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "processors.cli.worker",
            "worker",
            "--queue",
            "default",
            "--log-level",
            "WARNING",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="60", help="runs/s; comma-separated: one probe each, same rig")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--executor", choices=["responder", "worker"], default="responder")
    ap.add_argument("--metrics-port", type=int, default=19311)
    ap.add_argument("--commit-interval-ms", type=int, default=50, help="the processor's")
    ap.add_argument("--batch-size", type=int, default=500, help="the processor's")
    ap.add_argument(
        "--reader-fetch-wait-ms", type=int, default=50, help="the probe's readers' fetch.wait.max.ms"
    )
    args = ap.parse_args()
    prefix = f"probe{uuid.uuid4().hex[:6]}"
    state = f"/tmp/runfold-probe-{prefix}"
    settings = ProcessorSettings(
        topic_prefix=prefix,
        partitions=args.partitions,
        state_dir=Path(state),
        commit_interval_ms=args.commit_interval_ms,
        batch_size=args.batch_size,
    )
    create_topology(settings)
    register(settings)
    definition = "bench1"
    log = open(f"{state}.log", "wb")  # noqa: SIM115 - lives as long as the subprocesses
    procs = [spawn(settings, "processor", log, args.metrics_port)]
    if args.executor == "worker":
        register_noop(settings)
        definition = "noop1"
        procs.append(spawn_worker(settings, log))
    else:
        procs.append(spawn(settings, "responder", log))
    try:
        # warm-up: groups joined, stores ready, connections open
        probe(settings, 20, 2, definition, fetch_wait_ms=args.reader_fetch_wait_ms)
        cases = [
            probe(settings, float(r), args.seconds, definition, args.metrics_port, args.reader_fetch_wait_ms)
            for r in args.rate.split(",")
        ]
    finally:
        stop_rig(procs, settings, state)
    head = {
        "bench": "latency_probe",
        "executor": args.executor,
        "commit_interval_ms": args.commit_interval_ms,
        "batch_size": args.batch_size,
        "reader_fetch_wait_ms": args.reader_fetch_wait_ms,
    }
    body = cases[0] if len(cases) == 1 else {"cases": cases}
    print(orjson.dumps({**head, **body}, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
