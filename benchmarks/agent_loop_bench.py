"""Agent loops (issue 25): what the loop costs on top of the model, and how big its state grows.

Two measures, never asserts:

1. `overhead` (a real broker, one processor process, one worker process): runs of an agent loop on
   the local provider (no network, microseconds a call) whose model asks for one `echo` tool call
   per turn for `--turns` turns, then answers. A read_committed reader notes when each turn's
   StepScheduled arrives; a turn's time is the gap to the next turn's. With a model that takes no
   time, that gap is the loop's own overhead per turn: two activation round trips (the turn, then
   its tool call), each through the activation topic, a worker, the receipt topic and a processor
   transaction. p50/p99 over every turn of every run.
2. `state` (the pure engine, no broker): one run of 8 turns with 20 tool calls of 1 KB results in
   all (turns 1-7 ask for 3, 3, 3, 3, 3, 3, 2 calls, turn 8 answers): the run state's bytes after
   each turn, and the bytes of the last turn's activation (its transcript).

    .venv/bin/python -m benchmarks.agent_loop_bench [--runs 20] [--turns 8] [--skip-broker]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import orjson

from benchmarks.harness import percentile
from benchmarks.workflow_throughput import CODEC, CommittedEvents, Rig, _env
from processors.client import RunClient
from processors.engine import Catalog, Ceilings, EngineContext, decide, dump_state, effects, evolve
from processors.engine.ids import dispatch_id
from topology.settings import KafkaSettings

TOOL_SCHEMA = {"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}


def definition(definition_id: str, turns: int) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": definition_id,
        "revision": 1,
        "state": {"out": None},
        "entry": ["loop"],
        "nodes": {
            "loop": {
                "kind": "agent",
                "agent": "bench",
                "model": "zero",
                "prompt": {"user": {"from": "input", "pointer": "/topic"}},
                "tools": {"lookup": {"action": "echo", "input_schema": TOOL_SCHEMA}},
                "max_turns": turns,
                "max_tool_calls": turns,
                "writes": {"out": {"from": "output"}},
            }
        },
    }


def _script(turns: int) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "lookup", "arguments": {"query": f"q{t}"}}]} for t in range(turns - 1)
    ] + [{"answer": "done"}]


class TurnClock:
    """When each run's turns were scheduled (wall time of arrival at a read_committed reader)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.events = CommittedEvents(settings, "turns")
        self.turns: dict[str, dict[int, float]] = {}
        self.done: dict[str, float] = {}

    def poll(self, timeout: float = 0.05) -> None:
        now, events = self.events.poll(timeout)
        for event in events:
            lineage = event.get("lineage") or ""
            if event["type"] == "StepScheduled" and lineage.startswith("~") and "." not in lineage:
                self.turns.setdefault(event["run_id"], {})[int(lineage[1:])] = now
            elif event["type"] in ("RunSucceeded", "RunFailed"):
                self.done[event["run_id"]] = now

    def until_done(self, runs: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(run in self.done for run in runs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.done)}/{len(runs)} runs finished after {timeout:.0f} s")
            self.poll()


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5), 1),
        "p99_ms": round(percentile(ordered, 0.99), 1),
        "max_ms": round(ordered[-1], 1),
    }


