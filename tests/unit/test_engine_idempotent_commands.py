"""Idempotent commands (issue 44): a run applies each CancelRun, SignalRun and ResumeRun key once.

A stateful hypothesis machine sends keyed commands in any order to a run that can take many of
them (a wait node in a loop, a step budget that pauses it, resumes, a cancel): fresh keys, keys
used before, exact redeliveries of an earlier record, commands with no explicit key (their record
id is the key). After every input it checks what the rules promise, against its own model of
the keys applied, not against how the engine computes it:

- a key applied before is answered with one `CommandDeduplicated` (sequence 0) naming the event
  that answered it first, and the run is unchanged;
- a command applied for the first time emits exactly one event carrying its key, of a type that
  answers commands (KEYED_ANSWERS), so every key has at most one effect;
- a rejected or unchanged command leaves no key behind (a later one with that key may apply);
- sequences stay gap-free from 1, and folding the events read back through the Avro codec gives
  the live state byte for byte; the machine sometimes continues from `load_state(dump_state)`
  (what a processor restoring from its store or snapshot holds), so the keys survive a restore.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from processors.engine import Catalog, EngineContext, decide, dump_state, evolve, load_state
from processors.engine.ids import command_key
from processors.engine.vocabulary import KEY_CHARS, KEY_WINDOW, KEYED_ANSWERS
from schemas import Codec

RUN = "r-1"
# A wait node in a loop takes a signal per superstep; max_steps pauses it now and then (a resume
# raises it), and a signal while paused is buffered: every keyed command has something to do.
LOOP = {
    "schema": "runfold.workflow/v1",
    "id": "loop",
    "revision": 1,
    "entry": ["w"],
    "nodes": {"w": {"kind": "wait", "signal": "go", "writes": {"n": {"from": "literal", "value": 1}}}},
    "routes": {"w": ["w"]},
    "state": {"n": 0},
    "reducers": {"n": "sum"},
    "budgets": {"max_steps": 4},
}
CODEC = Codec.default()
KEYS = st.sampled_from(["k0", "k1", "k2", "k3", "k4", "k" * KEY_CHARS])


def context() -> EngineContext:
    catalog = Catalog()
    catalog.register(LOOP)
    return EngineContext(catalog=catalog)


def wire(event: dict[str, Any]) -> dict[str, Any]:
    """The event as a consumer reads it back from the run-events topic."""
    return CODEC.decode("run_events", CODEC.encode("run_events", event))


class KeyedCommands(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctx = context()
        self.now = 1_000_000
        self.records = 0
        self.state: dict[str, Any] | None = None
        self.replay: dict[str, Any] | None = None
        self.sequence = 0
        self.applied: dict[str, tuple[int, str]] = {}  # the model: key -> its answer
        self.sent: list[dict[str, Any]] = []  # every keyed command sent, for exact redeliveries
        self.max_steps = 4
        self.effects: dict[str, int] = {}  # key -> events that carried it
        self._send({"type": "StartRun", "definition_id": "loop", "revision": None, "input": {}})

    # ---- driving ----------------------------------------------------------------------------
    def _send(self, body: dict[str, Any], record_id: str | None = None) -> None:
        self.now += 10
        self.records += 1
        msg = {"run_id": RUN, "ts_ms": self.now, "record_id": record_id or f"in-{self.records}", **body}
        self._decide(msg)

    def _decide(self, msg: dict[str, Any]) -> None:
        before = self.state
        decision = decide(before, msg, self.ctx)
        for event in decision.events:
            self.state = evolve(self.state, event)
            self.replay = evolve(self.replay, wire(event))
            if event["sequence"]:
                assert event["sequence"] == self.sequence + 1, "sequence gap"
                self.sequence = event["sequence"]
        if msg["type"] == "StartRun":
            return
        self.sent.append(msg)
        key, problem = command_key(msg.get("idempotency_key"), msg["record_id"])
        assert problem is None and key is not None
        carried = [e for e in decision.events if e.get("idempotency_key") == key and e["sequence"]]
        if key in self.applied:
            sequence, etype = self.applied[key]
            assert [e["type"] for e in decision.events] == ["CommandDeduplicated"], decision.events
            answer = decision.events[0]
            assert (answer["sequence"], answer["answer_sequence"], answer["answer_type"]) == (
                0,
                sequence,
                etype,
            )
            assert answer["idempotency_key"] == key and answer["command_type"] == msg["type"]
            assert answer["record_id"] == f"{RUN}:duplicate:{msg['record_id']}"
            assert self.state is before, "a repeat changed the run"
            return
        if any(e["sequence"] for e in decision.events):  # applied: exactly one event carries its key
            assert len(carried) == 1, [e["type"] for e in decision.events]
            assert carried[0]["type"] in KEYED_ANSWERS
            self.applied[key] = (carried[0]["sequence"], carried[0]["type"])
            self.effects[key] = self.effects.get(key, 0) + 1
        else:  # rejected (its answer names the key) or unchanged: no key is kept
            assert all(e["type"] == "RunRejected" for e in decision.events)
            assert all(e["idempotency_key"] == key for e in decision.events)
            assert key not in ((self.state or {}).get("command_keys") or {})

    # ---- rules ------------------------------------------------------------------------------
    @rule(key=st.one_of(st.none(), KEYS), payload=st.sampled_from([{"ok": True}, {"n": 2}]))
    def signal(self, key: str | None, payload: Any) -> None:
        self._send({"type": "SignalRun", "signal": "go", "payload": payload, "idempotency_key": key})

    @rule(key=st.one_of(st.none(), KEYS), more=st.integers(0, 4))
    def resume(self, key: str | None, more: int) -> None:
        self.max_steps += more
        body = {
            "type": "ResumeRun",
            "budgets": {"max_steps": self.max_steps},
            "reason": "",
            "idempotency_key": key,
        }
        self._send(body)

    @rule(key=st.one_of(st.none(), KEYS), weight=st.integers(0, 4))
    def cancel(self, key: str | None, weight: int) -> None:
        if weight == 0:  # rarer: it ends the run (whose keys still answer repeats)
            self._send({"type": "CancelRun", "reason": "enough", "idempotency_key": key})

    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """The same record again (a producer's retry, a redelivery): its record id or key is known."""
        if self.sent:
            msg = data.draw(st.sampled_from(self.sent))
            self.now += 10
            self._decide({**msg, "ts_ms": self.now})

    @rule(key=KEYS)
    def same_key_other_command(self, key: str) -> None:
        """A key reused by another sender for another command is still the first one's."""
        if key in self.applied:
            self._send({"type": "CancelRun", "reason": "other", "idempotency_key": key})

    @rule()
    def restore(self) -> None:
        """Go on from the state as the store holds it."""
        if self.state is not None:
            self.state = load_state(dump_state(self.state))

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def replay_equals_live(self) -> None:
        assert self.state is not None and self.replay is not None
        assert dump_state(self.replay) == dump_state(self.state)

    @invariant()
    def one_effect_per_key(self) -> None:
        assert all(count == 1 for count in self.effects.values())
        kept = (self.state or {}).get("command_keys") or {}
        assert {key: tuple(answer) for key, answer in kept.items()} == self.applied


KeyedCommands.TestCase.settings = settings(
    max_examples=int(os.environ.get("RUNFOLD_IDEMPOTENCY_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKeyedCommands = KeyedCommands.TestCase


# ------------------------------------------------------------------------------ deterministic


def run_waiting() -> tuple[EngineContext, dict[str, Any]]:
    ctx = context()
    start = {
        "type": "StartRun",
        "run_id": RUN,
        "ts_ms": 1,
        "record_id": "s",
        "definition_id": "loop",
        "input": {},
    }
    state = decide(None, start, ctx).state_after(None)
    assert state is not None
    return ctx, state


def signal(key: str | None, record_id: str, ts: int = 2) -> dict[str, Any]:
    return {
        "type": "SignalRun",
        "run_id": RUN,
        "ts_ms": ts,
        "record_id": record_id,
        "signal": "go",
        "payload": {},
        "idempotency_key": key,
    }


def test_the_window_keeps_the_last_keys_applied_and_a_forgotten_key_applies_again() -> None:
    """docs/semantics.md, "Idempotent commands": the last KEY_WINDOW keys; beyond it a repeat is
    a new command. A paused run buffers every signal, so each one is applied."""
    ctx, state = run_waiting()
    for index in range(4):  # through max_steps 4: paused
        state = decide(state, signal(f"warm-{index}", f"w{index}"), ctx).state_after(state)
    assert state is not None and state["status"] == "paused"
    for index in range(KEY_WINDOW):
        decision = decide(state, signal(f"k{index}", f"r{index}"), ctx)
        assert [e["type"] for e in decision.events] == ["SignalReceived"]
        state = decision.state_after(state)
    assert state is not None and len(state["command_keys"]) == KEY_WINDOW
    assert "warm-0" not in state["command_keys"] and "k0" in state["command_keys"]
    again = decide(state, signal("k0", "again-0"), ctx)
    assert [e["type"] for e in again.events] == ["CommandDeduplicated"]
    forgotten = decide(state, signal("warm-3", "again-w3"), ctx)  # the 4 oldest went first
    assert [e["type"] for e in forgotten.events] == ["SignalReceived"]
    after = forgotten.state_after(state)
    assert after is not None and "k0" not in after["command_keys"] and "warm-3" in after["command_keys"]
    assert len(after["command_keys"]) == KEY_WINDOW


def test_a_repeat_after_the_run_ended_gets_the_original_answer_not_a_conflict() -> None:
    ctx, state = run_waiting()
    first = decide(state, signal("once", "a"), ctx)
    state = first.state_after(state)
    assert state is not None
    answered = first.events[0]
    assert answered["type"] == "SignalReceived" and answered["idempotency_key"] == "once"
    cancel = {"type": "CancelRun", "run_id": RUN, "ts_ms": 3, "record_id": "c", "reason": ""}
    state = decide(state, cancel, ctx).state_after(state)
    assert state is not None and state["status"] == "cancelled"
    repeat = decide(state, signal("once", "b", ts=4), ctx)
    assert repeat.events == [
        {
            "type": "CommandDeduplicated",
            "run_id": RUN,
            "ts_ms": 4,
            "record_id": f"{RUN}:duplicate:b",
            "sequence": 0,
            "command_type": "SignalRun",
            "idempotency_key": "once",
            "answer_sequence": answered["sequence"],
            "answer_type": "SignalReceived",
        }
    ]
    assert repeat.dropped == "duplicate command"
    fresh = decide(state, signal("other", "d", ts=4), ctx)  # a new key meets the rules of now
    assert fresh.events[0]["type"] == "RunRejected" and fresh.events[0]["code"] == "Conflict"


def test_the_key_defaults_to_the_record_id_and_a_long_one_is_kept_as_its_digest() -> None:
    ctx, state = run_waiting()
    decision = decide(state, signal(None, "rec-1"), ctx)
    assert decision.events[0]["idempotency_key"] == "rec-1"
    state = decision.state_after(state)
    assert decide(state, signal("", "rec-1"), ctx).events[0]["type"] == "CommandDeduplicated"
    assert decide(state, signal("rec-1", "other"), ctx).events[0]["type"] == "CommandDeduplicated"
    long_id = "x" * (KEY_CHARS + 1)
    key, problem = command_key(None, long_id)
    assert problem is None and key is not None and key.startswith("sha256:") and len(key) == 71
    assert command_key(None, "x" * KEY_CHARS) == ("x" * KEY_CHARS, None)
    assert decide(state, signal(None, long_id), ctx).events[0]["idempotency_key"] == key


def test_an_explicit_key_longer_than_the_limit_is_rejected() -> None:
    ctx, state = run_waiting()
    decision = decide(state, signal("k" * (KEY_CHARS + 1), "rec"), ctx)
    [event] = decision.events
    assert event["type"] == "RunRejected" and event["code"] == "InvalidInput"
    assert (
        event["reason"]
        == f"idempotency_key is {KEY_CHARS + 1} characters; at most {KEY_CHARS} (a UUID is 36)"
    )
    assert "idempotency_key" not in event and decision.state_after(state) is state
    hostile = decide(state, {**signal(None, "rec"), "idempotency_key": 7}, ctx)
    assert hostile.events[0]["reason"] == "idempotency_key must be a string"


def test_a_cancel_that_waits_for_stops_carries_its_key_on_run_cancelling_only() -> None:
    from engine_harness import RunHarness, definition

    h = RunHarness(definition({"a": {"kind": "action", "action": "do"}})).start({}).accept("a")
    h.cancel(key="stop-1")
    assert h.types == ["StepStopping", "RunCancelling"] and h.last.events[-1]["idempotency_key"] == "stop-1"
    h.cancel(key="stop-1")
    assert h.last.events[0]["answer_type"] == "RunCancelling"
    h.stopped("a")
    assert h.types == ["StepCancelled", "RunCancelled"] and "idempotency_key" not in h.last.events[-1]
    h.cancel(key="stop-1")
    assert h.last.events[0]["type"] == "CommandDeduplicated"
    assert h.state is not None and h.state["command_keys"] == {
        "stop-1": [h.log[-3]["sequence"], "RunCancelling"]
    }


def test_processors_testing_sees_the_keys() -> None:
    """docs/testing.md: the in-memory environment folds with the same engine."""
    from processors.testing import WorkflowEnvironment

    wait = {**LOOP, "id": "once", "routes": {}, "budgets": {}}
    with WorkflowEnvironment(wait) as env:
        run = env.start("once", {})
        first = run.signal("go", {"ok": True}, idempotency_key="k")
        assert first[0]["type"] == "SignalReceived"
        again = run.signal("go", {"ok": True}, idempotency_key="k")
        assert [(e["type"], e["answer_sequence"]) for e in again] == [
            ("CommandDeduplicated", first[0]["sequence"])
        ]
        result = run.settle()
    result.assert_succeeded()
    assert result.event_types.count("SignalReceived") == 1
