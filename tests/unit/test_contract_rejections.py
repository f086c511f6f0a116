"""Rejection reasons a producer in any language can act on (docs/contract.md): the input-schema
rejection names the missing property or the expected type, never the value."""

from __future__ import annotations

from engine_harness import RunHarness, definition

SCHEMA = {
    "type": "object",
    "required": ["topic", "depth"],
    "properties": {"topic": {"type": "string"}, "depth": {"type": ["integer", "null"]}},
}


def _reason(run_input: object) -> str:
    nodes = {"a": {"kind": "action", "action": "a"}}
    h = RunHarness(definition(nodes, input_schema=SCHEMA)).start(run_input)
    (event,) = h.last.events
    assert (event["type"], event["code"]) == ("RunRejected", "InvalidInput")
    return str(event["reason"])


def test_a_missing_required_property_is_named() -> None:
    assert _reason({"topic": "kafka"}) == "input at $ fails 'required': missing 'depth' (schema required)"


def test_a_wrong_type_names_the_expected_type_not_the_value() -> None:
    reason = _reason({"topic": "kafka", "depth": "deep-VALUE-1234"})
    assert reason == "input at $.depth fails 'type': expected integer or null (schema properties/depth/type)"
    assert "VALUE" not in reason
