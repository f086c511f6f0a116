"""Cost of the processor's due-timer check with many pending timers (store level, no broker).

Fills one partition store with `--pending` timers due in the future, then measures:
  idle_check   the per-iteration "anything due?" check when nothing is due (O(1): next_due bound)
  scan_due     taking `--due` due timers out of the pending ones (cost ∝ due timers)
  fire_commit  writing the deletions of those fired timers (one WriteBatch) + re-seeking the bound
  after_churn  the scan again after 10 rounds of firing (tombstones of fired timers in front)

    .venv/bin/python benchmarks/timer_bench.py [--pending 10000] [--due 100]

Prints one JSON object (microseconds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, timer_ref_key


def _timer(i: int, due: int) -> tuple[str, dict[str, object], bytes]:
    run_id = f"run-{i:06d}"
    body = {
        "type": "TimerFired",
        "run_id": run_id,
        "timer_id": f"sleep:{i:032x}",
        "timer_kind": "sleep",
        "due_ms": due,
        "node": "s",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": f"{i:032x}",
    }
    return run_id, body, orjson.dumps(body)


def _us(seconds: float, n: int = 1) -> float:
    return round(seconds / n * 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--due", type=int, default=100)
    args = ap.parse_args()
    store = PartitionStore(Path(tempfile.mkdtemp()) / "p0", 0)
    base = 1_000_000
    ov = PartitionOverlay(store)
    for i in range(args.pending):
        run_id, body, raw = _timer(i, base + 1_000 + i)  # all in the future of `base`
        ov.set_timer(run_id, body, raw)
    t0 = time.perf_counter()
    ov.write(None)
    fill = time.perf_counter() - t0

    reps = 10_000
    t0 = time.perf_counter()
    for _ in range(reps):
        store.due_timers(base, 1_000)
    idle = time.perf_counter() - t0

    results = []
    now = base + 1_000
    for _round in range(10):
        now += args.due
        t0 = time.perf_counter()
        due = store.due_timers(now - 1, 10_000)
        scan = time.perf_counter() - t0
        fire = PartitionOverlay(store)
        for _tkey, raw in due:
            body = orjson.loads(raw)
            assert fire.timer_pending(timer_ref_key(body["run_id"], body["timer_id"]), _tkey)
            fire.clear_timer(body["run_id"], body["timer_id"])
        t0 = time.perf_counter()
        fire.write(None)
        commit = time.perf_counter() - t0
        results.append((len(due), scan, commit))
    first, last = results[0], results[-1]
    t0 = time.perf_counter()
    for _ in range(reps):
        store.due_timers(base, 1_000)
    idle_after = time.perf_counter() - t0
    print(
        orjson.dumps(
            {
                "bench": "timers",
                "pending": args.pending,
                "due_per_round": args.due,
                "fill_write_batch_ms": round(fill * 1000, 1),
                "idle_check_us": _us(idle, reps),
                "scan_due_us": _us(first[1]),
                "scan_due_per_timer_us": _us(first[1], first[0]),
                "fire_commit_us": _us(first[2]),
                "after_churn_scan_due_us": _us(last[1]),
                "after_churn_fire_commit_us": _us(last[2]),
                "idle_check_after_churn_us": _us(idle_after, reps),
                "pending_left": store.pending_timers(),
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    )
    store.close()


if __name__ == "__main__":
    main()
