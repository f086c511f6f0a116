"""Restore: time until a fresh processor instance is ready, by history size, same live set.

Each case fills fresh topics (4 partitions) with what a processor would have committed: the
events of `--live` runs of the 3-step no-op workflow left waiting for their first step (their
latest snapshot on `<p>.run-state`), and of `--finished` x multiplier runs that finished and
were purged after their retention (their events, and on `<p>.run-state` their purged-run
marker, as the cleaner leaves the topic; for the multipliers in `--uncompacted-cases` their
last snapshot too, before the marker: a topic the cleaner has not reached). The runs are produced by driving the pure
engine (replay_bench's way), not a live processor: minutes of traffic in seconds. Then a
processor is started with an empty state directory (a fresh instance: a lost disk, a new
node) and the figure is the time from its spawn to `/health` answering ready with all 4
partitions owned and none restoring, process start included; also with `restore_from_state: false` (the
whole log folded, the restore before run-state) for the cases named by `--log-cases`.

    runfold bench restore [--live 200] [--finished 1000] [--multipliers 1,8,64] [--rounds 1]
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from confluent_kafka import Producer

from benchmarks.harness import Bench, RoundContext, delete_topics_containing, spawn_log
from benchmarks.replay_bench import CODEC, run_events, snapshot_of
from benchmarks.workflow_throughput import DEFINITIONS
from processors.engine import Catalog, Ceilings, EngineContext
from schemas.run_state import purged_marker
from topology.admin import create_topology
from topology.settings import KafkaSettings, producer_config

TS0 = 1_764_400_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def synthesize(
    settings: KafkaSettings, live: int, finished: int, tag: str, compacted: bool = True
) -> dict[str, int]:
    """Produce `finished` purged runs then `live` open ones (see the module doc); returns the
    counts of events and run-state records produced. `compacted`: a purged run's marker only,
    as the cleaner leaves run-state; else its last snapshot before it (not cleaned yet)."""
    catalog = Catalog()
    for d in DEFINITIONS:
        catalog.register(d)
    ctx = EngineContext(catalog=catalog, ceilings=Ceilings(), queues=frozenset(settings.activation_queues))
    enc = CODEC.encoder("run_events")
    enc_snap = CODEC.encoder("run_state")
    events_topic = f"{settings.topic_prefix}.run-events"
    state_topic = f"{settings.topic_prefix}.run-state"
    producer = Producer(producer_config(settings, linger_ms=50))
    counts = {"events": 0, "state_records": 0}

    def produce(topic: str, value: bytes, key: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value, key)
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(finished + live):
        done = i < finished
        run_id = f"{tag}-{'f' if done else 'l'}-{i}"
        key = run_id.encode()
        events_of_run, state, ts = run_events(ctx, "noop-3", run_id, TS0 + i, answer=done)
        for ev in events_of_run:
            produce(events_topic, enc(ev), key)
        counts["events"] += len(events_of_run)
        if not (done and compacted):
            produce(state_topic, snapshot_of(state, ts), key)
            counts["state_records"] += 1
        if done:  # purged after its retention: the marker follows its last snapshot
            produce(state_topic, enc_snap(purged_marker(run_id, state["status"], ts + 1)), key)
            counts["state_records"] += 1
        if i % 500 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("restore_bench: records still unsent after 300 s")
    return counts


def _restore_s(log: Path) -> float | None:
    """From the processor's log: seconds from its partitions' assignment to the last `partition
    ready` (the restore alone, without the process start)."""
    assigned = ready = None
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        ts = (
            datetime.fromisoformat(str(rec.get("ts", "")).replace("Z", "+00:00")).timestamp()
            if rec.get("ts")
            else None
        )
        if rec.get("event") == "partitions assigned" and assigned is None:
            assigned = ts
        elif rec.get("event") == "partition ready":
            ready = ts
    return round(ready - assigned, 3) if assigned is not None and ready is not None else None


def time_to_ready(prefix: str, from_state: bool, timeout_s: float = 900.0) -> dict[str, Any]:
    """Spawn a processor with an empty state dir: seconds until /health says ready (every
    partition owned, none restoring), and of those the restore's own (`_restore_s`)."""
    state_dir = tempfile.mkdtemp(prefix="restore-bench-")
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")},
        "RUNFOLD_TOPIC_PREFIX": prefix,
        "RUNFOLD_PARTITIONS": "4",
        "RUNFOLD_RESTORE_FROM_STATE": "true" if from_state else "false",
    }
    for k in ("KAFKA_BOOTSTRAP_SERVERS", "RUNFOLD_BOOTSTRAP_SERVERS"):
        if k in os.environ:
            env[k] = os.environ[k]
    args = [
        sys.executable,
        "-m",
        "processors.runtime",
        "--instance-id",
        "restore-bench",
        "--state-dir",
        state_dir,
        "--query-port",
        str(port),
        "--log-level",
        "INFO",
    ]
    log = spawn_log("restore")
    t0 = time.monotonic()
    ready_s = None
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while time.monotonic() - t0 < timeout_s and ready_s is None:
            if proc.poll() is not None:
                raise RuntimeError(f"processor exited {proc.returncode}; log {log}")
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
                body = r.json() if r.status_code == 200 else {}
                # ready, every partition owned and none restoring (ready alone is the process)
                if body.get("ready") and len(body.get("owned", [])) == 4 and not body.get("restoring"):
                    ready_s = round(time.monotonic() - t0, 3)
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        if ready_s is None:
            raise RuntimeError(f"not ready after {timeout_s} s; log {log}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(state_dir, ignore_errors=True)
    return {"ready_s": ready_s, "restore_s": _restore_s(log), "log": str(log)}


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    out: dict[str, dict[str, Any]] = {}
    for m in p["multipliers"]:
        prefix = f"{ctx.prefix}x{m}"
        settings = KafkaSettings(topic_prefix=prefix, partitions=4)
        try:
            create_topology(settings)
            finished = max(10, p["finished"] // 10) if ctx.warmup else p["finished"] * m
            t0 = time.monotonic()
            compacted = m not in p["uncompacted_cases"]
            counts = synthesize(settings, p["live"], finished, f"h{m}", compacted)
            ctx.log(f"x{m}: {counts} in {time.monotonic() - t0:.1f} s")
            modes = [True] + ([False] if m in p["log_cases"] else [])
            for from_state in modes:
                kind = ("run-state" if compacted else "run-state uncompacted") if from_state else "whole log"
                case = f"x{m} {kind}"
                res = time_to_ready(prefix, from_state)
                out[case] = {
                    "ready_s": res["ready_s"],
                    "restore_s": res["restore_s"],
                    "events": counts["events"],
                    "state_records": counts["state_records"],
                    "live_runs": p["live"],
                    "finished_runs": finished,
                }
                ctx.log(
                    f"{case}: ready after {res['ready_s']} s, restore {res['restore_s']} s ({res['log']})"
                )
        finally:
            delete_topics_containing(prefix)
    return out


def run(
    live: int = 200,
    finished: int = 1000,
    multipliers: tuple[int, ...] = (1, 8, 64),
    log_cases: tuple[int, ...] = (1, 8),
    rounds: int = 1,
    uncompacted_cases: tuple[int, ...] = (),
    warmup: int = 0,
    name: str = "restore_bench",
) -> Bench:
    bench = Bench(
        name,
        params={
            "live": live,
            "finished": finished,
            "multipliers": list(multipliers),
            "log_cases": list(log_cases),
            "uncompacted_cases": list(uncompacted_cases),
            "workflow": "noop-3",
            "partitions": 4,
        },
        rounds=rounds,
        warmup=warmup,
    )
    bench.run(round_fn)
    lo, hi = min(multipliers), max(multipliers)
    for metric in ("ready_s", "restore_s"):
        base = bench.median(f"x{lo} run-state", metric)
        top = bench.median(f"x{hi} run-state", metric)
        if base and top:
            bench.ratios[f"x{hi}_vs_x{lo}_{metric}"] = {
                "value": round(top / base, 3),
                "target": 1.5,
                "met": top / base <= 1.5,
            }
    bench.save(
        plot=[
            ("seconds to /health ready (fresh instance)", "ready_s"),
            ("seconds from assignment to ready (restore)", "restore_s"),
        ]
    )
    return bench


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--live", type=int, default=200)
    ap.add_argument("--finished", type=int, default=1000)
    ap.add_argument("--multipliers", default="1,8,64")
    ap.add_argument("--log-cases", default="1,8")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--uncompacted-cases", default="")
    ap.add_argument("--name", default="restore_bench")
    a = ap.parse_args()
    b = run(
        a.live,
        a.finished,
        tuple(int(x) for x in a.multipliers.split(",")),
        tuple(int(x) for x in a.log_cases.split(",") if x),
        a.rounds,
        tuple(int(x) for x in a.uncompacted_cases.split(",") if x),
        name=a.name,
    )
    print(b.table(["ready_s", "restore_s"]))