def overhead(runs: int, turns: int) -> dict[str, Any]:
    prefix = f"al{uuid.uuid4().hex[:6]}"
    rig = Rig(prefix, partitions=2, worker=False)
    agents = {"providers": {"zero": {"kind": "local", "script": _script(turns)}}, "routes": {"*": "zero"}}
    with rig:
        env = {**_env(rig.settings), "RUNFOLD_WORKER_AGENTS": json.dumps(agents)}
        with rig.log.open("ab") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "processors.cli.worker", "worker", "--queue", "default", "--queue", "agents",
                 "--log-level", "WARNING"],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        rig.procs["worker"] = worker
        with RunClient(rig.settings) as client:
            client.register(definition("agent-loop-bench", turns))
            time.sleep(3)  # the processor's definitions reader takes it in
            clock = TurnClock(rig.settings)
            ids = [f"{prefix}-{i}" for i in range(runs)]
            started = time.time()
            for run in ids:  # one at a time: the per-turn time of a loop, not of a queue
                client.start("agent-loop-bench", {"topic": "kafka"}, run_id=run, answer_timeout=0)
                clock.until_done([run], 120)
            elapsed = time.time() - started
            clock.events.close()
    gaps = [
        (seen[t + 1] - seen[t]) * 1000
        for seen in clock.turns.values()
        for t in range(1, turns)
        if t in seen and t + 1 in seen
    ]
    return {
        "runs": runs,
        "turns_per_run": turns,
        "per_turn_with_one_tool_call": _stats(gaps),
        "run_wall_s_mean": round(elapsed / runs, 3),
    }


def state_growth(result_bytes: int = 1024) -> dict[str, Any]:
    """The run state after each of 8 turns with 20 tool calls of `result_bytes` results in all."""
    raw = definition("agent-loop-state", 8)
    raw["nodes"]["loop"]["max_tool_calls"] = 20
    catalog = Catalog()
    catalog.register(raw)
    ctx = EngineContext(catalog=catalog, ceilings=Ceilings(), queues=frozenset({"default", "agents"}))
    state: dict[str, Any] | None = None
    now = 1_000_000
    activations: list[dict[str, Any]] = []

    def send(msg: dict[str, Any]) -> None:
        nonlocal state, now
        now += 10
        decision = decide(state, {"run_id": "r", "ts_ms": now, "record_id": f"in-{now}", **msg}, ctx)
        for event in decision.events:
            state = evolve(state, event)
            activations.extend(m for m in effects(state, event).messages if m["type"] == "ActionActivation")

    def done(lineage: str, output: Any) -> None:
        ident = {
            "node": "loop",
            "lineage": lineage,
            "attempt": 1,
            "dispatch_id": dispatch_id("r", "loop", lineage, 1),
        }
        send({"type": "ActivationAccepted", **ident, "worker_id": "w", "lease_ms": 30_000})
        usage = {"prompt_tokens": 100, "completion_tokens": 20}
        send({"type": "ActivationCompleted", **ident, "worker_id": "w", "output": output, "usage": usage})

    send({"type": "StartRun", "definition_id": "agent-loop-state", "input": {"topic": "kafka"}})
    sizes = []
    per_turn = [3, 3, 3, 3, 3, 3, 2]
    for turn, count in enumerate(per_turn, start=1):
        calls = [
            {"id": f"c{turn}-{i}", "name": "lookup", "arguments": {"query": f"q{turn}-{i}"}}
            for i in range(count)
        ]
        done(f"~{turn}", {"content": f"turn {turn}", "tool_calls": calls})
        for i in range(count):
            done(f"~{turn}.{i}", {"snippet": "r" * (result_bytes - 14)})  # ~1 KB as JSON
        assert state is not None
        sizes.append(len(dump_state(state)))
    last_turn = activations[-1]
    done("~8", {"content": "", "answer": "done"})
    assert state is not None
    assert state["status"] == "succeeded", state["status"]
    final = len(dump_state(state))
    return {
        "turns": 8,
        "tool_calls": sum(per_turn),
        "result_bytes": result_bytes,
        "state_bytes_after_turn": sizes,
        "state_bytes_final": final,
        "last_turn_activation_json_bytes": len(orjson.dumps(last_turn)),
        "last_turn_activation_avro_bytes": len(CODEC.encode("activations", last_turn)),
        "transcript_messages_in_last_turn": len(last_turn["agent"]["messages"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--skip-broker", action="store_true", help="only the pure state measure")
    args = parser.parse_args()
    out: dict[str, Any] = {"bench": "agent_loop", "state": state_growth()}
    if not args.skip_broker:
        out["overhead"] = overhead(args.runs, args.turns)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
