"""Replay: run events folded per second by `runfold replay --rebuild` (and `--verify`).

Each round fills a fresh `<p>.run-events` with the events of N runs of a 3-step no-op
workflow (default 4,000 runs = 60,000 events), produced by driving the pure engine —
`decide`/`evolve`/`effects`, the functions the processor calls — with a StartRun and the
receipts a worker would send, so the events are exactly what a processor commits (run
ids hash to the partitions a processor would use). Then the CLI `runfold replay --rebuild
--json` rebuilds the processor stores from that topic into an empty directory; the figure
is its own report (events folded / seconds, reading from Kafka included). Each run's
final RunStateSnapshot is produced too, so `runfold replay --verify --json` then checks
every run's folded digest against it (`complete` = 1: all events, all runs, no difference).

`synthesize_runs` is also used by memory.py to fill a store with many completed runs.

    runfold bench replay [--runs 4000] [--rounds 3]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from typing import Any

import orjson
from confluent_kafka import Producer

from benchmarks.harness import Bench, RoundContext, delete_topics_containing
from benchmarks.workflow_throughput import DEFINITIONS
from processors.engine import (
    Catalog,
    Ceilings,
    EngineContext,
    decide,
    dump_state,
    effects,
    evolve,
    run_status,
)
from schemas import Codec
from topology.admin import create_topology
from topology.settings import KafkaSettings, producer_config

CODEC = Codec.default()
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


def snapshot_of(state: Any, ts_ms: int) -> bytes:
    """A RunStateSnapshot exactly as the processor's commit writes it (processors/runtime/fold.py)."""
    raw = dump_state(state)
    return CODEC.encode(
        "run_state",
        {
            "run_id": state["run_id"],
            "sequence": state["sequence"],
            "ts_ms": ts_ms,
            "status": run_status(state),
            "definition_id": state["definition_id"],
            "revision": state["revision"],
            "state_digest": hashlib.sha256(raw).hexdigest(),
            "state": orjson.Fragment(raw),
        },
    )


def run_events(
    ctx: EngineContext, definition_id: str, run_id: str, ts: int, answer: bool = True
) -> tuple[list[dict[str, Any]], Any, int]:
    """The events of one run of `definition_id` driven by the pure engine: a StartRun, then (with
    `answer`) a worker accepting and completing every action at once (timers never fire);
    without, the run stays open at its first activation. Returns the events, the final state
    and the last input's ts_ms."""
    state: Any = None
    out: list[dict[str, Any]] = []
    inputs: deque[dict[str, Any]] = deque(
        [
            {
                "type": "StartRun",
                "run_id": run_id,
                "ts_ms": ts,
                "record_id": "c",
                "definition_id": definition_id,
                "revision": None,
                "input": {},
            }
        ]
    )
    while inputs:
        msg = inputs.popleft()
        for ev in decide(state, msg, ctx).events:
            state = evolve(state, ev)
            out.append(ev)
            if state is None or not answer:
                continue
            for m in effects(state, ev).messages:
                if m["type"] != "ActionActivation":
                    continue
                ident = {k: m[k] for k in ("node", "lineage", "attempt", "dispatch_id")}
                ts += 1
                inputs.append(
                    {
                        "type": "ActivationAccepted",
                        "run_id": run_id,
                        "ts_ms": ts,
                        "record_id": "a",
                        **ident,
                        "worker_id": "w",
                        "lease_ms": 30_000,
                    }
                )
                ts += 1
                inputs.append(
                    {
                        "type": "ActivationCompleted",
                        "run_id": run_id,
                        "ts_ms": ts,
                        "record_id": "b",
                        **ident,
                        "worker_id": "w",
                        "output": {},
                        "usage": ZERO,
                    }
                )
    return out, state, ts


def synthesize_runs(
    settings: KafkaSettings,
    definition_id: str,
    runs: int,
    tag: str = "s",
    ts0: int = 1_764_400_000_000,
    snapshots: bool = True,
) -> int:
    """Produce the run events of `runs` runs of `definition_id` (workers answer every action at
    once; timers never fire) to `<p>.run-events`, and each run's final snapshot to
    `<p>.run-state`; returns the number of events."""
    catalog = Catalog()
    for d in DEFINITIONS:
        catalog.register(d)
    ctx = EngineContext(catalog=catalog, ceilings=Ceilings(), queues=frozenset(settings.activation_queues))
    enc = CODEC.encoder("run_events")
    topic = f"{settings.topic_prefix}.run-events"
    producer = Producer(producer_config(settings, linger_ms=20))
    events = 0
    for i in range(runs):
        run_id = f"{tag}-{i}"
        events_of_run, state, ts = run_events(ctx, definition_id, run_id, ts0 + i)
        key = run_id.encode()
        for ev in events_of_run:
            value = enc(ev)
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.05)
            events += 1
        if snapshots and state is not None:
            producer.produce(f"{settings.topic_prefix}.run-state", snapshot_of(state, ts), key)
        if i % 200 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("synthesize_runs: events still unsent after 120 s")
    return events


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    runs = max(100, p["runs"] // 10) if ctx.warmup else p["runs"]
    settings = KafkaSettings(topic_prefix=ctx.prefix, partitions=p["partitions"])
    state_dir = tempfile.mkdtemp(prefix="replay-bench-")
    try:
        create_topology(settings)
        produced = synthesize_runs(settings, "noop-3", runs)
        ctx.log(f"{produced} run events of {runs} runs produced")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")},
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        }
        out: dict[str, dict[str, Any]] = {}
        for mode, extra in (("rebuild", ["--rebuild", "--state-dir", state_dir]), ("verify", ["--verify"])):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "processors.cli",
                    "replay",
                    *extra,
                    "--topic-prefix",
                    ctx.prefix,
                    "--json",
                ],
                capture_output=True,
                env=env,
                timeout=600,
                check=False,
            )
            try:
                report = orjson.loads(proc.stdout)
            except orjson.JSONDecodeError:
                out[mode] = {
                    "error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr).decode()[-1500:]}"
                }
                continue
            # rebuild: every event folded; verify: every run checked against its snapshot, no difference
            ok = (
                report["events"] == produced
                and report["undecodable"] == 0
                and (mode == "rebuild" or (report["ok"] and report["runs_checked"] == runs))
            )
            out[mode] = {
                "events": report["events"],
                "runs": runs,
                "seconds": report["seconds"],
                "events_per_s": report["events_per_s"],
                "complete": int(ok),
            }
            if not ok:
                out[mode]["error"] = f"exit {proc.returncode}: {orjson.dumps(report).decode()[:1500]}"
        return out
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        delete_topics_containing(ctx.prefix)


def run(runs: int = 4000, partitions: int = 4, rounds: int = 3, warmup: int = 1) -> Bench:
    bench = Bench(
        "replay_bench",
        params={"runs": runs, "partitions": partitions, "workflow": "noop-3", "target_events_per_s": 20_000},
        rounds=rounds,
        warmup=warmup,
    )
    bench.run(round_fn)
    s = bench.median("rebuild", "events_per_s")
    bench.ratios["rebuild_vs_target"] = {
        "value": round(s / 20_000, 3) if s else None,
        "target": 1.0,
        "met": (s >= 20_000) if s else None,
    }
    bench.save(plot=[("replay --rebuild events/s", "events_per_s")])
    return bench


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(run(a.runs, rounds=a.rounds).table(["events", "events_per_s", "complete"]))
