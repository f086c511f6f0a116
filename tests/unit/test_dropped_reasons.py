"""`dropped_inputs{reason}` has a fixed set of labels, whatever free text the engine's decisions give."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from processors.engine import Catalog, EngineContext, decide
from processors.runtime.drop_reasons import FIXED, LABELS, MALFORMED, NOT_APPLICABLE, OTHER, dropped_reason
from processors.runtime.metrics import ProcessorMetrics

CTX = EngineContext(catalog=Catalog())
TYPES = ["StartRun", "CancelRun", "SignalRun", "ResumeRun", "ActivationAccepted", "TimerFired", "Nope", 7]
values = st.one_of(st.none(), st.integers(), st.text(max_size=30), st.lists(st.integers(), max_size=3))


@st.composite
def hostile(draw: st.DrawFn) -> Any:
    msg: dict[str, Any] = {
        k: draw(values)
        for k in draw(st.lists(st.sampled_from(["definition_id", "signal", "node"]), max_size=3))
    }
    msg["type"] = draw(st.sampled_from(TYPES))
    if draw(st.booleans()):
        msg["run_id"] = draw(st.one_of(st.text(min_size=1, max_size=20), st.integers()))
    if draw(st.booleans()):
        msg["ts_ms"] = draw(st.one_of(st.integers(0, 2**40), st.text(max_size=3)))
    msg["record_id"] = "x"
    return msg if draw(st.integers(0, 9)) else draw(values)


@settings(max_examples=300, deadline=None)
@given(hostile())
def test_every_reason_the_engine_gives_maps_into_the_fixed_set(msg: Any) -> None:
    decision = decide(None, msg, CTX)
    if decision.dropped is not None:
        assert dropped_reason(decision.dropped) in LABELS


@given(st.text(max_size=200))
def test_any_text_maps_into_the_fixed_set(text: str) -> None:
    assert dropped_reason(text) in LABELS


def test_fixed_texts_stay_and_texts_with_values_map_to_their_kind() -> None:
    assert all(dropped_reason(t) == t for t in FIXED)
    assert dropped_reason("SignalRun.signal must be str") == MALFORMED
    assert dropped_reason("unknown message type 'Nope'") == MALFORMED
    assert dropped_reason("unknown timer kind 'x\ny'") == MALFORMED
    assert dropped_reason("ActivationHeartbeat does not apply to a wait step") == NOT_APPLICABLE
    assert dropped_reason("input /topic: 'topic' is a required property") == "start rejected"
    assert dropped_reason("something new") == OTHER
    assert decide(None, {"type": "CancelRun", "run_id": "r", "ts_ms": 1}, CTX).dropped == "unknown run"


def test_the_metric_has_at_most_the_fixed_labels() -> None:
    registry = CollectorRegistry()
    metrics = ProcessorMetrics(registry)
    dropped = {f"X.field{i} must be str": 1 for i in range(500)} | {f"free text {i}": 1 for i in range(500)}
    metrics.flush_batch({}, {}, {}, dropped, {}, 0)
    labels = {
        s.labels["reason"]
        for m in registry.collect()
        if m.name == "runfold_processor_dropped_inputs"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert labels == {MALFORMED, OTHER}
