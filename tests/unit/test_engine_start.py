"""StartRun: acceptance, rejections (no run left), idempotent and conflicting starts."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from engine_harness import RunHarness, definition

from processors.engine import Ceilings, dump_state, evolve, load_state
from processors.engine.catalog import Catalog

ACTION = {"kind": "action", "action": "do", "writes": {"out": {"from": "output"}}}


def simple(**extra: object) -> dict:
    return definition({"a": dict(ACTION)}, state={"out": None}, **extra)


def test_start_emits_accepted_started_and_first_superstep() -> None:
    h = RunHarness(simple()).start({"topic": "kafka"})
    assert h.types == ["RunAccepted", "RunStarted", "StepScheduled"]
    assert [e["sequence"] for e in h.last.events] == [1, 2, 3]
    assert [e["record_id"] for e in h.last.events] == ["r-1:1", "r-1:2", "r-1:3"]
    accepted = h.last.events[0]
    assert accepted["definition_id"] == "wf" and accepted["revision"] == 1
    assert accepted["bundle"]["hash"] == accepted["bundle_hash"]
    assert h.status == "running"
    assert h.messages[0]["type"] == "ActionActivation" and h.messages[0]["queue"] == "default"


def test_rejected_start_leaves_no_run() -> None:
    h = RunHarness(simple(input_schema={"type": "object", "required": ["topic"]})).start({"nope": 1})
    assert h.types == ["RunRejected"]
    event = h.last.events[0]
    assert event["sequence"] == 0 and event["code"] == "InvalidInput" and "required" in event["reason"]
    assert h.state is None
    assert evolve(None, event) is None


def test_unknown_definition_is_not_found() -> None:
    h = RunHarness(simple())
    h.send({"type": "StartRun", "definition_id": "missing", "input": {}})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "NotFound"


def test_secret_in_input_is_rejected_without_echoing_it() -> None:
    h = RunHarness(simple()).start({"api_key": "hunter2-very-secret"})
    event = h.last.events[0]
    assert event["type"] == "RunRejected" and event["code"] == "InvalidInput"
    assert "hunter2" not in event["reason"] and "input.api_key" in event["reason"]


def test_budget_override_may_only_lower() -> None:
    h = RunHarness(simple(budgets={"max_steps": 10})).start({}, budgets={"max_steps": 11})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Limit"
    h2 = RunHarness(simple(budgets={"max_steps": 10})).start({}, budgets={"max_steps": 5})
    assert h2.types[0] == "RunAccepted" and h2.state["budgets"]["max_steps"] == 5


def test_budget_above_ceiling_is_rejected() -> None:
    h = RunHarness(simple())
    h.ctx = type(h.ctx)(catalog=h.catalog, ceilings=Ceilings(max_steps=5), queues=h.ctx.queues)
    h.start({}, budgets={"max_steps": 6})
    assert h.types == ["RunRejected"] and "ceiling" in h.last.events[0]["reason"]


def test_depth_limit() -> None:
    parent = {
        "parent_run_id": "p",
        "parent_node": "n",
        "parent_lineage": "",
        "parent_dispatch_id": "d",
        "root_run_id": "p",
        "depth": 4,
    }
    # the default max_nesting_depth 4 allows a run tree of 4 levels: depths 0..3 (seeds 001, 003)
    h = RunHarness(simple()).start({}, parent=parent)
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "BudgetExceeded"
    ok = RunHarness(simple()).start({}, parent={**parent, "depth": 3})
    assert ok.types[0] == "RunAccepted" and ok.state["depth"] == 3 and ok.state["root_run_id"] == "p"


def test_unknown_queue_is_rejected() -> None:
    h = RunHarness(definition({"a": {**ACTION, "queue": "gpu"}}, state={"out": None})).start({})
    assert h.types == ["RunRejected"] and "unknown queue 'gpu'" in h.last.events[0]["reason"]


def test_idempotent_start_and_conflict() -> None:
    h = RunHarness(simple()).start({"x": 1})
    before = h.state
    h.start({"x": 1})
    assert h.types == [] and h.last.dropped == "duplicate start"
    h.start({"x": 2})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert h.state is before  # the existing run is untouched


CHILD_OF = {
    "parent_run_id": "p",
    "parent_node": "sub",
    "parent_lineage": "",
    "parent_dispatch_id": "d",
    "root_run_id": "p",
    "depth": 1,
}


def _child_start(h: RunHarness, bundle: Any, **fields: Any) -> RunHarness:
    msg = {"type": "StartRun", "definition_id": "child", "input": {}, "bundle": bundle, "parent": CHILD_OF}
    return h.send({**msg, **fields})


def test_child_start_uses_the_bundle_and_verifies_its_hash() -> None:
    cat = Catalog()
    cat.register(simple(id="child"))
    bundle = cat.pin_bundle("child", 1).to_json()
    h = _child_start(RunHarness(simple(id="child")), bundle)
    assert h.types[0] == "RunAccepted" and h.state["bundle_hash"] == bundle["hash"]
    tampered = {**bundle, "hash": "0" * 64}
    h2 = _child_start(RunHarness(simple(id="child"), run_id="r-2"), tampered)
    assert h2.types == ["RunRejected"] and "hash" in h2.last.events[0]["reason"]


def test_a_bundle_starts_only_a_child_run_of_registered_content() -> None:
    """The bundle decides what the run does and which definition id its activations claim (the
    secrets policy trusts it): only the registered content of each id@revision in it runs, and
    only as a child run (docs/security.md, "Who can write what")."""
    mine = Catalog()
    forged_nodes = {"a": dict(ACTION), "b": dict(ACTION)}
    mine.register(definition(forged_nodes, state={"out": None}, id="child"))  # other content, child@1
    forged = mine.pin_bundle("child", 1).to_json()
    h = _child_start(RunHarness(simple(id="child")), forged)
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Conflict"
    assert "child@1 differs from the registered child@1" in h.last.events[0]["reason"]
    unknown = _child_start(RunHarness(simple()), forged)  # child@1 not registered here
    assert unknown.types == ["RunRejected"] and unknown.last.events[0]["code"] == "NotFound"
    registered = Catalog()
    registered.register(simple(id="child"))
    good = registered.pin_bundle("child", 1).to_json()
    orphan = _child_start(RunHarness(simple(id="child")), good, parent=None)
    assert orphan.types == ["RunRejected"] and orphan.last.events[0]["code"] == "InvalidInput"
    assert "child runs only" in orphan.last.events[0]["reason"]
    # the same bundle again (checked once per catalog) and a real child both start
    catalog_once = RunHarness(simple(id="child"))
    assert _child_start(catalog_once, good).types[0] == "RunAccepted"
    again = RunHarness(simple(id="child"), run_id="r-3")
    again.catalog, again.ctx = catalog_once.catalog, catalog_once.ctx
    assert _child_start(again, good).types[0] == "RunAccepted"


def test_commands_for_unknown_runs_are_not_found() -> None:
    for msg in (
        {"type": "CancelRun"},
        {"type": "SignalRun", "signal": "s", "payload": 1},
        {"type": "ResumeRun"},
    ):
        h = RunHarness(simple()).send(msg)
        assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "NotFound"
    h = RunHarness(simple()).send(
        {
            "type": "ActivationCompleted",
            "node": "a",
            "lineage": "",
            "attempt": 1,
            "dispatch_id": "x",
            "worker_id": "w",
            "output": 1,
            "usage": {},
        }
    )
    assert h.types == [] and h.last.dropped == "unknown run"


def test_malformed_messages_are_dropped_with_a_reason() -> None:
    h = RunHarness(simple()).start({})
    h.send({"type": "Bogus"})
    assert h.last.dropped == "unknown message type 'Bogus'"
    h.send({"type": "ActivationCompleted", "node": "a"})
    assert h.last.dropped is not None and "lineage" in h.last.dropped


def test_state_bytes_of_a_shared_bundle_are_the_plain_canonical_bytes() -> None:
    h = RunHarness(simple()).start({"topic": "kafka"})
    state = h.state
    assert state is not None
    plain = orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
    assert dump_state(state) == plain and dump_state(state) == plain  # computed, then cached
    # a bundle that is not the pin's own object (a decoded snapshot, a restored run) is dumped as is
    other = {**state, "bundle": copy.deepcopy(state["bundle"])}
    other["bundle"]["root"] = "tampered@1"
    assert dump_state(other) == orjson.dumps(other, option=orjson.OPT_SORT_KEYS) != plain


def test_a_state_from_bytes_or_from_its_events_holds_the_pins_bundle_object() -> None:
    """One copy of a pin's bundle for all its runs, however a state was made (restore, store
    read, live): about half a running run's state in memory; and the bytes are unchanged."""
    h = RunHarness(simple()).start({"topic": "kafka"})
    live = h.state
    assert live is not None
    raw = dump_state(live)
    loaded_1, loaded_2 = load_state(raw), load_state(raw)
    assert loaded_1["bundle"] is loaded_2["bundle"] is live["bundle"]
    assert dump_state(loaded_1) == raw and loaded_1 == live
    # a restore folds the decoded events: RunAccepted's bundle arrives as a fresh copy per run
    restored = None
    for event in h.log:
        restored = evolve(restored, orjson.loads(orjson.dumps(event)))
    assert restored is not None and restored["bundle"] is live["bundle"] and dump_state(restored) == raw


def test_a_run_id_with_a_control_character_is_rejected() -> None:
    # the store joins a run id and a timer id with \x1f: "a" and "a\x1fb" would share keys
    h = RunHarness(simple(), run_id="a\x1fb").start({"topic": "kafka"})
    assert h.state is None and h.types == ["RunRejected"]
    assert h.last.events[0]["code"] == "InvalidInput" and "'\\x1f'" in h.last.events[0]["reason"]
