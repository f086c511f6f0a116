"""Processor memory: RSS (psutil) with 100,000 completed runs in its store, then with 10,000
more runs waiting on long sleep timers.

Per round, on a fresh prefix:
1. the events and snapshots of N completed 1-step runs are produced to `<p>.run-events`
   (driven through the pure engine, see replay_bench.synthesize_runs);
2. a processor process starts (with a noop worker) and restores its stores from that log —
   the same fold the live path leaves behind — then 200 live 3-step runs go through it, so
   the loop, the caches and the producer are warm; RSS is sampled (peak of 5 samples, 1 s apart);
3. W StartRun commands of `sleep-long` (one 24 h sleep node) are sent; once every one is
   waiting on its timer (the processor's group has consumed every command), RSS again.

    runfold bench memory [--runs 100000] [--timers 10000] [--rounds 1]
"""

from __future__ import annotations

import time
from typing import Any

import psutil
from confluent_kafka import Consumer, TopicPartition

from benchmarks.harness import Bench, RoundContext, error_text
from benchmarks.replay_bench import synthesize_runs
from benchmarks.workflow_throughput import EventWatch, Rig
from topology.settings import consumer_config

MIB = 1024 * 1024
TARGET_MIB = 300


def rss_mib(pid: int, samples: int = 5, every: float = 1.0) -> float:
    peak = 0
    proc = psutil.Process(pid)
    for i in range(samples):
        peak = max(peak, proc.memory_info().rss)
        if i + 1 < samples:
            time.sleep(every)
    return round(peak / MIB, 1)


def store_mib(rig: Rig) -> float:
    total = sum(f.stat().st_size for f in rig.state_dir.rglob("*") if f.is_file())
    return round(total / MIB, 1)


def wait_consumed(rig: Rig, timeout: float) -> None:
    """Until the processor group's committed offsets on `<p>.commands` reach the log end."""
    s = rig.settings
    c = Consumer(consumer_config(s, f"{s.topic_prefix}-processor"))
    topic = f"{s.topic_prefix}.commands"
    tps = [TopicPartition(topic, p) for p in range(s.partitions)]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            committed = c.committed(tps, timeout=10)
            ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
            if all(tp.offset >= end for tp, end in zip(committed, ends, strict=True)):
                return
            if (dead := rig.alive()) is not None:
                raise RuntimeError(dead)
            time.sleep(0.5)
    finally:
        c.close()
    raise TimeoutError(f"the processor did not consume every command in {timeout:.0f} s")


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    runs = max(1000, p["runs"] // 20) if ctx.warmup else p["runs"]
    timers = max(200, p["timers"] // 20) if ctx.warmup else p["timers"]
    out: dict[str, dict[str, Any]] = {}
    rig = Rig(ctx.prefix, partitions=p["partitions"])
    try:
        from topology.admin import create_topology

        create_topology(rig.settings)
        t0 = time.perf_counter()
        # finished a moment ago, so that they stay in the store: the processor purges a run
        # `finished_retention_ms` (7 days) after it finished
        events = synthesize_runs(rig.settings, "noop-1", runs, tag="done", ts0=int(time.time() * 1000) - runs)
        ctx.log(f"{runs} completed runs ({events} events) produced in {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        rig.start(timeout=300)
        watch = EventWatch(rig.settings, offset_reset="latest")
        watch.wait_assigned()
        rig.loadgen("noop-3", 200, 0, "warm").wait(60)
        watch.until_terminal(200, 600, rig.alive)  # restored partitions only take input when ready
        watch.close()
        pid = rig.procs["p0"].pid
        out[f"{runs // 1000}k completed runs"] = {
            "rss_mib": rss_mib(pid),
            "store_mib": store_mib(rig),
            "runs": runs,
            "restore_and_warm_s": round(time.perf_counter() - t0, 1),
        }
        rig.loadgen("sleep-long", timers, 0, "sleep").wait(120)
        wait_consumed(rig, 600)
        out[f"+{timers // 1000}k waiting on timers"] = {
            "rss_mib": rss_mib(pid),
            "store_mib": store_mib(rig),
            "timers": timers,
        }
    except Exception as e:
        out["memory"] = {"error": error_text(e)}
    finally:
        rig.stop()
    return out


def run(
    runs: int = 100_000, timers: int = 10_000, partitions: int = 4, rounds: int = 1, warmup: int = 0
) -> Bench:
    bench = Bench(
        "memory",
        params={"runs": runs, "timers": timers, "partitions": partitions, "target_rss_mib": TARGET_MIB},
        rounds=rounds,
        warmup=warmup,
    )
    bench.notes.append(
        "RSS of the processor process (psutil), peak of 5 samples 1 s apart; "
        "store_mib = RocksDB files on disk"
    )
    bench.run(round_fn)
    worst = max((s["rss_mib"].max for s in bench.summary.values() if "rss_mib" in s), default=None)
    bench.ratios["max_rss_vs_target"] = {
        "value": worst,
        "target": TARGET_MIB,
        "met": (worst < TARGET_MIB) if worst is not None else None,
    }
    bench.save(plot=[("processor RSS MiB", "rss_mib"), ("store on disk MiB", "store_mib")])
    return bench


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--timers", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    print(run(a.runs, a.timers, rounds=a.rounds).table(["rss_mib", "store_mib"]))
