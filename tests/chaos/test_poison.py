"""Poison pills: 200 good runs with, mixed in, every kind of record that once stopped a partition
or that only the runtime's own isolation catches. The processor must never exit, and every bad
record must be charged to itself and its run.

Poison (each on its own run):
- JSON nested 252 levels in a start input, in an action output and in a signal payload (they
  passed every check and crashed the processor at commit, for good: it re-read them on restart).
  Once the engine refuses deep JSON (its nesting ceiling), its refusal is as good as the
  runtime's: either a RunRejected / failed attempt from the engine, or the runtime's dead letter;
- a definition whose condition is over the CEL limits (refused at registration, so its start is
  NotFound), and one at the limits over a large input (the run fails with Evaluation);
- two outputs of 2**64 - 1 summed into one state key: a value the serializer refuses, found by the
  engine's own size check (an engine exception on one record);
- through `poison_processor.py` (a test-only entry module): a StartRun and a receipt whose fold
  raises, and a run whose snapshot cannot be written at commit (no record named: the loop must
  trace it back).

Printed and asserted: processor exits 0 (no restart), the suite's proof (every good run terminal
exactly once, no duplicated StepSucceeded, replay --verify 0 differences), every poison record
the runtime handled in the dead letters with its coordinates and reason, every poisoned run
terminal or its command rejected, with a failure that names the cause.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from checks import TERMINAL, Coord, prove, read_all
from confluent_kafka import Producer
from fleet import Fleet
from processor_support import CODEC, Commands, Reader, now_ms
from test_chaos import wait_terminal

from processors.engine import Catalog, DefinitionError
from processors.engine.catalog import content_hash
from processors.runtime.settings import ProcessorSettings
from topology.settings import producer_config

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
WF = "runfold.workflow/v1"
GOOD = 200
DEPTH = 252  # passes the client's codec (orjson's limit is 254 levels) and, before issue 19, every check
ENTRY = str(Path(__file__).resolve().parent / "poison_processor.py")
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
NESTED_EXISTS = "input.a.exists(x, input.b.exists(y, x == y))"
OVER_LIMITS = "[1,2,3]" + ".map(a, [1,2,3]" * 3 + ".map(b, b))" * 3 + ".size() > 0"

EXTRA = [
    {
        "schema": WF,
        "id": "agentq",
        "revision": 1,
        "state": {"out": None},
        "entry": ["a"],
        "nodes": {
            "a": {
                "kind": "action",
                "action": "poison",
                "queue": "agents",
                "writes": {"out": {"from": "output"}},
            }
        },
    },
    {
        "schema": WF,
        "id": "waitsig",
        "revision": 1,
        "state": {"p": None},
        "entry": ["w"],
        "nodes": {"w": {"kind": "wait", "signal": "go", "writes": {"p": {"from": "signal"}}}},
    },
    {
        "schema": WF,
        "id": "sum2",
        "revision": 1,
        "state": {"t": 0},
        "reducers": {"t": "sum"},
        "entry": ["a", "b"],
        "nodes": {
            n: {"kind": "action", "action": "poison", "queue": "agents", "writes": {"t": {"from": "output"}}}
            for n in "ab"
        },
    },
    {
        "schema": WF,
        "id": "cel-limit",
        "revision": 1,
        "state": {},
        "entry": ["a"],
        "nodes": {
            "a": {"kind": "action", "action": "poison", "queue": "agents"},
            "b": {"kind": "action", "action": "poison", "queue": "agents"},
        },
        "routes": {"a": [{"to": "b", "when": NESTED_EXISTS}]},
    },
]
OVER = {
    "schema": WF,
    "id": "cel-over",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "nodes": {"a": {"kind": "action", "action": "noop"}, "b": {"kind": "action", "action": "noop"}},
    "routes": {"a": [{"to": "b", "when": OVER_LIMITS}]},
}


# what a refusal of deep JSON says: the runtime's ("cannot store ... nested too deeply") or the engine's
_DEEP_WORDS = ("cannot store", "nest", "deep", "depth", "level")


def deep(n: int) -> Any:
    v: Any = {"end": True}
    for _ in range(n - 1):
        v = {"a": v}
    return v


class Located:
    """Sends commands and receipts, remembering where each landed (delivery reports)."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.producer = Producer(producer_config(settings, linger_ms=0))
        self.topics = settings.topics
        self.at: dict[str, Coord] = {}  # label -> (topic, partition, offset)

    def send(self, label: str, kind: str, run_id: str, body: dict[str, Any]) -> None:
        msg = {"run_id": run_id, "ts_ms": now_ms(), "record_id": f"poison-{label}", **body}
        topic = self.topics.commands if kind == "commands" else self.topics.receipts

        def delivered(err: Any, m: Any) -> None:
            assert err is None, err
            self.at[label] = (m.topic(), m.partition(), m.offset())

        self.producer.produce(topic, CODEC.encode(kind, msg), run_id.encode(), on_delivery=delivered)
        self.producer.flush(30)

    def complete(self, label: str, act: dict[str, Any], output: Any) -> None:
        ident = {k: act[k] for k in ("node", "lineage", "attempt", "dispatch_id")}
        self.send(
            label,
            "receipts",
            act["run_id"],
            {"type": "ActivationCompleted", **ident, "worker_id": "poison", "output": output, "usage": ZERO},
        )


