"""The local broker's footprint on a laptop: heap and settings variants, paired in one invocation.

Per round, each variant in turn on a broker of its own (fresh data dir, own ports):

    start      `local_kafka.up` to the first answered metadata request (storage format included)
    idle       broker RSS / PSS 5 s after it answers
    throughput workflow_throughput's case: `--runs` 3-step no-op runs preloaded, one processor and
               one `noop` worker (separate processes), runs/s timed by a read_committed reader
    memory     peak of the summed RSS / PSS of broker + processor + worker during the load,
               and the broker's alone
    GC         the broker's young pauses during the round (its gc.log): count and median ms

    .venv/bin/python -m benchmarks.broker_footprint [--runs 3000] [--rounds 2] [--port-base 19320]

Benchmarks measure, never assert. Writes benchmarks/results/broker_footprint.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import host_info, results_dir
from benchmarks.peers_bench import Tree
from topology import local_kafka

MIB = 2**20
VARIANTS: dict[str, dict[str, Any]] = {
    "1g-young512m": {"heap": "1g", "young": "512m", "cleaner_dedupe_bytes": 128 * MIB, "malloc_arenas": 0},
    "512m-young256m": {"heap": "512m", "young": "256m", "cleaner_dedupe_bytes": 16 * MIB, "malloc_arenas": 2},
    "384m-young192m": {"heap": "384m", "young": "192m", "cleaner_dedupe_bytes": 16 * MIB, "malloc_arenas": 2},
}
_PAUSE = re.compile(r"Pause Young.* ([0-9.]+)ms")


def _mem(pid: int) -> tuple[float, float]:
    import psutil

    m = psutil.Process(pid).memory_full_info()
    return round(m.rss / MIB, 1), round(getattr(m, "pss", m.rss) / MIB, 1)


def young_pauses(gc_log: Path) -> list[float]:
    try:
        text = gc_log.read_text(errors="replace")
    except OSError:
        return []
    return [float(m.group(1)) for m in _PAUSE.finditer(text)]


def one(name: str, knobs: dict[str, Any], port: int, runs: int) -> dict[str, Any]:
    from benchmarks.workflow_throughput import EventWatch, Rig

    data = Path(tempfile.mkdtemp(prefix=f"footprint-{name}-"))
    cfg = dataclasses.replace(
        local_kafka.LocalKafkaConfig.from_env(port=port, controller_port=port + 1, data_dir=data), **knobs
    )
    saved = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    try:
        t0 = time.monotonic()
        status = local_kafka.up(cfg)
        out: dict[str, Any] = {"start_s": round(time.monotonic() - t0, 2)}
        assert status.pid is not None
        time.sleep(5)
        out["idle_broker_rss_mib"], out["idle_broker_pss_mib"] = _mem(status.pid)
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = cfg.bootstrap
        with Rig(f"fp{uuid.uuid4().hex[:6]}", partitions=4) as rig:
            tree = Tree()
            tree.add("broker", status.pid)
            tree.add("processor", rig.procs["p0"].pid)
            tree.add("worker", rig.procs["worker"].pid)
            tree.start()
            watch = EventWatch(rig.settings)
            try:
                gen = rig.loadgen("noop-3", runs)
                watch.until_terminal(runs, 300, rig.alive)
                gen.wait(30)
                span = max(watch.last_terminal_at - (watch.first_at or time.time()), 1e-6)
                out["runs_per_s"] = round(runs / span, 1)
                out["broker_rss_after_mib"], out["broker_pss_after_mib"] = _mem(status.pid)
            finally:
                watch.close()
                time.sleep(1.1)  # one more memory sample after the load
                tree.stop()
            mem = tree.memory()
            out["tree_peak_rss_mib"] = mem["peak_rss_mib"]
            out["tree_peak_pss_mib"] = mem["peak_pss_mib"]
            out["broker_peak_pss_mib"] = mem["peak_pss_by_role_mib"].get("broker")
        pauses = young_pauses(data / "gc.log")
        out["young_pauses"] = len(pauses)
        out["young_pause_median_ms"] = round(statistics.median(pauses), 1) if pauses else 0.0
        out["young_pause_max_ms"] = round(max(pauses), 1) if pauses else 0.0
        return out
    finally:
        local_kafka.down(cfg)
        shutil.rmtree(data, ignore_errors=True)
        if saved is None:
            os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        else:
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = saved


def run(runs: int, rounds: int, port_base: int, variants: list[str]) -> dict[str, Any]:
    raw: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    host = host_info()
    for r in range(rounds):
        rnd: dict[str, Any] = {}
        # alternate the order between rounds: neither variant always runs first on a cold host
        order = variants if r % 2 == 0 else list(reversed(variants))
        for name in order:
            i = variants.index(name)
            try:
                rnd[name] = one(name, VARIANTS[name], port_base + 2 * i, runs)
            except Exception as e:
                rnd[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"[footprint round {r + 1}] {name} {orjson.dumps(rnd[name]).decode()}", flush=True)
        raw.append(rnd)
    summary: dict[str, dict[str, float]] = {}
    for name in variants:
        rows = [rnd[name] for rnd in raw if "error" not in rnd.get(name, {"error": 1})]
        keys = {k for row in rows for k, v in row.items() if isinstance(v, int | float)}
        summary[name] = {
            k: round(statistics.median(row[k] for row in rows if k in row), 2) for k in sorted(keys)
        }
    result = {
        "bench": "broker_footprint",
        "started": started,
        "host": host,
        "runs": runs,
        "rounds": rounds,
        "variants": {n: VARIANTS[n] for n in variants},
        "summary": summary,
        "raw_rounds": raw,
    }
    (results_dir() / "broker_footprint.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port-base", type=int, default=19320)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    r = run(a.runs, a.rounds, a.port_base, a.variants.split(","))
    print(orjson.dumps(r["summary"], option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
