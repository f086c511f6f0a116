"""Size limits: nothing a command or receipt carries may make the engine emit a record too
large for Kafka (Ceilings.max_input_bytes, max_payload_bytes, max_state_bytes)."""

from __future__ import annotations

import orjson
from engine_harness import RunHarness, definition

from processors.engine import Ceilings, dump_state

SMALL = Ceilings(max_payload_bytes=1000, max_state_bytes=3000)
BIG = "x" * 2000  # over max_payload_bytes of SMALL


def act(**extra: object) -> dict:
    return {"kind": "action", "action": "do", **extra}


WAIT = {"kind": "wait", "signal": "approval", "writes": {"approved": {"from": "signal"}}}


def test_defaults_stay_well_under_kafkas_default_record_limit() -> None:
    c = Ceilings()
    assert c.max_payload_bytes == 256 * 1024 and c.max_state_bytes == 512 * 1024
    assert c.max_state_bytes < 1_000_000 // 1.5


def test_oversized_start_input_and_labels_are_rejected_with_limit() -> None:
    h = RunHarness(definition({"a": act()}), ceilings=Ceilings(max_input_bytes=100, max_payload_bytes=100))
    h.start({"v": BIG})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Limit" and h.state is None
    h.start({}, labels={"k": BIG})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "Limit"
    assert "labels are" in h.last.events[0]["reason"] and h.state is None


def test_oversized_signal_payload_is_rejected_without_changing_the_run() -> None:
    d = definition({"review": dict(WAIT)}, state={"approved": None})
    h = RunHarness(d, ceilings=SMALL).start({})
    before = dump_state(h.state)
    h.signal("approval", BIG)
    rejected = h.last.events[0]
    assert h.types == ["RunRejected"] and rejected["code"] == "Limit" and rejected["sequence"] == 0
    assert rejected["reason"] == "signal payload of 2002 bytes exceeds max_payload_bytes 1000"
    assert h.last.dropped == "signal payload too large" and dump_state(h.state) == before
    assert BIG not in orjson.dumps(h.last.events).decode()
    h.signal("approval", "ok")  # a payload within the limit is still delivered
    assert h.status == "succeeded" and h.state["state"]["approved"] == "ok"


def test_oversized_action_output_fails_the_attempt_invalid_output_not_retried() -> None:
    d = definition({"a": act(retry={"max_attempts": 3}, on_failure="continue"), "b": act()}, entry=["a", "b"])
    h = RunHarness(d, ceilings=SMALL).start({}).complete("a", {"text": BIG})
    failed = h.last.events[0]
    assert h.types == ["StepFailed"]  # not retried although the node has attempts left
    assert failed["failure"]["code"] == "InvalidOutput" and failed["failure"]["retryable"] is False
    assert failed["failure"]["message"] == "output of 2011 bytes exceeds max_payload_bytes 1000"
    assert h.step("a")["output"] is None and BIG not in dump_state(h.state).decode()
    h.complete("a", {"text": BIG})  # the same receipt again: a duplicate, not a conflict
    assert h.last.dropped == "duplicate receipt"
    h.complete("b", 1)
    assert h.status == "succeeded"


def test_agent_output_within_the_limit_succeeds() -> None:
    d = definition({"a": {"kind": "agent", "agent": "x", "model": "m", "prompt": "p"}})
    h = RunHarness(d, ceilings=SMALL).start({}).complete("a", "y" * 900)
    assert h.status == "succeeded"


def test_oversized_child_output_fails_the_step_invalid_output() -> None:
    child = definition({"c": act()}, id="child")
    parent = definition({"sub": {"kind": "workflow", "workflow": "child", "revision": 1}})
    h = RunHarness(child, parent, ceilings=SMALL)
    h.root_id = "wf"
    h.start({}).child_finished("sub", output={"r": BIG})
    failure = h.state["failure"]
    assert failure["code"] == "InvalidOutput" and "exceeds max_payload_bytes 1000" in failure["message"]
    assert failure["node"] == "sub" and h.status == "failed"


def test_state_growing_past_max_state_bytes_fails_the_run_with_a_small_event() -> None:
    # A loop appends a 500-byte output each superstep: the 6th merge would pass 3000 bytes.
    d = definition(
        {"grow": act(writes={"notes": {"from": "output"}})},
        routes={"grow": [{"to": "grow", "when": "size(state.notes) < 100"}]},
        state={"notes": []},
        reducers={"notes": "append"},
    )
    h = RunHarness(d, ceilings=SMALL).start({})
    for _ in range(5):
        h.complete("grow", "z" * 500)
        assert h.types[-2:] == ["SuperstepCommitted", "StepScheduled"]
    h.complete("grow", "z" * 500)
    assert h.types == ["StepSucceeded", "RunFailed"]
    failure = h.state["failure"]
    assert failure["code"] == "State" and failure["message"].startswith("state of ")
    assert "after superstep 6 exceeds max_state_bytes 3000" in failure["message"]
    assert len(orjson.dumps(h.last.events[-1])) < 1000  # the failure never carries the state
    assert len(h.state["state"]["notes"]) == 5  # the oversized merge was not applied
    assert dump_state(h.state) == h.refold()


def test_long_free_text_is_cut_before_it_is_copied_into_events() -> None:
    d = definition({"a": act(), "b": act()}, entry=["a", "b"])
    h = RunHarness(d).start({}).fail("a", message="m" * 100_000).stop_all()
    assert len(h.state["failure"]["message"]) == 4000
    h2 = RunHarness(d, run_id="r-2").start({}).cancel("c" * 100_000)
    assert all(len(e.get("reason") or "") < 1100 for e in h2.last.events)
    assert all(len(e.get("step_reason") or "") < 1100 for e in h2.last.events)
    h2.stop_all()
    assert len(h2.state["cancel_reason"]) == 1000 and h2.status == "cancelled"
    h3 = RunHarness(definition({"a": act()}, budgets={"max_steps": 1}), run_id="r-3").start({})
    h3.fail("a")
    h3.resume({"k" * 100_000: 1})
    assert h3.types == ["RunRejected"] and len(h3.last.events[0]["reason"]) < 200