def publish(settings: ProcessorSettings, raws: list[dict[str, Any]], validate: bool = True) -> None:
    producer = Producer(producer_config(settings))
    catalog = Catalog()
    for raw in raws:
        digest = content_hash(catalog.register(raw)) if validate else "0" * 64
        record = {
            "definition_id": raw["id"],
            "revision": raw["revision"],
            "content_hash": digest,
            "definition": raw,
            "registered_ms": now_ms(),
        }
        producer.produce(
            settings.topics.definitions,
            CODEC.encode("definitions", record),
            f"{raw['id']}@{raw['revision']}".encode(),
        )
    assert producer.flush(10) == 0


@pytest.mark.timeout(300)
def test_poison_pills_never_stop_a_partition(chaos_settings: ProcessorSettings, tmp_path: Path) -> None:
    s = chaos_settings
    with pytest.raises(DefinitionError) as refused:  # the client's register refuses it before it is published
        Catalog().register(OVER)
    [issue] = refused.value.errors
    assert (issue.path, issue.rule) == ("routes.a[0].when", "condition_nesting"), issue
    publish(s, EXTRA)
    publish(s, [OVER], validate=False)  # published anyway: every processor refuses it on reading
    t0 = time.monotonic()
    fleet = Fleet(s, tmp_path)
    fleet._spawn(
        "p1",
        [
            sys.executable,
            ENTRY,
            "--instance-id",
            "p1",
            "--state-dir",
            str(Path(s.state_dir) / "p1"),
            "--commit-interval-ms",
            str(s.commit_interval_ms),
        ],
    )
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    agents = Reader(s, [s.topics.activations("agents")], "activations")
    cmd, bad = Commands(s), Located(s)
    good = [f"good-{i:03d}" for i in range(GOOD)]
    big = {"a": list(range(3000)), "b": list(range(3000, 6000))}  # ~35 KB: 9 million comparisons
    try:
        for i, run in enumerate(good[:100]):
            cmd.start(run, "noop3", {"i": i})
        cmd.flush()
        # poisoned starts, between the good ones
        bad.send(
            "deep-input",
            "commands",
            "p-deep-input",
            {"type": "StartRun", "definition_id": "noop3", "revision": None, "input": deep(DEPTH)},
        )
        bad.send(
            "cel-over",
            "commands",
            "p-cel-over",
            {"type": "StartRun", "definition_id": "cel-over", "revision": None, "input": {}},
        )
        bad.send(
            "raise-start",
            "commands",
            "p-raise-start",
            {"type": "StartRun", "definition_id": "noop3", "revision": None, "input": {"poison": "raise"}},
        )
        bad.send(
            "commit",
            "commands",
            "p-commit",
            {"type": "StartRun", "definition_id": "noop3", "revision": None, "input": {"poison": "commit"}},
        )
        for run, definition, run_input in [
            ("p-deep-output", "agentq", {}),
            ("p-raise-receipt", "agentq", {}),
            ("p-deep-signal", "waitsig", {}),
            ("p-sum", "sum2", {}),
            ("p-cel-limit", "cel-limit", big),
        ]:
            cmd.start(run, definition, run_input)
        cmd.flush()
        for i, run in enumerate(good[100:], 100):
            cmd.start(run, "noop3", {"i": i})
        cmd.flush()
        # the test is the executor of the `agents` queue: it answers with the poison
        acts = agents.wait_for(
            lambda recs: (
                {r["run_id"] for r in recs} >= {"p-deep-output", "p-raise-receipt", "p-sum", "p-cel-limit"}
                and len([r for r in recs if r["run_id"] == "p-sum"]) == 2
            ),
            60,
            "the poisoned runs' activations",
        )
        by_run: dict[str, list[dict[str, Any]]] = {}
        for act in acts:
            by_run.setdefault(act["run_id"], []).append(act)
        bad.complete("deep-output", by_run["p-deep-output"][0], deep(DEPTH))
        bad.complete("raise-receipt", by_run["p-raise-receipt"][0], {"poison": "raise"})
        for n, act in enumerate(by_run["p-sum"]):
            bad.complete(f"sum-{n}", act, 2**64 - 1)
        bad.complete("cel-limit", by_run["p-cel-limit"][0], {"ok": True})
        events.wait_for(
            lambda recs: any(e["run_id"] == "p-deep-signal" and e["type"] == "RunStarted" for e in recs),
            60,
            "p-deep-signal started",
        )
        bad.send(
            "deep-signal",
            "commands",
            "p-deep-signal",
            {"type": "SignalRun", "signal": "go", "payload": deep(DEPTH)},
        )
        events.wait_for(
            lambda recs: any(e["run_id"] == "p-deep-signal" and e["type"] == "RunRejected" for e in recs),
            60,
            "the deep signal rejected",
        )
        cmd.cancel("p-deep-signal", "the poisoned signal was refused; the run is ended by the test")
        cmd.flush()
        accepted_poison = {"p-deep-output", "p-raise-receipt", "p-deep-signal", "p-sum", "p-cel-limit"}
        wait_terminal(events, set(good) | accepted_poison, 120, fleet)
        events.wait_for(
            lambda recs: (
                {e["run_id"] for e in recs if e["type"] == "RunRejected"}
                >= {"p-deep-input", "p-cel-over", "p-raise-start", "p-commit"}
            ),
            60,
            "the poisoned starts rejected",
        )
    finally:
        exits_before_stop = list(fleet.exits) + [
            (n, p.returncode) for n, p in fleet.procs.items() if p.poll() is not None
        ]
        codes = fleet.stop()
        events.close()
        agents.close()
    log = fleet.log("p1").read_text(errors="replace")
    assert not exits_before_stop, f"a process ended by itself: {exits_before_stop}; {fleet.tails()}"
    assert codes["p1"] == 0 and "processor crashed" not in log, fleet.tails()

    evs = events.records
    rejected = {e["run_id"]: e for e in evs if e["type"] == "RunRejected"}
    terminal = {e["run_id"]: e for e in evs if e["type"] in TERMINAL}
    dead = read_all(s, s.topics.dead_letters, "dead_letters")
    dead_at = {(d["source_topic"], d["source_partition"], d["source_offset"]): d for d in dead}

    def charged(label: str) -> dict[str, Any]:
        where = bad.at[label]
        assert where in dead_at, f"poison {label} at {where} is not in the dead letters"
        assert dead_at[where]["error"], dead_at[where]
        return dead_at[where]

    outcome: dict[str, str] = {}
    # deep JSON: refused by the engine (its nesting ceiling) or charged by the runtime
    r = rejected["p-deep-input"]
    assert r["code"] in ("InvalidInput", "Limit") and any(w in r["reason"] for w in _DEEP_WORDS), r
    if r["code"] == "Limit":
        charged("deep-input")
    outcome["deep-input"] = f"RunRejected {r['code']}"
    failed = terminal["p-deep-output"]
    assert failed["type"] == "RunFailed" and failed["failure"]["code"] == "InvalidOutput", failed
    assert any(w in failed["failure"]["message"] for w in _DEEP_WORDS), failed
    if "cannot store" in failed["failure"]["message"]:
        charged("deep-output")
    outcome["deep-output"] = f"RunFailed {failed['failure']['code']}"
    sig = rejected["p-deep-signal"]
    assert sig["code"] in ("InvalidInput", "Limit") and sig["command_type"] == "SignalRun", sig
    assert any(w in sig["reason"] for w in _DEEP_WORDS), sig
    if sig["code"] == "Limit":
        charged("deep-signal")
    assert terminal["p-deep-signal"]["type"] == "RunCancelled"
    outcome["deep-signal"] = f"RunRejected {sig['code']}"
    # CEL: refused at registration (so NotFound), and over the budget at evaluation
    assert rejected["p-cel-over"]["code"] == "NotFound", rejected["p-cel-over"]
    outcome["cel-over"] = "definition refused; StartRun NotFound"
    cel = terminal["p-cel-limit"]
    assert cel["type"] == "RunFailed" and cel["failure"]["code"] == "Evaluation", cel
    assert "input.a.exists" in cel["failure"]["message"] and "exceeds the limit" in cel["failure"]["message"]
    outcome["cel-limit"] = "RunFailed Evaluation (condition_cost)"
    # a value the serializer refuses (the engine's own check raised on it): charged by the runtime
    total = terminal["p-sum"]
    assert total["type"] == "RunFailed" and total["failure"]["code"] in ("InvalidOutput", "State", "Limit"), (
        total
    )
    sum_dead = [dead_at[bad.at[k]]["error"] for k in ("sum-0", "sum-1") if bad.at[k] in dead_at]
    if total["failure"]["code"] == "InvalidOutput":  # charged by the runtime (an engine check may come first)
        assert len(sum_dead) == 1 and "64-bit" in sum_dead[0], sum_dead  # the second one: its merge overflows
    outcome["sum"] = f"RunFailed {total['failure']['code']}" + (" (unserializable)" if sum_dead else "")
    # injected through the test-only entry module: only the runtime can catch these
    raised = rejected["p-raise-start"]
    assert raised["code"] == "State" and "injected fault" in raised["reason"], raised
    assert "injected fault" in charged("raise-start")["error"]
    receipt = terminal["p-raise-receipt"]
    assert receipt["type"] == "RunFailed" and receipt["failure"]["code"] == "State", receipt
    assert "injected fault" in charged("raise-receipt")["error"]
    at_commit = rejected["p-commit"]
    assert at_commit["code"] == "Limit" and "injected fault" in at_commit["reason"], at_commit
    assert "snapshot" in charged("commit")["error"]
    outcome.update(
        {
            "raise-start": "RunRejected State",
            "raise-receipt": "RunFailed State",
            "commit": "RunRejected Limit (traced back at commit)",
        }
    )

    runtime_charged = [k for k, where in bad.at.items() if where in dead_at]
    proof = prove(
        "poison pills beside 200 good runs",
        s,
        started=set(good) | accepted_poison,
        garbage=[bad.at[k] for k in runtime_charged],
        bad={
            "p-deep-input": None,
            "p-cel-over": "NotFound",
            "p-raise-start": "State",
            "p-commit": "Limit",
            "p-deep-signal": None,
        },
        extra={
            "processor_exits": len(exits_before_stop),
            "poison": outcome,
            "dead_lettered_by_the_runtime": sorted(runtime_charged),
            "seconds": round(time.monotonic() - t0, 1),
        },
    )
    assert proof.terminal_by_type.get("RunSucceeded") == GOOD
    print(
        f"[poison] processor exits/restarts: {len(exits_before_stop)}; good runs succeeded: "
        f"{proof.terminal_by_type.get('RunSucceeded')}; poison: {outcome}; dead letters: {sorted(runtime_charged)}"
    )
