"""Where a 1-step run's start → terminal latency goes, hop by hop (real broker).

Starts the processor and the instant responder of `processor_bench.py` as subprocesses,
sends 1-step runs at a fixed rate, and reads (read_committed) the run-events and receipts
topics. Every record's CreateTime is the moment its producer called `produce`, so per run:

    t0 send StartRun (CreateTime of the command)
    t1 processor produced StepScheduled       (fetch of the command + fold)
    t2 responder produced ActivationCompleted (processor commit + activation visible + worker fetch)
    t3 processor produced RunSucceeded        (fetch of the receipt + fold)
    t4 reader received RunSucceeded           (processor commit + run-event visible + reader fetch)

    .venv/bin/python benchmarks/latency_probe.py [--rate 60] [--seconds 10]

Prints one JSON object with p50/p90/p99 per hop and end to end.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

from benchmarks.processor_bench import CODEC, _produce, register, spawn, start_command, stop_rig
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import consumer_config, producer_config


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1) if s else -1.0


def probe(settings: ProcessorSettings, rate: float, seconds: float) -> dict[str, Any]:
    reader = Consumer(consumer_config(settings, f"{settings.topic_prefix}-probe-{uuid.uuid4().hex[:6]}", auto_offset_reset="latest"))
    reader.subscribe([settings.topics.run_events, settings.topics.receipts])
    end = time.monotonic() + 20
    while len(reader.assignment()) < 2 * settings.partitions and time.monotonic() < end:
        reader.poll(0.1)
    dec_ev, dec_rc = CODEC.decoder("run_events"), CODEC.decoder("receipts")
    p = Producer(producer_config(settings, linger_ms=0))
    t: dict[str, dict[str, float]] = {}
    n = int(rate * seconds)
    start = time.perf_counter()
    i = 0
    done = 0
    while i < n or (done < n and time.perf_counter() - start < seconds + 20):
        now = time.perf_counter()
        while i < n and now - start >= i / rate:
            rid = f"lp-{i}"
            t[rid] = {"t0": time.time() * 1000}
            _produce(p, settings.topics.commands, start_command(rid, "bench1"), rid.encode())
            i += 1
        p.poll(0)
        for m in reader.consume(200, 0.002):
            if m.error() is not None:
                continue
            received = time.time() * 1000
            ts = float(m.timestamp()[1])
            if m.topic() == settings.topics.receipts:
                r = dec_rc(m.value())
                if r["type"] == "ActivationCompleted" and r["run_id"] in t:
                    t[r["run_id"]]["t2"] = ts
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
    reader.close()
    full = [r for r in t.values() if all(k in r for k in ("t1", "t2", "t3", "t4"))]
    hops = {
        "command_to_fold": [r["t1"] - r["t0"] for r in full],
        "commit_to_worker_receipt": [r["t2"] - r["t1"] for r in full],
        "receipt_to_fold": [r["t3"] - r["t2"] for r in full],
        "commit_to_reader": [r["t4"] - r["t3"] for r in full],
        "end_to_end": [r["t4"] - r["t0"] for r in full],
    }
    return {"rate": rate, "runs": n, "complete": len(full),
            **{k: {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "p99": pct(v, 0.99)} for k, v in hops.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--metrics-port", type=int, default=19311)
    args = ap.parse_args()
    prefix = f"probe{uuid.uuid4().hex[:6]}"
    state = f"/tmp/runfold-probe-{prefix}"
    settings = ProcessorSettings(topic_prefix=prefix, partitions=args.partitions, state_dir=Path(state))
    create_topology(settings)
    register(settings)
    log = open(f"{state}.log", "wb")  # noqa: SIM115 - lives as long as the subprocesses
    procs = [spawn(settings, "processor", log, args.metrics_port), spawn(settings, "responder", log)]
    try:
        probe(settings, 20, 2)  # warm-up: groups joined, stores ready, connections open
        out = probe(settings, args.rate, args.seconds)
    finally:
        stop_rig(procs, settings, state)
    print(orjson.dumps({"bench": "latency_probe", **out}, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
