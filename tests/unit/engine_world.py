"""A generative world for the engine: random definitions, random executor behaviour, invariants.

`definitions()` is a hypothesis strategy of workflow definitions (2-8 nodes of every kind, maps,
retries, every failure policy, conditional routes and loops, budgets small enough to trip).
`World` runs one run of such a definition the way the runtime does (decide, then evolve and
effects of every event, timers kept by id in event order, a fired timer dropped before its
decision's timers apply) while a hypothesis `data` object chooses what the outside world does
next: executors accept, heartbeat, complete, fail (retryable or not), give up, answer twice,
answer late or for attempts that no longer exist; timers fire late and more than once; child runs
finish; the client cancels, signals (early, late, unknown, hostile payloads) and resumes.

After every input `World.check` asserts the engine's invariants (docs/semantics.md), and
`World.drain` then answers every activation and fires every timer, asserting that the run ends
terminal, waiting for a signal, or paused: never stuck.

Nothing here knows how the engine computes its answers: it knows only what the rules promise.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st

from processors.engine import (
    Catalog,
    Ceilings,
    EngineContext,
    decide,
    dump_state,
    effects,
    evolve,
    run_status,
)
from processors.engine.ids import dispatch_id, is_loop_lineage, split_loop_lineage
from processors.engine.vocabulary import OPEN_STEP_STATUSES, TERMINAL_STATUSES

RUN = "r"
STATE = {"n": 0, "items": [], "flag": False, "out": None, "m": {}, "rc": None, "list": [1, 2]}
REDUCERS = {"n": "sum", "items": "append", "m": "merge", "rc": "reject_concurrent"}
# conditions that hold, fail or raise (an unknown key, an input without `go`): the raising ones rarer
CONDITIONS = [
    "state.n > 2",
    "state.flag",
    "size(state.items) > 3",
    "output == null",
    "state.n % 2 == 0",
    "has(state.m.k)",
    "state.n >= 1",
    "!state.flag",
    "size(state.items) == 0",
    "state.missing > 0",
    "input.go",
]
WRITES = [
    ("n", {"from": "literal", "value": 1}),
    ("items", {"from": "output"}),
    ("out", {"from": "output"}),
    ("m", {"from": "output"}),
    ("rc", {"from": "literal", "value": 1}),
    ("flag", {"from": "output", "pointer": "/v"}),
    ("out", {"from": "state"}),
]
# What an executor may report as a receipt's usage: none, a whole one, a part, a negative, a string.
USAGES: list[dict[str, Any]] = [
    {},
    {"prompt_tokens": 5, "completion_tokens": 3, "cost_micros": 7},
    {"prompt_tokens": 40, "cost_micros": 90},
    {"prompt_tokens": -3},
    {"cost_micros": "many"},
]

OUTPUTS: list[Any] = [
    {"v": 1},
    {"v": True},
    {"v": "x", "k": 1},
    1,
    None,
    [1, 2],
    {"w": 2},
    {"api_key": "abc"},
    "text",
]
# what a model turn of an agent loop may answer: tool calls (good, unknown, bad arguments, several
# at once), an answer, and outputs that are not a turn
ANSWER_TURN: dict[str, Any] = {"content": "done", "answer": {"v": 1}}
TURN_OUTPUTS: list[Any] = [
    {"content": "", "tool_calls": [{"id": "a", "name": "look", "arguments": {"q": 1}}]},
    {
        "content": "two",
        "tool_calls": [
            {"id": "a", "name": "look", "arguments": {"q": 1}},
            {"id": "b", "name": "poke", "arguments": {}},
        ],
    },
    {"content": "", "tool_calls": [{"id": "a", "name": "nope", "arguments": {}}]},
    {
        "content": "child",
        "tool_calls": [
            {"id": "a", "name": "ask", "arguments": {"q": 2}},
            {"id": "b", "name": "look", "arguments": {"q": 1}},
        ],
    },
    {"content": "", "tool_calls": [{"id": "a", "name": "look", "arguments": {"x": 1}}]},
    {"content": "", "tool_calls": [{"id": "a", "name": "poke", "arguments": "text"}]},
    ANSWER_TURN,
    {"content": "done", "answer": 3},
    {"tool_calls": 5},
    {"tool_calls": [{"name": 1}]},
    "not a turn",
]
PAYLOADS: list[Any] = [{"ok": True}, {"ok": False}, {}, None, {"password": "x"}, [1]]
EXECUTOR_KINDS = ("action", "agent")
DISPATCHED = ("action", "agent", "workflow")
TERMINAL_EVENTS = frozenset({"RunSucceeded", "RunFailed", "RunCancelled"})
# receipts that tell the engine an attempt's handler (or child run) is over
STOP_EVIDENCE = frozenset(
    {"ActivationCompleted", "ActivationFailed", "ActivationCancelled", "ChildRunFinished"}
)
STATS: Counter[str] = Counter()  # what the generated runs did, for the soak's report


def deep(levels: int) -> Any:
    value: Any = 0
    for index in range(levels):
        value = {"d": value} if index % 2 else [value]
    return value


CHILD = {
    "schema": "runfold.workflow/v1",
    "id": "child",
    "revision": 1,
    "entry": ["c"],
    "nodes": {"c": {"kind": "action", "action": "child-work"}},
}


# ------------------------------------------------------------------------ definitions


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(2, 8))
    names = [f"n{i}" for i in range(count)]
    nodes = {name: draw(_node()) for name in names}
    routes: dict[str, list[Any]] = {}
    for name in names:
        targets = draw(st.lists(st.sampled_from([*names, "end"]), max_size=2))
        if targets:
            routes[name] = [
                {"to": to, **({"when": when} if when else {})}
                for to, when in zip(
                    targets,
                    draw(
                        st.lists(
                            st.sampled_from([None, *CONDITIONS]), min_size=len(targets), max_size=len(targets)
                        )
                    ),
                    strict=True,
                )
            ]
    entry = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    budgets: dict[str, Any] = {"max_steps": draw(st.integers(2, 40))}  # bounds every loop
    for name, low, high in (
        ("max_retries", 1, 5),
        ("max_agents", 1, 5),
        ("max_tokens", 10, 400),
        ("max_cost_micros", 10, 400),
        ("wall_time_ms", 200, 5000),
        ("max_concurrency", 1, 3),
    ):
        if draw(st.integers(0, 3)) == 0:
            budgets[name] = draw(st.integers(low, high))
    if draw(st.booleans()):
        budgets["warn_at_percent"] = draw(st.integers(50, 100))
    raw: dict[str, Any] = {
        "schema": "runfold.workflow/v1",
        "id": "wf",
        "revision": 1,
        "entry": entry,
        "nodes": nodes,
        "routes": routes,
        "state": dict(STATE),
        "reducers": dict(REDUCERS),
        "budgets": budgets,
    }
    if draw(st.integers(0, 4)) == 0:
        raw["input_schema"] = {"type": "object", "required": ["items"]}
    if draw(st.integers(0, 3)) == 0:
        raw["output"] = {"from": "state", "pointer": "/out"}
    if draw(st.integers(0, 5)) == 0:
        raw["required"] = ["out"]
    # signal s1's contract, the same for every wait on it (signal_contract): sometimes a payload
    # schema (the world's {} / None / [1] payloads fail it), sometimes early signals refused
    contract: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        contract["payload_schema"] = {"type": "object", "required": ["ok"]}
    if draw(st.integers(0, 3)) == 0:
        contract["accept_early"] = False
    for node in nodes.values():
        if node["kind"] == "wait" and node["signal"] == "s1":
            node.update(contract)
    return raw


@st.composite
def _node(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["action", "action", "agent", "state", "wait", "sleep", "workflow"]))
    node: dict[str, Any] = {"kind": kind}
    if draw(st.integers(0, 2)) == 0:
        node["on_failure"] = draw(st.sampled_from(["fail_fast", "continue", "skip_dependents"]))
    if kind in DISPATCHED:
        if kind == "action":
            node["action"] = "work"
        elif kind == "agent":
            node.update(
                agent="helper",
                model="small",
                prompt={
                    "user": draw(
                        st.sampled_from(
                            [
                                {"from": "input", "pointer": "/q"},
                                "hello",
                                {"from": "input", "pointer": "/q"},
                                "hi",
                                {"from": "state", "pointer": "/nope"},
                            ]
                        )
                    )
                },
            )
        else:
            node.update(workflow="child", revision=1)
        mapped = draw(st.integers(0, 2)) == 0
        if mapped:
            node["map"] = draw(
                st.sampled_from(
                    [
                        {"from": "input", "pointer": "/items"},
                        {"from": "state", "pointer": "/list"},
                        {"from": "state", "pointer": "/items"},
                        {"from": "input", "pointer": "/items"},
                        {"from": "state", "pointer": "/list"},
                        {"from": "input", "pointer": "/notalist"},
                    ]
                )
            )
        node["input"] = draw(
            st.sampled_from(
                [
                    None,
                    None,
                    {"x": {"from": "state", "pointer": "/n"}},
                    {"x": {"from": "state", "pointer": "/n"}},
                    {"bad": {"from": "state", "pointer": "/nope"}},
                    *([{"i": {"from": "item"}}] * 2 if mapped else []),
                ]
            )
        )
        if node["input"] is None:
            del node["input"]
        if draw(st.booleans()):
            node["retry"] = {
                "max_attempts": draw(st.integers(1, 3)),
                "backoff_ms": draw(st.integers(0, 50)),
                "multiplier": draw(st.sampled_from([1.0, 2.0])),
            }
        if draw(st.integers(0, 2)) == 0:
            node["timeout_ms"] = draw(st.integers(50, 500))
        if kind == "agent" and draw(st.integers(0, 2)) > 0:  # an agent loop (agent_loop.py)
            node["tools"] = {
                "look": {"action": "work", "input_schema": {"type": "object", "required": ["q"]}},
                "poke": {"action": "work", "queue": "default"},
            }
            if draw(st.booleans()):
                node["tools"]["poke"]["retry"] = {"max_attempts": draw(st.integers(1, 3))}
            if draw(st.booleans()):
                node["tools"]["look"]["timeout_ms"] = draw(st.integers(50, 500))
            if draw(st.booleans()):
                approval: dict[str, Any] = {"signal": "ok-poke"}
                if draw(st.booleans()):
                    approval["timeout_ms"] = draw(st.integers(50, 1000))
                node["tools"]["poke"]["approval"] = approval
            if draw(st.booleans()):  # a workflow tool: each call a child run
                node["tools"]["ask"] = {"workflow": "child", "revision": 1}
            node["max_turns"] = draw(st.integers(1, 3))
            node["max_tool_calls"] = draw(st.integers(0, 4))
        if kind in EXECUTOR_KINDS:
            lease = draw(st.integers(100, 1000))
            node.update(lease_ms=lease, heartbeat_ms=draw(st.integers(1, lease - 1)))
            if draw(st.integers(0, 2)) == 0:
                node["output_schema"] = {"type": "object", "required": ["v"]}
    elif kind == "state":
        node["mutations"] = [
            draw(
                st.sampled_from(
                    [
                        {"op": "increment", "target": "n", "value": 1},
                        {"op": "set", "target": "flag", "value": True},
                        {"op": "append", "target": "items", "value": "x"},
                        {"op": "set", "target": "out", "value": {"from": "state", "pointer": "/n"}},
                    ]
                )
            )
        ]
    elif kind == "wait":
        node["signal"] = draw(st.sampled_from(["s0", "s1"]))
        if draw(st.booleans()):
            node["timeout_ms"] = draw(st.integers(50, 1000))
    else:
        node["duration_ms"] = draw(st.integers(0, 200))
    if kind != "sleep" and draw(st.booleans()):
        if kind == "wait":
            menu = [("flag", {"from": "signal", "pointer": "/ok"}), *WRITES[:1]]
        elif kind == "state":  # a state node has no output to write from
            menu = [(key, tpl) for key, tpl in WRITES if tpl["from"] != "output"]
        else:
            menu = WRITES
        key, template = draw(st.sampled_from(menu))
        node["writes"] = {key: template}
    return node


@st.composite
def run_inputs(draw: st.DrawFn) -> dict[str, Any]:
    run_input: dict[str, Any] = {"q": "hi", "notalist": 5}
    if draw(st.integers(0, 5)):
        run_input["items"] = draw(st.lists(st.integers(0, 9), max_size=5))
    if draw(st.booleans()):
        run_input["go"] = draw(st.booleans())
    return run_input


# ------------------------------------------------------------------------ the world


class Violation(AssertionError):
    pass


class RunawayGuard:
    """A decision that never returns (a loop without end inside `decide`) cannot be caught by an
    assertion: it grows until the machine runs out of memory, as the first soak found. This
    thread ends the process instead, printing the definition and message that caused it, when one
    `decide` call runs for more than `seconds` or the process grows past `max_bytes`."""

    def __init__(self, seconds: float = 20.0, max_bytes: int = 4 << 30) -> None:
        self.current: tuple[float, dict[str, Any], dict[str, Any]] | None = None
        self.seconds, self.max_bytes = seconds, max_bytes
        threading.Thread(target=self._watch, name="engine-world-guard", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            current = self.current
            if current is None:
                continue
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            if time.monotonic() - current[0] > self.seconds or rss > self.max_bytes:
                sys.stderr.write(
                    f"\nRUNAWAY DECISION ({rss >> 20} MiB): definition\n"
                    f"{orjson.dumps(current[1]).decode()}\nmessage {current[2]!r}\n"
                )
                sys.stderr.flush()
                os._exit(3)


GUARD = RunawayGuard()


class World:
    """One run, driven like the runtime drives it, checked after every input."""

    def __init__(self, raw: dict[str, Any], run_input: Any, ceilings: Ceilings | None = None) -> None:
        self.catalog = Catalog(ceilings)
        self.catalog.register(CHILD)
        self.definition = self.catalog.register(raw)
        self.raw = raw
        self.ctx = EngineContext(
            catalog=self.catalog, ceilings=ceilings or Ceilings(), queues=frozenset({"default", "agents"})
        )
        self.run_input = run_input
        self.state: dict[str, Any] | None = None
        self.replay: dict[str, Any] | None = None  # folded from decoded copies, without the memo
        self.log: list[dict[str, Any]] = []
        self.now = 1_000_000
        self.records = 0
        self.activations: dict[
            str, dict[str, Any]
        ] = {}  # dispatch id -> ActionActivation / ChildRunActivation
        self.cancel_requests: dict[str, dict[str, Any]] = {}
        self.timers: dict[str, dict[str, Any]] = {}
        self.applied: list[dict[str, Any]] = []  # receipts (and timers) whose decision emitted events
        # keyed commands (cancel, signal, resume) the run applied, and each key's answering event
        self.commands: list[dict[str, Any]] = []
        self.keys: dict[str, tuple[int, str]] = {}
        self.expected_usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
        self.last_terminal: str | None = None  # the last terminal or pause event, None after a resume
        self.inputs = 0
        # instance key -> the dispatch id of its attempt that may still execute: activated, and no
        # terminal evidence yet (its executor's terminal receipt or stop, its lease's expiry); one
        # the engine gave up on at its stop bound (stop_unconfirmed) is excused
        self.executing: dict[str, str] = {}

    # ---- driving ----------------------------------------------------------------------------
    def send(self, msg: dict[str, Any], *, advance: int = 0, duplicate: bool = False) -> Any:
        self.records += 1
        if duplicate and "ts_ms" in msg:
            full = dict(msg)  # a redelivery is the same record: its time too (it arrives later)
        else:
            self.now = max(self.now + advance, int(msg.get("ts_ms") or 0))
            full = {"run_id": RUN, "record_id": f"in-{self.records}", **msg, "ts_ms": self.now}
        if full["type"] == "TimerFired":
            self.timers.pop(full["timer_id"], None)  # the runtime drops a timer that came back
        excused: dict[str, str] | None = None
        if full["type"] in STOP_EVIDENCE and full.get("confirmed") is not False:
            self._stopped(full)  # the world's executor stopped the attempt before it said so
        elif (
            full["type"] == "TimerFired" and full.get("timer_kind") in ("lease_expiry", "stop_timeout")
        ) or (full["type"] == "ActivationCancelled"):
            # the stop the engine may assume (a dead worker's lease) or give up proving (its bound,
            # an executor's stop_unconfirmed): excused, if the engine acts on it
            excused = dict(self.executing)
            self._stopped(full)
        before = self.state
        GUARD.current = (time.monotonic(), self.raw, full)
        decision = decide(self.state, full, self.ctx)  # must never raise (nor run away: GUARD)
        GUARD.current = None
        self.inputs += 1
        STATS["inputs"] += 1
        if decision.dropped:
            STATS[f"dropped: {decision.dropped}"] += 1
        if len(decision.states) != len(decision.events):
            raise Violation("the decision does not carry one state per event")
        for event, carried in zip(decision.events, decision.states, strict=True):
            self._fold(event)
            if carried != self.state:  # the runtime takes the carried states instead of folding
                raise Violation(f"the state carried after {event['type']} is not evolve's")
        if excused is not None and not decision.events:
            self.executing = excused  # the engine dropped it: the attempt still counts as running
        self.check(full, before, decision, duplicate)
        self._check_key(full, decision)
        # applied: it moved the run (a receipt refused as a ReceiptConflict is refused again)
        if any(e["type"] != "ReceiptConflict" for e in decision.events) and full["type"] not in (
            "StartRun",
            "CancelRun",
            "SignalRun",
            "ResumeRun",
        ):
            self.applied.append(full)
        return decision

    def _check_key(self, msg: dict[str, Any], decision: Any) -> None:
        """Idempotent commands (issue 44): a key the run applied is answered, never applied again;
        a key applied now is on exactly one of its events."""
        if msg["type"] not in ("CancelRun", "SignalRun", "ResumeRun") or self.state is None:
            return
        key = msg.get("idempotency_key") or msg["record_id"]
        carried = [e for e in decision.events if e["sequence"] and e.get("idempotency_key") == key]
        if key in self.keys:
            STATS["repeated command answered"] += 1
            if [e["type"] for e in decision.events] != ["CommandDeduplicated"] or (
                decision.events[0]["answer_sequence"],
                decision.events[0]["answer_type"],
            ) != self.keys[key]:
                raise Violation(f"a repeat of key {key!r} was not answered with its first answer")
            return
        if any(e["sequence"] for e in decision.events):
            if len(carried) != 1:
                raise Violation(f"{msg['type']} applied with {len(carried)} events carrying its key")
            self.keys[key] = (carried[0]["sequence"], carried[0]["type"])
            self.commands.append(msg)
        elif carried:
            raise Violation("a command that changed nothing left its key")

    def _stopped(self, msg: dict[str, Any]) -> None:
        key = _key(msg) if isinstance(msg.get("node"), str) and isinstance(msg.get("lineage"), str) else ""
        if self.executing.get(key) == msg.get("dispatch_id"):
            del self.executing[key]

    def _fold(self, event: dict[str, Any]) -> None:
        before = self.state
        self.state = evolve(self.state, event)
        STATS[f"event: {event['type']}"] += 1
        copy = orjson.loads(orjson.dumps(event))  # as read back from the run-events topic
        self.replay = evolve(self.replay, copy)
        self._check_event(before, event)
        if event["sequence"]:  # RunRejected, CommandDeduplicated: sequence 0, no run's log
            self.log.append(event)
        if self.state is None:
            return
        fx = effects(self.state, event)
        for message in fx.messages:
            mtype = message["type"]
            if mtype in ("ActionActivation", "ChildRunActivation"):
                step = self.state["steps"][_key(message)]
                if step["dispatch_id"] != message["dispatch_id"] or step["status"] != "scheduled":
                    raise Violation(f"{mtype} for a step that is not scheduled with that dispatch id: {step}")
                key = _key(message)
                if key in self.executing:
                    raise Violation(
                        f"two attempts of {key} in flight at once: attempt {message['attempt']} "
                        f"dispatched while {self.executing[key]} may still run"
                    )
                self.executing[key] = message["dispatch_id"]
                self.activations[message["dispatch_id"]] = message
            else:
                if message["dispatch_id"] not in self.activations:
                    raise Violation(f"{mtype} of an attempt never activated: {message}")
                self.cancel_requests[message["dispatch_id"]] = message
        for timer_id in fx.clear_timers:
            self.timers.pop(timer_id, None)
        for timer in fx.set_timers:
            self.timers[timer["timer_id"]] = timer

    # ---- invariants -------------------------------------------------------------------------
    def _check_event(self, before: dict[str, Any] | None, event: dict[str, Any]) -> None:
        etype = event["type"]
        if etype in ("RunRejected", "CommandDeduplicated"):
            if event["sequence"] != 0 or self.state is not before:
                raise Violation(f"a {etype} changed the run or has a sequence")
            return
        assert self.state is not None
        previous = before["sequence"] if before is not None else 0
        if event["sequence"] != previous + 1:
            raise Violation(f"sequence gap: {previous} -> {event['sequence']} ({etype})")
        allowed_after = {
            None: None,
            "RunSucceeded": frozenset(),
            "RunCancelled": frozenset(),
            "RunFailed": frozenset({"RunResumed"}),
            # a paused run's steps are cancelled; a receipt for one that had settled may still conflict
            "RunPaused": frozenset(
                {"RunResumed", "RunCancelled", "SignalReceived", "RunFailed", "ReceiptConflict"}
            ),
        }[self.last_terminal]
        if (
            self.last_terminal is not None
            and (etype.startswith("Step") or etype == "ReceiptConflict")
            and (etype != "ReceiptConflict" or self.last_terminal != "RunPaused")
        ):
            raise Violation(f"step effect {etype} accepted after the run's {self.last_terminal}")
        if allowed_after is not None and etype not in allowed_after:
            raise Violation(f"{etype} after {self.last_terminal}")
        # "cancelled" means stopped: no attempt may still run (but one reported stop_unconfirmed)
        if (etype in TERMINAL_EVENTS or etype == "RunPaused") and self.executing:
            raise Violation(f"{etype} while attempts may still run: {sorted(self.executing)}")
        if etype in TERMINAL_EVENTS or etype == "RunPaused":
            self.last_terminal = etype
            STATS[f"outcome: {etype}"] += 1
        elif etype == "RunResumed":
            self.last_terminal = None
        state = self.state
        limits = state["budgets"]
        usage = state["usage"]
        if etype == "StepScheduled":
            old = before["steps"].get(_key(event)) if before is not None else None
            fresh = old is None or old["superstep"] != event["superstep"]
            if fresh:
                for dimension, limit_key in (("steps", "max_steps"), ("agents", "max_agents")):
                    if 0 < limits.get(limit_key, 0) < usage[dimension]:
                        raise Violation(
                            f"dispatched past {limit_key}: {usage[dimension]} > {limits[limit_key]}"
                        )
            step = state["steps"][_key(event)]
            if (
                old is not None
                and not fresh
                and old["status"] == "succeeded"
                and is_loop_lineage(event["lineage"])
            ):
                raise Violation(f"{_key(event)} ran again after it succeeded: a turn or tool call runs once")
            policy = self._retry_policy(state, event)
            if step["attempt"] - step["first_attempt"] + 1 > (policy.max_attempts if policy else 1):
                raise Violation(f"attempt {step['attempt']} of {_key(event)} past its retry policy")
            cap = int(limits.get("max_concurrency") or 0)
            if cap and event["kind"] in DISPATCHED and _in_flight(state) > cap:
                raise Violation(f"{_in_flight(state)} in flight over max_concurrency {cap}")
        if etype == "StepSkipped" and before is not None:
            # a skip marks a node that did not run: it must never overwrite an outcome of the
            # superstep that ran it (a failed skip_dependents self-loop became "skipped", and its
            # run succeeded: the RunSucceeded check below reads only the state)
            old = before["steps"].get(_key(event))
            if (
                old is not None
                and old["superstep"] == before["superstep"]
                and old["status"] in ("succeeded", "failed")
            ):
                raise Violation(f"StepSkipped overwrote {_key(event)}, {old['status']} in this superstep")
        if etype == "ReceiptConflict" and before is not None:
            # an attempt stopped (settled from stopping, or presumed dead when its lease expired)
            # takes no conflict: its late receipts are dropped (semantics.md, Stopping)
            old = before["steps"].get(_key(event))
            stop = (old or {}).get("stop") or {}
            if (
                old is not None
                and old["attempt"] == event["attempt"]
                and old["status"] != "stopping"  # still stopping: another worker's acceptance conflicts
                and ("cause" in stop or stop.get("how") == "lease_expired")
            ):
                raise Violation(f"ReceiptConflict for {_key(event)}, an attempt stopped ({stop.get('how')})")
        if etype == "StepRetryScheduled" and 0 < limits.get("max_retries", 0) < usage["retries"]:
            raise Violation(f"retries {usage['retries']} past max_retries {limits['max_retries']}")
        if etype == "RunSucceeded":
            for key, step in state["steps"].items():
                if is_loop_lineage(step["lineage"]):
                    continue  # a failed tool call is an error result for the model, not the node's failure
                policy = self.definition.nodes[step["node"]].on_failure
                if step["status"] == "failed" and policy in ("fail_fast", "skip_dependents"):
                    raise Violation(f"the run succeeded though {key} failed under {policy}")
        if etype in TERMINAL_EVENTS or etype == "RunPaused":
            still_open = [
                key
                for key, step in state["steps"].items()
                if step["superstep"] == state["superstep"] and step["status"] in OPEN_STEP_STATUSES
            ]
            if still_open or state["open"] != 0:
                raise Violation(f"{etype} with steps still open: {still_open} (open={state['open']})")

    def _retry_policy(self, state: dict[str, Any], event: dict[str, Any]) -> Any:
        """The retry rule of an attempt: its node's, or for a loop's tool call its tool's."""
        node = self.definition.nodes[event["node"]]
        loop = split_loop_lineage(event["lineage"])
        if loop is None or loop[2] is None:
            return node.retry
        parent, turn, call = loop
        turn_record = state["steps"][f"{event['node']}[{parent}~{turn}]"]
        STATS["tool call dispatched"] += 1
        return node.tools[turn_record["output"]["tool_calls"][call]["name"]].retry

    def check(self, msg: dict[str, Any], before: Any, decision: Any, duplicate: bool) -> None:
        if duplicate and (any(e["sequence"] for e in decision.events) or self.state is not before):
            raise Violation(
                f"an exact duplicate of an applied {msg['type']} changed the run: "
                f"{[e['type'] for e in decision.events]}"
            )
        if self.state is None:
            if self.replay is not None:
                raise Violation("the replay has a run the live fold does not")
            return
        live = dump_state(self.state)
        if len(live) > 8_000_000:  # the generated values are small: a state this large grew without bound
            raise Violation(f"the run state grew to {len(live)} bytes")
        if self.replay is None or dump_state(self.replay) != live:
            raise Violation("folding the emitted events from nothing does not give the live state")
        state = self.state
        open_now = sum(
            1
            for step in state["steps"].values()
            if step["superstep"] == state["superstep"] and step["status"] in OPEN_STEP_STATUSES
        )
        if open_now != state["open"]:
            raise Violation(f"open count {state['open']} but {open_now} open steps")
        for key, wait in state["waits"].items():
            if state["steps"][key]["status"] != "waiting" or wait["node"] != state["steps"][key]["node"]:
                raise Violation(f"wait {key} for a step that is not waiting")
        if msg["type"] in (
            "ActivationCompleted",
            "ActivationFailed",
            "ActivationCancelled",
            "ChildRunFinished",
        ):
            settled = [
                e
                for e in decision.events
                if (
                    e["type"] in ("StepSucceeded", "StepFailed")
                    or (e["type"] == "StepCancelled" and e.get("stop"))
                )
                and (e["node"], e["lineage"], e["attempt"]) == (msg["node"], msg["lineage"], msg["attempt"])
            ]
            if settled:
                for name, value in _usage(msg).items():
                    self.expected_usage[name] += value
        ledger = {name: state["usage"][name] for name in self.expected_usage}
        if ledger != self.expected_usage:
            raise Violation(f"recorded usage {ledger} is not the receipts' sum {self.expected_usage}")

    # ---- what the outside world can do now ---------------------------------------------------
    def choices(self) -> list[str]:
        out = [
            "advance",
            "cancel",
            "signal s0",
            "signal s1",
            "signal nope",
            "signal s0 hostile",
            "approve yes",
            "approve no",
            "approve garbage",
            "resume",
            "resume more",
            "start again",
            "start other",
        ]
        steps = self.state["steps"] if self.state is not None else {}
        for dispatch, act in sorted(self.activations.items()):
            tag = f"{act['node']}[{act['lineage']}]#{act['attempt']}"
            step = steps.get(_key(act))
            # what moves a run is likelier than what it drops: weight the receipts of open attempts
            live = (
                3
                if step is not None
                and step["dispatch_id"] == dispatch
                and step["status"] in ("scheduled", "running", "stopping")
                else 1
            )
            if act["type"] == "ChildRunActivation":
                out += [f"child-ok {dispatch} {tag}"] * live * 2 + [f"child-failed {dispatch} {tag}"] * live
                out += [f"child-cancelled {dispatch} {tag}"] * live
                continue
            out += [
                f"{verb} {dispatch} {tag}"
                for verb in ("accept", "heartbeat", "complete")
                for _ in range(live)
            ]
            out += [
                f"{verb} {dispatch} {tag}" for verb in ("complete-ok", "complete-ok") for _ in range(live)
            ]
            out += [
                f"{verb} {dispatch} {tag}"
                for verb in ("accept-other", "complete-bad", "fail", "fail-retryable", "gave-up")
            ]
            out += [f"{verb} {dispatch} {tag}" for verb in ("stopped", "stopped", "stop-unconfirmed")]
        out += [f"fire {timer_id}" for timer_id in sorted(self.timers) for _ in range(3)]
        out += [f"again {index}" for index in range(max(0, len(self.applied) - 6), len(self.applied))]
        out += [f"repeat {index}" for index in range(max(0, len(self.commands) - 4), len(self.commands))]
        if self.state is not None:
            out.append("bogus receipt")
        return out

    def act(self, choice: str, data: Any) -> None:
        verb, _, rest = choice.partition(" ")
        advance = data.draw(st.integers(0, 60), label="advance ms")
        if verb == "advance":
            self.now += data.draw(st.integers(0, 3000), label="time passes")
            return
        # a command's idempotency key: none (its record id, fresh each time) or one of a few, shared
        key = data.draw(st.sampled_from([None, None, None, "k0", "k1", "k2"]), label="key")
        if verb == "cancel":
            self.send({"type": "CancelRun", "reason": "test", "idempotency_key": key}, advance=advance)
        elif verb == "signal":
            name, _, hostile = rest.partition(" ")
            payload = deep(80) if hostile else data.draw(st.sampled_from(PAYLOADS), label="payload")
            self.send(
                {"type": "SignalRun", "signal": name, "payload": payload, "idempotency_key": key},
                advance=advance,
            )
        elif verb == "approve":
            payload = {"yes": {"approved": True}, "no": {"approved": False, "reason": "no"}}.get(
                rest, {"ok": 1}
            )
            self.send(
                {"type": "SignalRun", "signal": "ok-poke", "payload": payload, "idempotency_key": key},
                advance=advance,
            )
        elif verb == "resume":
            budgets = None
            if rest == "more":
                budgets = {
                    "max_steps": 60,
                    "max_tokens": 2000,
                    "max_cost_micros": 2000,
                    "wall_time_ms": 20000,
                    "max_agents": 20,
                    "max_retries": 20,
                }
            self.send(
                {"type": "ResumeRun", "budgets": budgets, "reason": "test", "idempotency_key": key},
                advance=advance,
            )
        elif verb == "start":
            run_input = self.run_input if rest == "again" else {"other": 1}
            self.send(
                self.start_message(run_input),
                advance=advance,
                duplicate=rest == "again" and self.state is not None,
            )
        elif verb == "fire":
            timer = self.timers[rest]
            late = data.draw(st.integers(0, 200), label="timer lateness")
            self.send(dict(timer), advance=max(timer["due_ms"] - self.now, 0) + late)
        elif verb == "again":
            self.send(dict(self.applied[int(rest)]), duplicate=True)
        elif verb == "repeat":  # a keyed command the run applied, sent again (a client's retry)
            self.send(dict(self.commands[int(rest)]), duplicate=True)
        elif verb == "bogus":
            attempt = data.draw(st.integers(0, 5), label="bogus attempt")
            node = data.draw(st.sampled_from(sorted(self.definition.nodes)), label="bogus node")
            self.send(
                {
                    "type": "ActivationCompleted",
                    "node": node,
                    "lineage": "",
                    "attempt": attempt,
                    "dispatch_id": data.draw(st.sampled_from(["x", dispatch_id(RUN, node, "", attempt)])),
                    "worker_id": "w1",
                    "output": {"v": 1},
                },
                advance=advance,
            )
        else:
            dispatch = rest.split(" ")[0]
            self.send(self.receipt(verb, self.activations[dispatch], data), advance=advance)

    def receipt(self, verb: str, act: dict[str, Any], data: Any) -> dict[str, Any]:
        ident = {name: act[name] for name in ("node", "lineage", "attempt", "dispatch_id")}
        usage = data.draw(
            st.sampled_from(USAGES),
            label="usage",
        )
        if verb in ("accept", "accept-other", "heartbeat"):
            worker = "w2" if verb == "accept-other" else "w1"
            mtype = "ActivationHeartbeat" if verb == "heartbeat" else "ActivationAccepted"
            lease = data.draw(st.sampled_from([act.get("lease_ms") or 500, 50, 5000]), label="lease")
            return {"type": mtype, **ident, "worker_id": worker, "lease_ms": lease}
        if verb in ("complete", "complete-ok"):
            if _is_turn(act):
                menu = (
                    TURN_OUTPUTS
                    if verb == "complete"
                    else [*TURN_OUTPUTS[:2] * 2, TURN_OUTPUTS[3], ANSWER_TURN]
                )
                output = data.draw(st.sampled_from(menu), label="turn output")
            else:
                output = (
                    data.draw(st.sampled_from(OUTPUTS), label="output") if verb == "complete" else {"v": 1}
                )
            return {
                "type": "ActivationCompleted",
                **ident,
                "worker_id": "w1",
                "output": output,
                "usage": usage,
            }
        if verb == "complete-bad":
            output = data.draw(st.sampled_from([deep(70), deep(300)]), label="hostile output")
            return {
                "type": "ActivationCompleted",
                **ident,
                "worker_id": "w1",
                "output": output,
                "usage": usage,
            }
        if verb in ("fail", "fail-retryable"):
            code = data.draw(st.sampled_from(["ExecutionFailed", "PermissionDenied", "Timeout", "Weird"]))
            return {
                "type": "ActivationFailed",
                **ident,
                "worker_id": "w1",
                "code": code,
                "message": "boom",
                "retryable": verb == "fail-retryable",
                "usage": usage,
            }
        if verb == "gave-up":  # an executor that predates `confirmed`: it stopped
            return {"type": "ActivationCancelled", **ident, "worker_id": "w1", "reason": "shutting down"}
        if verb in ("stopped", "stop-unconfirmed"):
            return {
                "type": "ActivationCancelled",
                **ident,
                "worker_id": "w1",
                "reason": "run cancelled",
                "confirmed": verb == "stopped",
            }
        status = {"child-ok": "succeeded", "child-cancelled": "cancelled"}.get(verb, "failed")
        return self.child_receipt(act, status, data, usage)

    def child_receipt(
        self, act: dict[str, Any], status: str, data: Any, usage: dict[str, Any]
    ) -> dict[str, Any]:
        ident = {name: act[name] for name in ("node", "lineage", "attempt", "dispatch_id")}
        output = data.draw(st.sampled_from(OUTPUTS), label="child output") if status == "succeeded" else None
        failure = (
            None
            if status == "succeeded"
            else {"code": "ExecutionFailed", "message": "child broke", "retryable": False}
        )
        return {
            "type": "ChildRunFinished",
            **ident,
            "child_run_id": act["child_run_id"],
            "status": status,
            "output": output,
            "failure": failure,
            "usage": usage,
        }

    def start_message(self, run_input: Any) -> dict[str, Any]:
        return {"type": "StartRun", "definition_id": "wf", "revision": None, "input": run_input}

    # ---- liveness ---------------------------------------------------------------------------
    def drain(self, limit: int = 3000) -> str:
        """Answer every activation and fire every timer until the run is terminal, paused or
        waiting for a signal; raise if it stays running with nothing that could move it."""
        for _ in range(limit):
            state = self.state
            if state is None:
                return "rejected"
            status = run_status(state)
            if status in TERMINAL_STATUSES or status in ("paused", "waiting"):
                if status == "waiting" and not state["waits"]:
                    raise Violation("waiting with no wait")
                STATS[f"drained: {status}"] += 1
                return status
            step = self._next_open_step()
            if step is not None:
                self._answer(step)
                continue
            if self.timers:
                timer = min(self.timers.values(), key=lambda t: (t["due_ms"], t["timer_id"]))
                self.send(dict(timer), advance=max(timer["due_ms"] - self.now, 0))
                continue
            raise Violation(
                f"run stuck {status}: nothing in flight, no timer armed; frontier "
                f"{state['frontier']}, open {state['open']}"
            )
        raise Violation(f"run still {run_status(self.state or {})} after {limit} drain inputs")

    def _next_open_step(self) -> dict[str, Any] | None:
        assert self.state is not None
        superstep = self.state["superstep"]
        for key in sorted(self.state["steps"]):
            step = self.state["steps"][key]
            if (
                step["superstep"] == superstep
                and step["status"] in ("scheduled", "running", "stopping")
                and step["kind"] in DISPATCHED
                and "loop" not in step  # an agent loop's step: its turns and calls are activated
            ):
                return step
        return None

    def _answer(self, step: dict[str, Any]) -> None:
        act = self.activations.get(step["dispatch_id"])
        if act is None:
            raise Violation(f"step {_key(step)} is {step['status']} but was never activated")
        ident = {name: step[name] for name in ("node", "lineage", "attempt", "dispatch_id")}
        stopping = step["status"] == "stopping"
        if stopping and step["kind"] != "workflow":
            self.send(
                {
                    "type": "ActivationCancelled",
                    **ident,
                    "worker_id": "w1",
                    "reason": "stop",
                    "confirmed": True,
                },
                advance=1,
            )
            return
        if step["kind"] == "workflow":
            self.send(
                {
                    "type": "ChildRunFinished",
                    **ident,
                    "child_run_id": act["child_run_id"],
                    "status": "cancelled" if stopping else "succeeded",
                    "output": {"v": 1},
                    "failure": None,
                    "usage": {},
                },
                advance=1,
            )
            return
        if step["status"] == "scheduled":
            self.send(
                {"type": "ActivationAccepted", **ident, "worker_id": "w1", "lease_ms": 10_000}, advance=1
            )
            return
        self.send(
            {
                "type": "ActivationCompleted",
                **ident,
                "worker_id": "w1",
                "output": _drained_turn(step) if _is_turn(step) else {"v": 1},
                "usage": {"prompt_tokens": 1},
            },
            advance=1,
        )


