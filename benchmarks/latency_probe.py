"""Where a 1-step run's start → terminal latency goes, hop by hop (real broker).

Starts the processor and an executor as subprocesses — the instant responder of
`processor_bench.py` (default) or the real action worker (`--executor worker`,
`python -m processors.cli.worker worker`, built-in `noop`) — sends 1-step runs at a
fixed rate, and reads (read_committed) the run-events and receipts topics. Every record's
CreateTime is the moment its producer called `produce`, so per run:

    t0 send StartRun (CreateTime of the command)
    t1 processor produced StepScheduled       (fetch of the command + fold)
    ta worker produced ActivationAccepted     (real worker only: commit + activation visible + fetch)
    t2 executor produced ActivationCompleted  (processor commit + activation visible + executor fetch)
    t3 processor produced RunSucceeded        (fetch of the receipt + fold)
    t4 reader received RunSucceeded           (processor commit + run-event visible + reader fetch)

The reader blocks only for its first record (`poll`), then takes what is buffered, so t4
is not delayed by the reader itself. With the processor's metrics it also reports the
transactions of the measured window: how many per second, the mean commit time
(snapshots + send_offsets + commit_transaction) and the share of wall time spent committing.

    .venv/bin/python -m benchmarks.latency_probe [--rate 60] [--seconds 10] [--executor worker]

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


def probe(
    settings: ProcessorSettings, rate: float, seconds: float, definition: str, metrics_port: int | None = None
) -> dict[str, Any]:
    reader = Consumer(
        consumer_config(
            settings, f"{settings.topic_prefix}-probe-{uuid.uuid4().hex[:6]}", auto_offset_reset="latest"
        )
    )
    reader.subscribe([settings.topics.run_events, settings.topics.receipts])
    end = time.monotonic() + 20
    # assigned, and every start position resolved: `latest` is looked up after the assignment,
    # and records produced before that lookup would be skipped (runs never seen complete)
    while time.monotonic() < end and (
        len(reader.assignment()) < 2 * settings.partitions
        or any(tp.offset < 0 for tp in reader.position(reader.assignment()))
    ):
        reader.poll(0.1)
    dec_ev, dec_rc = CODEC.decoder("run_events"), CODEC.decoder("receipts")
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
        # block (≤ 2 ms) only for the first record: consume(n, timeout) would wait for n records
        first = reader.poll(0.002)
        for m in [first, *reader.consume(500, 0)] if first is not None else []:
            if m.error() is not None:
                continue
            received = time.time() * 1000
            ts = float(m.timestamp()[1])
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
    full = [r for r in t.values() if all(k in r for k in ("t1", "t2", "t3", "t4"))]
    hops = {
        "command_to_fold": [r["t1"] - r["t0"] for r in full],
        "commit_to_worker_receipt": [r["t2"] - r["t1"] for r in full],
        "receipt_to_fold": [r["t3"] - r["t2"] for r in full],
        "commit_to_reader": [r["t4"] - r["t3"] for r in full],
        "end_to_end": [r["t4"] - r["t0"] for r in full],
    }
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
    ap.add_argument("--rate", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--executor", choices=["responder", "worker"], default="responder")
    ap.add_argument("--metrics-port", type=int, default=19311)
    args = ap.parse_args()
    prefix = f"probe{uuid.uuid4().hex[:6]}"
    state = f"/tmp/runfold-probe-{prefix}"
    settings = ProcessorSettings(topic_prefix=prefix, partitions=args.partitions, state_dir=Path(state))
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
        probe(settings, 20, 2, definition)  # warm-up: groups joined, stores ready, connections open
        out = probe(settings, args.rate, args.seconds, definition, args.metrics_port)
    finally:
        stop_rig(procs, settings, state)
    print(
        orjson.dumps(
            {"bench": "latency_probe", "executor": args.executor, **out}, option=orjson.OPT_INDENT_2
        ).decode()
    )


if __name__ == "__main__":
    main()
