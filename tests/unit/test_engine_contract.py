"""Every event, activation and timer the engine emits is in docs/messages.md and encodes
through the Avro codec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from engine_harness import RunHarness, definition

from processors.engine.evolve import EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "messages.md"


def documented_records() -> set[str]:
    return set(re.findall(r"^\| ([A-Z][A-Za-z]+) \|", DOC.read_text(encoding="utf-8"), flags=re.M))


def exercise() -> list[RunHarness]:
    """Scenarios that between them emit every event type."""
    act = {"kind": "action", "action": "do"}
    runs = []
    d = definition(
        {
            "a": {**act, "retry": {"max_attempts": 2}, "timeout_ms": 100},
            "b": {**act, "on_failure": "skip_dependents"},
            "c": act,
            "review": {"kind": "wait", "signal": "go", "timeout_ms": 50},
            "nap": {"kind": "sleep", "duration_ms": 5},
            "agent": {"kind": "agent", "agent": "x", "model": "m", "prompt": "hi"},
        },
        entry=["a", "b"],
        routes={"a": ["review"], "b": ["c"], "review": ["nap"], "nap": ["agent"]},
        budgets={"max_tokens": 10, "wall_time_ms": 10_000},
    )
    h = RunHarness(d).start({})
    h.signal("go", {"early": True})
    h.accept("a").heartbeat("a").fail("a", retryable=True).fire("retry_backoff", "a")
    h.accept("a").complete("a", 1).complete("a", 2)  # conflict
    h.fail("b").fire("sleep", "nap")
    h.complete("agent", 1, usage={"prompt_tokens": 11}).resume({"max_tokens": 100})
    runs.append(h)
    h2 = RunHarness(d, run_id="r-2").start({}).complete("a", 1).complete("b", 1).complete("c", 1)
    h2.fire("wait_timeout", "review")
    h2.start({"different": True})  # RunRejected
    runs.append(h2)
    h3 = RunHarness(d, run_id="r-3").start({}).accept("a").cancel(key="c-1").stop_all()
    h3.cancel(key="c-1")  # CommandDeduplicated
    runs.append(h3)
    child = definition({"c": act}, id="child")
    parent = definition({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}}, id="parent")
    h4 = RunHarness(child, parent, run_id="r-4")
    h4.root_id = "parent"
    h4.start({}).cancel().stop_all()
    runs.append(h4)
    h5 = RunHarness(d, run_id="r-5").start({}).complete("a", 1).complete("b", 1).complete("c", 1)
    h5.fire("wall_time")
    runs.append(h5)
    h6 = RunHarness(definition({"a": act}, budgets={"max_tokens": 10}), run_id="r-6").start({})
    runs.append(h6.complete("a", 1, usage={"prompt_tokens": 9}))
    return runs


def all_events(runs: list[RunHarness]) -> list[dict[str, Any]]:
    out = []
    for h in runs:
        out.extend(h.log)
    out.extend(e for h in runs for e in h.last.events if e["sequence"] == 0)
    return out


def test_every_emitted_event_type_is_documented() -> None:
    runs = exercise()
    emitted = {e["type"] for e in all_events(runs)}
    assert emitted == EVENT_TYPES, f"not exercised: {sorted(EVENT_TYPES - emitted)}"
    documented = documented_records()
    assert documented >= EVENT_TYPES
    kinds = {m["type"] for h in runs for m in h.messages}
    assert kinds == {"ActionActivation", "CancelActivation", "ChildRunActivation", "ChildRunCancel"}
    assert kinds <= documented


def test_events_activations_and_timers_encode() -> None:
    codec_module = pytest.importorskip("schemas.codec")
    codec = codec_module.Codec.default()
    runs = exercise()
    for event in all_events(runs):
        assert codec.decode("run_events", codec.encode("run_events", event))["type"] == event["type"]
    for h in runs:
        for message in h.messages:
            topic = "child_activations" if message["type"].startswith("ChildRun") else "activations"
            codec.encode(topic, message)
        for timer in h.timers.values():
            codec.encode("receipts", {**timer, "ts_ms": timer["due_ms"], "record_id": timer["timer_id"]})