def _drained_turn(step: dict[str, Any]) -> Any:
    """How the drain answers a model turn: the first asks for both tools, later ones answer."""
    loop = split_loop_lineage(step["lineage"])
    assert loop is not None
    STATS["turns drained"] += 1
    return TURN_OUTPUTS[3 if STATS["turns drained"] % 2 else 1] if loop[1] == 1 else ANSWER_TURN


def _is_turn(item: dict[str, Any]) -> bool:
    """A model turn of an agent loop (`node[~t]`, not a tool call `node[~t.i]`)."""
    loop = split_loop_lineage(item["lineage"])
    return loop is not None and loop[2] is None


def _key(item: dict[str, Any]) -> str:
    return f"{item['node']}[{item['lineage']}]" if item["lineage"] else item["node"]


def _in_flight(state: dict[str, Any]) -> int:
    superstep = state["superstep"]
    return sum(
        1
        for step in state["steps"].values()
        if step["superstep"] == superstep
        and step["status"] in ("scheduled", "running", "retry_wait")
        and step["kind"] in DISPATCHED
        and not is_loop_lineage(step["lineage"])  # an agent loop holds one slot, its step's
    )


def _usage(msg: dict[str, Any]) -> dict[str, int]:
    """What the rules say a receipt's usage counts: non-negative integers; anything else is 0."""
    raw = msg.get("usage") if isinstance(msg.get("usage"), dict) else {}
    out = {}
    for name in ("prompt_tokens", "completion_tokens", "cost_micros"):
        value = raw.get(name)
        out[name] = value if type(value) is int and value >= 0 else 0
    return out
