"""The run index: ingest events/s into SQLite, and search latency over 100,000 runs.

Measures, never asserts (the targets in issue 26: >= 20,000 events/s; search p99 < 50 ms).

1. kafka ingest: `<p>.run-events` filled with the events of `--runs` runs of a 3-step no-op
   workflow, produced by driving the pure engine (benchmarks/replay_bench.synthesize_runs: the
   events a processor commits), then `Indexer.run(follow=False)` reads them read_committed into
   a fresh SQLite file: events/s from the first poll to the last commit, with each run's events
   kept (the default) and without (`--no-events`).
2. store ingest: the same events, already decoded, through the projection and the SQLite
   writes alone (what the database side costs without Kafka and Avro).
3. search: an index of `--search-runs` runs (labels team=t0..t19 and env=prod|dev, statuses
   succeeded / failed / running / waiting mixed) built through the same projection and writes;
   then p50/p99 of `--queries` searches for status + label (first page of 50, and the counts by
   status), and of run-id lookups.

    .venv/bin/python -m benchmarks.index_ingest [--runs 4000] [--search-runs 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

import benchmarks.replay_bench as replay_bench
from benchmarks.harness import bootstrap, delete_topics_containing, percentile, unique_prefix
from benchmarks.replay_bench import synthesize_runs
from processors.index import Indexer, RunFilter, SQLiteIndex
from processors.index.projection import RunRow, accept, apply
from processors.index.settings import open_index
from processors.index.store import Batch
from schemas import Codec
from topology.admin import create_topology
from topology.settings import KafkaSettings


def kafka_ingest(runs: int, store_events: bool, postgres: str | None = None) -> dict[str, Any]:
    prefix = unique_prefix("idx")
    settings = KafkaSettings(bootstrap_servers=bootstrap(), topic_prefix=prefix, partitions=4)
    create_topology(settings)
    try:
        events = synthesize_runs(settings, "noop-3", runs, snapshots=False)
        with tempfile.TemporaryDirectory() as tmp:
            index = open_index(postgres or Path(tmp) / "index.sqlite")
            index.reset()
            indexer = Indexer(settings, index, store_events=store_events)
            report = indexer.run(follow=False, stop=threading.Event())
            size = 0 if postgres else (Path(tmp) / "index.sqlite").stat().st_size
            index.close()
        d = report.to_dict()
        return {
            "runs": runs,
            "events_produced": events,
            "events_indexed": d["events"],
            "seconds": d["seconds"],
            "events_per_s": d["events_per_s"],
            "batches": d["batches"],
            "store_events": store_events,
            "database": "postgresql" if postgres else "sqlite",
            "db_mb": round(size / 1e6, 1),
        }
    finally:
        delete_topics_containing(prefix)


def _template(codec: Codec) -> list[dict[str, Any]]:
    """One noop-3 run's events, as decoded from the topic: synthesize_runs's engine-driven run,
    its producer swapped for a list."""
    captured: list[bytes] = []

    class _Capture:
        def produce(self, topic: str, value: bytes, key: bytes) -> None:
            if topic.endswith(".run-events"):
                captured.append(value)

        def poll(self, _t: float) -> None:
            return None

        def flush(self, _t: float) -> int:
            return 0

    real = replay_bench.__dict__["Producer"]
    replay_bench.__dict__["Producer"] = lambda _cfg: _Capture()
    try:
        synthesize_runs(KafkaSettings(topic_prefix="capture"), "noop-3", 1, snapshots=False)
    finally:
        replay_bench.__dict__["Producer"] = real
    dec = codec.decoder("run_events")
    return [dec(v) for v in captured]


def _variant(template: list[dict[str, Any]], i: int, rng: random.Random) -> list[dict[str, Any]]:
    rid = f"run-{i:07d}"
    shift = i * 1000
    labels = {"team": f"t{i % 20}", "env": "prod" if i % 3 else "dev"}
    out = []
    for ev in template:
        ev = {**ev, "run_id": rid, "ts_ms": ev["ts_ms"] + shift}
        if ev["type"] == "RunAccepted":
            ev["labels"] = labels
        out.append(ev)
    roll = rng.random()
    if roll < 0.15:  # still running: cut after the second step's schedule
        out = [e for e in out if e["sequence"] <= 8]
    elif roll < 0.25:  # failed
        last = out[-1]
        out[-1] = {
            **last,
            "type": "RunFailed",
            "failure": {
                "code": "ExecutionFailed",
                "message": "boom",
                "retryable": False,
                "node": "c",
                "lineage": "",
            },
        }
    return out


def store_ingest(template: list[dict[str, Any]], runs: int, path: Path, store_events: bool) -> dict[str, Any]:
    """Fold and write `runs` runs through the projection and SQLite writes, batches of 5,000 events."""
    rng = random.Random(7)
    index = SQLiteIndex(path)
    batch, rows, n_events, pending = Batch(), {}, 0, 0
    started = time.perf_counter()
    offset = 0
    for i in range(runs):
        run: RunRow | None = None
        for ev in _variant(template, i, rng):
            if ev["type"] == "RunAccepted":
                run = accept(ev, 0)
                batch.new_runs.append(run)
            else:
                assert run is not None
                apply(run, ev)
            if store_events:
                batch.events.append(
                    (ev["run_id"], ev["sequence"], ev["type"], ev["ts_ms"], ev.get("node"), ev.get("lineage"),
                     ev.get("attempt"), orjson.dumps(ev))
                )  # fmt: skip
            offset += 1
            pending += 1
            n_events += 1
        assert run is not None
        rows[run.run_id] = run
        if pending >= 5_000:
            batch.runs, batch.offsets = list(rows.values()), {("bench", 0): offset}
            index.write(batch)
            batch, rows, pending = Batch(), {}, 0
    batch.runs, batch.offsets = list(rows.values()), {("bench", 0): offset}
    index.write(batch)
    seconds = time.perf_counter() - started
    index.close()
    return {
        "runs": runs,
        "events": n_events,
        "seconds": round(seconds, 3),
        "events_per_s": round(n_events / seconds, 1),
        "store_events": store_events,
        "db_mb": round(path.stat().st_size / 1e6, 1),
    }


def _lat(values: list[float]) -> dict[str, float]:
    values.sort()
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 3),
        "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        "max_ms": round(values[-1] * 1000, 3),
    }


def search(path: Path, runs: int, queries: int) -> dict[str, Any]:
    index = SQLiteIndex(path, readonly=True)
    rng = random.Random(11)
    statuses = ("succeeded", "failed", "running")
    filtered: list[float] = []
    counted: list[float] = []
    lookups: list[float] = []
    hits = 0
    for _ in range(queries):
        f = RunFilter(status=(rng.choice(statuses),), labels=(("team", f"t{rng.randrange(20)}"),))
        t0 = time.perf_counter()
        page = index.search(f, limit=50)
        filtered.append(time.perf_counter() - t0)
        hits += len(page.runs)
        t0 = time.perf_counter()
        index.counts(f)
        counted.append(time.perf_counter() - t0)
        rid = f"run-{rng.randrange(runs):07d}"
        t0 = time.perf_counter()
        row = index.get(rid)
        lookups.append(time.perf_counter() - t0)
        assert row is not None
    return {
        "runs": runs,
        "queries": queries,
        "status_label_first_page": {**_lat(filtered), "rows_per_page": round(hits / queries, 1)},
        "status_label_counts": _lat(counted),
        "run_id_lookup": _lat(lookups),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4000, help="runs through Kafka (15 events each)")
    ap.add_argument("--search-runs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--skip-kafka", action="store_true", help="no broker: store ingest and search only")
    ap.add_argument(
        "--postgres", help="also ingest into this PostgreSQL (a postgresql:// URL; its tables are reset)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    if not args.skip_kafka:
        out["kafka_ingest"] = kafka_ingest(args.runs, store_events=True)
        out["kafka_ingest_no_events"] = kafka_ingest(args.runs, store_events=False)
        if args.postgres:
            out["kafka_ingest_postgres"] = kafka_ingest(args.runs, store_events=True, postgres=args.postgres)
    template = _template(Codec.default())
    with tempfile.TemporaryDirectory() as tmp:
        out["store_ingest"] = store_ingest(template, args.runs, Path(tmp) / "s.sqlite", store_events=True)
        big = Path(tmp) / "big.sqlite"
        out["search_index_build"] = store_ingest(template, args.search_runs, big, store_events=False)
        out["search"] = search(big, args.search_runs, args.queries)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
