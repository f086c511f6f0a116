"""The web UI: time to render a run's page for a run of ~500 events (measures, never asserts).

A run of a definition whose one node maps over 160 items (each item: StepScheduled,
StepStarted, StepSucceeded) is driven through the pure engine (decide / evolve / effects, the
receipts a worker would send), folded into an SQLite index through the index's projection and
writes, then `GET /runs/<id>` (the whole page: graph data, timeline, 500 events with their JSON,
state) and `GET /runs/<id>/fragment` (what a live update re-fetches) are timed in-process
through the ASGI app (httpx's ASGI transport: no sockets).

    .venv/bin/python -m benchmarks.index_ui [--items 160] [--requests 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.harness import percentile
from processors.engine import Catalog, Ceilings, EngineContext, decide, effects, evolve
from processors.index import SQLiteIndex
from processors.index.projection import accept, apply
from processors.index.store import Batch
from processors.ui import UiConfig, create_app
from topology.settings import KafkaSettings

ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


def mapped(items: int) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": "fan",
        "revision": 1,
        "state": {"items": list(range(items)), "out": []},
        "entry": ["each"],
        "nodes": {
            "each": {
                "kind": "action",
                "action": "noop",
                "map": {"from": "state", "pointer": "/items"},
                "input": {"i": {"from": "item"}},
                "writes": {"out": {"from": "output"}},
            },
            "done": {"kind": "action", "action": "noop"},
        },
        "routes": {"each": ["done"]},
        "budgets": {"max_steps": 1000, "max_concurrency": 256},
    }


def run_events(items: int) -> list[dict[str, Any]]:
    catalog = Catalog()
    catalog.register(mapped(items))
    ctx = EngineContext(catalog=catalog, ceilings=Ceilings(), queues=frozenset({"default", "agents"}))
    rid, ts = "big-run", 1_764_400_000_000
    inputs: deque[dict[str, Any]] = deque(
        [{"type": "StartRun", "run_id": rid, "ts_ms": ts, "record_id": "c", "definition_id": "fan",
          "revision": None, "input": {}}]
    )  # fmt: skip
    state: Any = None
    out: list[dict[str, Any]] = []
    while inputs:
        for ev in decide(state, inputs.popleft(), ctx).events:
            state = evolve(state, ev)
            out.append(orjson.loads(orjson.dumps(ev)))
            for m in effects(state, ev).messages:
                if m["type"] != "ActionActivation":
                    continue
                ident = {k: m[k] for k in ("node", "lineage", "attempt", "dispatch_id")}
                ts += 1
                inputs.append({"type": "ActivationAccepted", "run_id": rid, "ts_ms": ts, "record_id": "a",
                               **ident, "worker_id": "w", "lease_ms": 30_000})  # fmt: skip
                ts += 1
                inputs.append({"type": "ActivationCompleted", "run_id": rid, "ts_ms": ts, "record_id": "b",
                               **ident, "worker_id": "w", "output": {"ok": True}, "usage": ZERO})  # fmt: skip
    return out


def build(path: Path, events: list[dict[str, Any]]) -> None:
    index = SQLiteIndex(path)
    run = accept(events[0])
    for ev in events[1:]:
        apply(run, ev)
    rows = [
        (e["run_id"], e["sequence"], e["type"], e["ts_ms"], e.get("node"), e.get("lineage"), e.get("attempt"),
         orjson.dumps(e))
        for e in events
    ]  # fmt: skip
    index.write(Batch(runs=[run], new_runs=[run], events=rows, offsets={("bench", 0): len(events)}))
    index.close()


async def timed(app: Any, path: str, n: int) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        first = time.perf_counter()
        response = await client.get(path)
        cold = time.perf_counter() - first
        assert response.status_code == 200, response.text[:500]
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = await client.get(path)
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200
    times.sort()
    return {
        "first_ms": round(cold * 1000, 1),
        "p50_ms": round(percentile(times, 0.5) * 1000, 1),
        "p99_ms": round(percentile(times, 0.99) * 1000, 1),
        "bytes": len(response.content),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=160)
    ap.add_argument("--requests", type=int, default=50)
    args = ap.parse_args()
    events = run_events(args.items)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ui.sqlite"
        build(db, events)
        app = create_app(UiConfig(index_path=db, settings=KafkaSettings()))
        out = {
            "events": len(events),
            "page": asyncio.run(timed(app, "/runs/big-run", args.requests)),
            "fragment": asyncio.run(timed(app, "/runs/big-run/fragment", args.requests)),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
