"""Safer waits (issue 24, point 4): a wait node's `payload_schema` refuses a signal of the wrong
shape before it reaches the run (RunRejected InvalidInput naming the schema path; the run keeps
waiting, it never fails), and `accept_early: false` refuses a signal sent before the wait is
reached instead of keeping it for later. The default keeps today's behaviour (test_engine_control)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import RunHarness, definition
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine import dump_state
from processors.engine.errors import DefinitionError
from processors.engine.validation import load_definition
from processors.runtime.drop_reasons import FIXED

APPROVAL = {
    "type": "object",
    "required": ["reviewer", "approved"],
    "properties": {"reviewer": {"type": "string"}, "approved": {"type": "boolean"}},
}


def waiting(**wait: Any) -> dict[str, Any]:
    node = {
        "kind": "wait",
        "signal": "approval",
        "writes": {"reviewer": {"from": "signal", "pointer": "/reviewer"}},
        **wait,
    }
    return definition(
        {"review": node, "after": {"kind": "action", "action": "do"}},
        routes={"review": ["after"]},
        state={"reviewer": None},
    )


def late_wait(**wait: Any) -> dict[str, Any]:
    """`a` runs first, so the wait on `approval` is reached only once `a` completes."""
    node = {
        "kind": "wait",
        "signal": "approval",
        "writes": {"reviewer": {"from": "signal", "pointer": "/reviewer"}},
        **wait,
    }
    return definition(
        {"a": {"kind": "action", "action": "do"}, "review": node},
        routes={"a": ["review"]},
        state={"reviewer": None},
    )


def test_a_payload_of_the_wrong_shape_is_rejected_and_the_run_keeps_waiting() -> None:
    h = RunHarness(waiting(payload_schema=APPROVAL)).start({})
    before = h.state
    h.signal("approval", {"approved": True})  # no reviewer: what killed the run before
    assert h.types == ["RunRejected"] and h.last.dropped == "signal payload refused"
    rejection = h.last.events[0]
    assert rejection["code"] == "InvalidInput" and rejection["command_type"] == "SignalRun"
    assert rejection["reason"] == (  # as docs/semantics.md shows it
        "signal 'approval': payload at $ fails 'required': missing 'reviewer' (schema required) "
        "(the payload_schema of review)"
    )
    assert h.state == before and h.status == "waiting"
    h.signal("approval", {"reviewer": 7, "approved": True})
    assert (
        h.types == ["RunRejected"]
        and "at $.reviewer fails 'type': expected string" in (h.last.events[0]["reason"])
    )
    h.signal("approval", {"reviewer": "ana", "approved": True})
    assert h.types[:2] == ["SignalReceived", "StepSucceeded"] and h.state["state"]["reviewer"] == "ana"


def test_the_rejection_names_no_value_of_the_payload() -> None:
    h = RunHarness(waiting(payload_schema=APPROVAL)).start({})
    h.signal("approval", {"reviewer": "s3cr3t-value-xyz", "approved": "yes"})
    assert h.types == ["RunRejected"] and "s3cr3t-value-xyz" not in h.last.events[0]["reason"]
    assert "$.approved" in h.last.events[0]["reason"]


def test_an_early_signal_is_checked_when_it_arrives_not_when_the_wait_is_reached() -> None:
    h = RunHarness(late_wait(payload_schema=APPROVAL)).start({})
    h.signal("approval", {"approved": True})
    assert h.types == ["RunRejected"] and h.state["signals"] == []
    h.signal("approval", {"reviewer": "ana", "approved": False})
    assert h.types == ["SignalReceived"] and len(h.state["signals"]) == 1
    h.complete("a", 1)
    assert h.status == "succeeded" and h.state["state"]["reviewer"] == "ana"


def test_accept_early_false_refuses_a_signal_sent_before_the_wait_is_reached() -> None:
    h = RunHarness(late_wait(accept_early=False)).start({})
    h.signal("approval", {"reviewer": "too-early"})
    assert h.types == ["RunRejected"] and h.last.dropped == "early signal refused"
    assert h.last.events[0]["code"] == "Conflict" and "accept_early: false" in h.last.events[0]["reason"]
    assert h.state["signals"] == []
    h.complete("a", 1)
    assert h.types[-1] == "RunWaiting" and h.status == "waiting"
    h.signal("approval", {"reviewer": "on-time"})
    assert h.status == "succeeded" and h.state["state"]["reviewer"] == "on-time"


def test_the_default_still_keeps_an_early_signal() -> None:
    h = RunHarness(late_wait()).start({}).signal("approval", {"reviewer": "early"})
    assert h.types == ["SignalReceived"] and len(h.state["signals"]) == 1
    h.complete("a", 1)
    assert h.state["state"]["reviewer"] == "early" and h.status == "succeeded"


def test_defaults_leave_the_canonical_definition_and_its_hash_unchanged() -> None:
    plain = load_definition(waiting())
    explicit = load_definition(waiting(accept_early=True, payload_schema=None))
    assert plain.canonical() == explicit.canonical()
    assert "accept_early" not in str(plain.canonical())


def test_an_invalid_payload_schema_is_refused_at_registration() -> None:
    with pytest.raises(DefinitionError) as info:
        load_definition(waiting(payload_schema={"type": "no-such-type"}))
    assert [(i.path, i.rule) for i in info.value.errors] == [("nodes.review.payload_schema", "json_schema")]


@pytest.mark.parametrize("field", ["payload_schema", "accept_early"])
def test_only_a_wait_node_may_declare_them(field: str) -> None:
    value: Any = APPROVAL if field == "payload_schema" else False
    raw = definition({"a": {"kind": "action", "action": "do", field: value}})
    with pytest.raises(DefinitionError) as info:
        load_definition(raw)
    assert [(i.path, i.rule) for i in info.value.errors] == [(f"nodes.a.{field}", "kind_field")]


def test_the_waits_of_one_signal_must_agree_on_its_contract() -> None:
    nodes = {
        "first": {"kind": "wait", "signal": "go", "payload_schema": APPROVAL},
        "second": {"kind": "wait", "signal": "go", "accept_early": False},
    }
    with pytest.raises(DefinitionError) as info:
        load_definition(definition(nodes, entry=["first", "second"]))
    assert sorted((i.path, i.rule) for i in info.value.errors) == [
        ("nodes.second.accept_early", "signal_contract"),
        ("nodes.second.payload_schema", "signal_contract"),
    ]


payloads = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["reviewer", "approved", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=6))
def test_no_sequence_of_signals_fails_a_run_whose_wait_has_a_schema(sent: list[Any]) -> None:
    """Whatever arrives, the run either still waits (every bad payload refused, the state as
    it was) or took the first payload the schema accepts, and re-folding the log gives its state."""
    h = RunHarness(waiting(payload_schema=APPROVAL)).start({})
    for payload in sent:
        was_waiting = h.status == "waiting"
        before = h.state
        h.signal("approval", payload)
        assert h.status != "failed"
        good = (
            isinstance(payload, dict)
            and isinstance(payload.get("reviewer"), str)
            and isinstance(payload.get("approved"), bool)
        )
        if was_waiting and not good:
            assert h.types == ["RunRejected"] and h.state == before
        if was_waiting and good:
            assert h.state["state"]["reviewer"] == payload["reviewer"]
    assert h.state is not None and h.refold() == dump_state(h.state)


def test_the_refusals_are_fixed_metric_labels() -> None:
    h = RunHarness(late_wait(payload_schema=APPROVAL, accept_early=False)).start({})
    h.signal("approval", {})
    refused = h.last.dropped
    h.signal("approval", {"reviewer": "a", "approved": True})
    assert {refused, h.last.dropped} == {"signal payload refused", "early signal refused"} <= FIXED
