"""Core engine throughput: decide + evolve + effects on one core, no I/O.

Workflow: plan (action) -> search (action, map fan-out of 10) -> write (action). Each run
is driven by its start command and every receipt an executor would send (accepted +
completed per activation), exactly as the runtime loop does: decide, then evolve and
effects per event. Prints one JSON object.

    .venv/bin/python -m benchmarks.core_bench [--runs 2000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from typing import Any

import orjson

from processors.engine import Catalog, Ceilings, EngineContext, decide, dump_state, effects, evolve
from processors.engine.ids import instance_key

FANOUT = 10
DEFINITION = {
    "schema": "runfold.workflow/v1",
    "id": "bench",
    "revision": 1,
    "state": {"queries": [], "notes": [], "brief": None},
    "reducers": {"notes": "append"},
    "entry": ["plan"],
    "nodes": {
        "plan": {"kind": "action", "action": "plan", "writes": {"queries": {"from": "output"}}},
        "search": {
            "kind": "action",
            "action": "search",
            "queue": "tools",
            "map": {"from": "state", "pointer": "/queries"},
            "input": {"q": {"from": "item"}},
            "retry": {"max_attempts": 3, "backoff_ms": 100},
            "timeout_ms": 30_000,
            "writes": {"notes": {"from": "output"}},
        },
        "write": {
            "kind": "action",
            "action": "write",
            "input": {"notes": {"from": "state", "pointer": "/notes"}},
            "writes": {"brief": {"from": "output"}},
        },
    },
    "routes": {"plan": ["search"], "search": ["write"]},
    "output": {"from": "state", "pointer": "/brief"},
}


class Counter:
    inputs = 0
    events = 0
    messages = 0


def apply(state: Any, msg: dict[str, Any], ctx: EngineContext, counter: Counter) -> Any:
    decision = decide(state, msg, ctx)
    counter.inputs += 1
    for event in decision.events:
        state = evolve(state, event)
        fx = effects(state, event)
        counter.messages += len(fx.messages)
        counter.events += 1
    return state


def one_run(run_id: str, ctx: EngineContext, counter: Counter) -> Any:
    ts = 1_764_400_000_000
    state = apply(
        None,
        {
            "type": "StartRun",
            "run_id": run_id,
            "ts_ms": ts,
            "record_id": "c",
            "definition_id": "bench",
            "revision": None,
            "input": {"topic": "kafka"},
        },
        ctx,
        counter,
    )

    def finish(node: str, lineage: str, output: Any) -> None:
        nonlocal state, ts
        step = state["steps"][instance_key(node, lineage)]
        ident = {
            "node": node,
            "lineage": lineage,
            "attempt": step["attempt"],
            "dispatch_id": step["dispatch_id"],
        }
        ts += 1
        state = apply(
            state,
            {
                "type": "ActivationAccepted",
                "run_id": run_id,
                "ts_ms": ts,
                "record_id": "a",
                **ident,
                "worker_id": "w",
                "lease_ms": 30_000,
            },
            ctx,
            counter,
        )
        ts += 1
        state = apply(
            state,
            {
                "type": "ActivationCompleted",
                "run_id": run_id,
                "ts_ms": ts,
                "record_id": "b",
                **ident,
                "worker_id": "w",
                "output": output,
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost_micros": 3},
            },
            ctx,
            counter,
        )

    finish("plan", "", [f"query {i}" for i in range(FANOUT)])
    for i in range(FANOUT):
        finish("search", str(i), {"hit": i, "text": "lorem ipsum " * 4})
    finish("write", "", "the brief")
    assert state["status"] == "succeeded", state["status"]
    return state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    catalog = Catalog()
    catalog.register(DEFINITION)
    ctx = EngineContext(
        catalog=catalog, ceilings=Ceilings(), queues=frozenset({"default", "tools", "agents"})
    )
    one_run("warmup", ctx, Counter())
    counter = Counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    started = time.perf_counter()
    cpu_started = time.process_time()
    last = None
    for n in range(args.runs):
        last = one_run(f"run-{n}", ctx, counter)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started  # the machine may be shared: CPU time is the fairer clock
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    assert last is not None
    print(
        orjson.dumps(
            {
                "benchmark": "core_engine",
                "workflow": f"plan -> search[map {FANOUT}] -> write",
                "runs": args.runs,
                "seconds": round(elapsed, 3),
                "inputs": counter.inputs,
                "events": counter.events,
                "activations": counter.messages,
                "inputs_per_s": round(counter.inputs / elapsed),
                "events_per_s": round(counter.events / elapsed),
                "runs_per_s": round(args.runs / elapsed, 1),
                "cpu_seconds": round(cpu, 3),
                "events_per_cpu_s": round(counter.events / cpu),
                "inputs_per_cpu_s": round(counter.inputs / cpu),
                "state_bytes": len(dump_state(last)),
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
