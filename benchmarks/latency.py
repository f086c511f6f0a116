"""Start → terminal latency (p50/p95/p99) at 25/50/80% of the max load, and per commit interval.

The same rig as workflow_throughput.py (processor, noop worker, load-generator process; one
processor). A run's latency is the wall time between the load generator stamping its StartRun
(the time rides in the run id) and a read_committed reader receiving its terminal event, i.e.
what a client waiting for the committed outcome sees.

Load is given as a fraction of the max from workflow_throughput (3-step runs/s; taken from
its last saved result, or --max-runs-per-s). A 1-step run is about half the work of a
3-step one, so its arrival rate is scaled by the measured ratio of run events per run
(same fraction of the processor's event capacity for both workflows).

Cases: `{1,3}-step @ {25,50,80}%` with the default commit interval (50 ms), then
`3-step @ 50% commit {10,50,200} ms` (one processor restart per commit interval).

    runfold bench latency [--seconds 10] [--max-runs-per-s R] [--rounds 3]
    python -m benchmarks.latency --loads 0.25 --workflows noop-1 --intervals 50 --rounds 1   # one case
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Bench, RoundContext, error_text, percentile
from benchmarks.workflow_throughput import EventWatch, Rig, max_runs_per_s, sent_ms_of

# run events per run for the two workflows (RunAccepted, RunStarted, 4 per step, RunSucceeded,
# ...): only used to scale the 1-step arrival rate; the report gives the measured values.
_EVENTS_PER_RUN = {"noop-1": 7.0, "noop-3": 15.0}
_WARMUP_RUNS = 1


def drive(rig: Rig, definition: str, rate: float, seconds: float, tag: str) -> dict[str, Any]:
    runs = max(5, int(rate * seconds))
    watch = EventWatch(rig.settings, offset_reset="latest")
    watch.wait_assigned()
    try:
        # Warm-up, not timed: one run through the whole pipeline first (a processor whose group is
        # stable may still be restoring its stores: the first runs of a fresh rig waited ~1 s), and
        # the load generator sends one more before its timed runs (a new producer's first send
        # waits ~0.5 s for its producer id).
        rig.loadgen(definition, 0, 0.0, f"{tag}pre", warmup=1).wait(60)
        watch.until_terminal(1, 60, rig.alive)
        gen = rig.loadgen(definition, runs, rate, tag, warmup=_WARMUP_RUNS)
        watch.until_terminal(runs + 1 + _WARMUP_RUNS, seconds + 60, rig.alive)
        gen.wait(30)
    finally:
        watch.close()
    lat = sorted(
        (done * 1000 - sent_ms_of(r)) for r, done in watch.terminal.items() if r.startswith(tag + "-")
    )
    return {
        "rate_runs_per_s": round(rate, 1),
        "runs": len(lat),
        "events_per_run": round(watch.events / max(runs + 1 + _WARMUP_RUNS, 1), 2),
        "p50_ms": round(percentile(lat, 0.50), 1),
        "p95_ms": round(percentile(lat, 0.95), 1),
        "p99_ms": round(percentile(lat, 0.99), 1),
        "max_ms": round(lat[-1], 1) if lat else None,
    }


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    seconds = 2.0 if ctx.warmup else p["seconds"]
    top = p["max_runs_per_s"]
    out: dict[str, dict[str, Any]] = {}
    for interval in p["commit_intervals_ms"]:
        rig = Rig(f"{ctx.prefix}c{interval}", partitions=p["partitions"], commit_interval_ms=interval)
        try:
            rig.start()
            if ctx.warmup:
                drive(rig, "noop-3", top * 0.25, seconds, "w")
                continue
            loads = p["loads"] if interval == p["default_interval_ms"] else [0.5]
            workflows = p["workflows"] if interval == p["default_interval_ms"] else ["noop-3"]
            for wf in workflows:
                for frac in loads:
                    rate = frac * top * _EVENTS_PER_RUN["noop-3"] / _EVENTS_PER_RUN[wf]
                    steps = wf.split("-")[1]
                    case = (
                        f"{steps}-step @ {int(frac * 100)}%"
                        if interval == p["default_interval_ms"]
                        else f"{steps}-step @ {int(frac * 100)}% commit {interval} ms"
                    )
                    try:
                        out[case] = drive(rig, wf, rate, seconds, f"l{steps}x{int(frac * 100)}")
                    except Exception as e:
                        out[case] = {"error": error_text(e)}
                    if interval == p["default_interval_ms"] and frac == 0.5 and wf == "noop-3":
                        out[f"3-step @ 50% commit {interval} ms"] = out[case]
        except Exception as e:
            out[f"commit {interval} ms"] = {"error": error_text(e)}
        finally:
            rig.stop()
    return out


def run(
    seconds: float = 10.0,
    max_rate: float | None = None,
    rounds: int = 3,
    warmup: int = 1,
    partitions: int = 4,
    commit_intervals_ms: tuple[int, ...] = (10, 50, 200),
    loads: tuple[float, ...] = (0.25, 0.5, 0.8),
    workflows: tuple[str, ...] = ("noop-1", "noop-3"),
) -> Bench:
    top = max_rate or max_runs_per_s()
    if top is None:
        raise SystemExit(
            "no max load known: run `runfold bench workflow-throughput` first, or pass --max-runs-per-s"
        )
    default = 50
    intervals = sorted(set(commit_intervals_ms) | {default}, key=lambda x: (x != default, x))
    bench = Bench(
        "latency",
        params={
            "seconds": seconds,
            "max_runs_per_s": top,
            "loads": list(loads),
            "workflows": list(workflows),
            "commit_intervals_ms": intervals,
            "default_interval_ms": default,
            "partitions": partitions,
        },
        rounds=rounds,
        warmup=warmup,
    )
    bench.notes.append(
        "latency = StartRun stamped by the load generator -> terminal event read "
        "read_committed by the harness; 1 processor, 1 noop worker"
    )
    bench.run(round_fn)
    bench.save(plot=[("p50 ms", "p50_ms"), ("p95 ms", "p95_ms"), ("p99 ms", "p99_ms")])
    return bench


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-runs-per-s", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--loads", default="0.25,0.5,0.8", help="fractions of the max load, comma-separated")
    ap.add_argument("--workflows", default="noop-1,noop-3")
    ap.add_argument("--intervals", default="10,50,200", help="commit intervals (ms); 50 is always run")
    a = ap.parse_args()
    b = run(
        a.seconds,
        a.max_runs_per_s,
        a.rounds,
        a.warmup,
        commit_intervals_ms=tuple(int(x) for x in a.intervals.split(",")),
        loads=tuple(float(x) for x in a.loads.split(",")),
        workflows=tuple(a.workflows.split(",")),
    )
    print(b.table(["rate_runs_per_s", "p50_ms", "p95_ms", "p99_ms"]))
