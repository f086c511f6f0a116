"""Run every benchmark in order (the passthrough limit is a case of keyed_fold) and print one table of headline figures (`runfold bench all`).

    --quick   smoke sizes: 1 round, no warm-up, small workloads (a few minutes in all)

Order matters: latency uses the max load workflow_throughput just measured.
Results: benchmarks/results/<name>.json + .png, and summary.json with the table below.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks.harness import Bench, error_text, results_dir

# (name, headline metric per case, unit)
HEADLINES = {
    "keyed_fold": ("records_per_s", "records/s"),
    "workflow_throughput": ("runs_per_s", "runs/s"),
    "latency": ("p99_ms", "p99 ms"),
    "replay_bench": ("events_per_s", "events/s"),
    "memory": ("rss_mib", "RSS MiB"),
}


def plan(quick: bool, rounds: int | None) -> list[tuple[str, Callable[[], Bench]]]:
    from benchmarks import keyed_fold, latency, memory, replay_bench, workflow_throughput

    r = rounds if rounds is not None else (1 if quick else 3)
    w = 0 if quick else 1
    if quick:
        return [
            (
                "keyed_fold",
                lambda: keyed_fold.run(records=20_000, rounds=r, warmup=w, peer_records={"faust": 2_000}),
            ),
            ("workflow_throughput", lambda: workflow_throughput.run(runs=500, rounds=r, warmup=w)),
            ("latency", lambda: latency.run(seconds=3, rounds=r, warmup=w, commit_intervals_ms=(10, 200))),
            ("replay_bench", lambda: replay_bench.run(runs=1000, rounds=r, warmup=w)),
            ("memory", lambda: memory.run(runs=5_000, timers=1_000, rounds=1, warmup=0)),
        ]
    return [
        ("keyed_fold", lambda: keyed_fold.run(rounds=r, warmup=w, peer_records={"faust": 20_000})),
        ("workflow_throughput", lambda: workflow_throughput.run(rounds=r, warmup=w)),
        ("latency", lambda: latency.run(rounds=r, warmup=w)),
        ("replay_bench", lambda: replay_bench.run(rounds=r, warmup=w)),
        ("memory", lambda: memory.run(rounds=1, warmup=0)),
    ]


def run(quick: bool = False, rounds: int | None = None, only: list[str] | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "quick": quick,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "benchmarks": {},
    }
    for name, fn in plan(quick, rounds):
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            bench = fn()
            metric, unit = HEADLINES[name]
            summary["benchmarks"][name] = {
                "seconds": round(time.time() - t0, 1),
                "unit": unit,
                "medians": {c: s[metric].median for c, s in bench.summary.items() if metric in s},
                "ratios": {k: v.get("value") for k, v in bench.ratios.items()},
                "errors": bench.errors,
            }
        except Exception as e:
            summary["benchmarks"][name] = {"error": error_text(e), "seconds": round(time.time() - t0, 1)}
        print(f"== {name}: {orjson.dumps(summary['benchmarks'][name]).decode()}", flush=True)
    (results_dir() / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary
