"""Semantic validation of definitions: every rule, passing and failing."""

from __future__ import annotations

import re
from typing import Any

import pytest

from processors.engine import Catalog
from processors.engine.definition import Ceilings, parse_definition
from processors.engine.errors import DefinitionError, Issue
from processors.engine.validation import load_definition, validate_definition


def base() -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": "v",
        "revision": 1,
        "state": {"out": None, "notes": [], "n": 0},
        "reducers": {"notes": "append"},
        "entry": ["a"],
        "nodes": {
            "a": {"kind": "action", "action": "echo", "writes": {"out": {"from": "output"}}},
            "b": {"kind": "state", "mutations": [{"op": "increment", "target": "n", "value": 1}]},
        },
        "routes": {"a": [{"to": "b", "when": "state.n < 3"}, {"to": "end"}], "b": ["a"]},
    }


def issues_of(raw: dict[str, Any], ceilings: Ceilings | None = None) -> list[Issue]:
    return validate_definition(parse_definition(raw), ceilings)


def only(issues: list[Issue], rule: str) -> list[str]:
    return [str(i) for i in issues if i.rule == rule]


def test_base_definition_is_clean() -> None:
    assert issues_of(base(), Ceilings()) == []


def test_unknown_nodes_in_entry_and_routes() -> None:
    raw = base()
    raw["entry"] = ["a", "ghost"]
    raw["routes"]["a"].append({"to": "nowhere"})
    raw["routes"]["phantom"] = ["a"]
    assert only(issues_of(raw), "unknown_node") == [
        "entry[1]: unknown node 'ghost'",
        "routes.a[2].to: unknown node 'nowhere'",
        "routes.phantom: unknown node 'phantom'",
    ]


def test_unreachable_node_is_a_warning_not_an_error() -> None:
    raw = base()
    raw["nodes"]["island"] = {"kind": "sleep", "duration_ms": 5}
    issues = issues_of(raw)
    assert [(str(i), i.severity) for i in issues] == [("nodes.island: unreachable from entry", "warning")]
    load_definition(raw)  # warnings do not fail a load


def test_node_named_end_is_reserved_and_ids_are_checked() -> None:
    raw = base()
    raw["nodes"]["end"] = {"kind": "state"}
    raw["nodes"]["bad id"] = {"kind": "state"}
    rules = {i.rule for i in issues_of(raw)}
    assert {"reserved_name", "node_id"} <= rules


def test_writes_reducers_required_and_mutations_need_declared_state_keys() -> None:
    raw = base()
    raw["nodes"]["a"]["writes"]["ghost"] = {"from": "output"}
    raw["reducers"]["phantom"] = "sum"
    raw["required"] = ["out", "missing"]
    raw["nodes"]["b"]["mutations"].append({"op": "set", "target": "nope", "value": 1})
    assert only(issues_of(raw), "undeclared_state_key") == [
        "reducers.phantom: undeclared state key 'phantom'",
        "required[1]: undeclared state key 'missing'",
        "nodes.a.writes.ghost: undeclared state key 'ghost'",
        "nodes.b.mutations[1].target: undeclared state key 'nope'",
    ]


def test_increment_needs_a_number_or_a_reference() -> None:
    raw = base()
    raw["nodes"]["b"]["mutations"] = [
        {"op": "increment", "target": "n", "value": "one"},
        {"op": "increment", "target": "n", "value": {"from": "input", "pointer": "/step"}},
        {"op": "increment", "target": "n"},
    ]
    assert only(issues_of(raw), "mutation") == [
        "nodes.b.mutations[0].value: increment needs a number (or a reference)"
    ]


def test_invalid_cel_condition_is_rejected_with_its_path() -> None:
    raw = base()
    raw["routes"]["a"][0]["when"] = "size(state.notes > "
    [message] = only(issues_of(raw), "condition")
    assert message.startswith("routes.a[0].when: invalid CEL condition 'size(state.notes > '")


@pytest.mark.parametrize(
    ("kind_fields", "expected"),
    [
        ({"kind": "action"}, ["nodes.x.action: is required for kind action"]),
        ({"kind": "agent"}, ["nodes.x.agent: is required for kind agent"]),
        ({"kind": "workflow", "workflow": "child"}, ["nodes.x.revision: is required for kind workflow"]),
        ({"kind": "wait"}, ["nodes.x.signal: is required for kind wait"]),
        ({"kind": "sleep"}, ["nodes.x.duration_ms: is required for kind sleep"]),
        (
            {"kind": "sleep", "duration_ms": 5, "action": "echo"},
            ["nodes.x.action: not allowed for kind sleep"],
        ),
        ({"kind": "state", "retry": {"max_attempts": 2}}, ["nodes.x.retry: not allowed for kind state"]),
        ({"kind": "wait", "signal": "s", "queue": "q"}, ["nodes.x.queue: not allowed for kind wait"]),
        ({"kind": "action", "action": "a", "prompt": "hi"}, ["nodes.x.prompt: not allowed for kind action"]),
        (
            {"kind": "workflow", "workflow": "c", "revision": 1, "capabilities": ["net"]},
            ["nodes.x.capabilities: not allowed for kind workflow"],
        ),
        ({"kind": "agent", "agent": "p", "model": "m", "prompt": {"u": "hi"}, "capabilities": ["web"]}, []),
        ({"kind": "wait", "signal": "approval", "timeout_ms": 1000}, []),
    ],
)
def test_kind_specific_fields(kind_fields: dict[str, Any], expected: list[str]) -> None:
    raw = base()
    raw["nodes"]["x"] = kind_fields
    raw["routes"]["b"] = ["a", "x"]
    assert only(issues_of(raw), "kind_field") == expected


def test_heartbeat_must_be_shorter_than_lease() -> None:
    raw = base()
    raw["nodes"]["a"].update(lease_ms=1000, heartbeat_ms=1000)
    assert only(issues_of(raw), "lease") == ["nodes.a.heartbeat_ms: must be less than lease_ms"]


def test_map_source_must_be_input_state_or_a_literal_list() -> None:
    raw = base()
    raw["nodes"]["a"]["map"] = {"from": "output"}
    assert only(issues_of(raw), "map_source") == [
        "nodes.a.map.from: a map source must come from input, state or literal"
    ]
    raw["nodes"]["a"]["map"] = {"from": "literal", "value": {"not": "a list"}}
    assert only(issues_of(raw), "map_source") == ["nodes.a.map.value: a literal map source must be a list"]
    raw["nodes"]["a"]["map"] = {"from": "literal", "value": [1, 2]}
    raw["nodes"]["a"]["input"] = {"q": {"from": "item"}}
    assert issues_of(raw) == []
    raw["nodes"]["a"]["map"] = {"from": "state", "pointer": "notes"}
    assert only(issues_of(raw), "pointer") == [
        "nodes.a.map.pointer: must be empty or an RFC 6901 pointer starting with '/'"
    ]


def test_reference_sources_must_be_available_where_they_are_used() -> None:
    raw = base()
    raw["nodes"]["a"]["input"] = {"q": {"from": "item"}, "o": {"from": "output"}}  # not mapped, no output yet
    raw["nodes"]["b"]["writes"] = {"out": {"from": "signal"}}  # only wait nodes see a signal
    raw["output"] = {"from": "output"}
    assert [i.path for i in issues_of(raw) if i.rule == "ref_scope"] == [
        "nodes.a.input.q.from",
        "nodes.a.input.o.from",
        "nodes.b.writes.out.from",
        "output.from",
    ]


def test_reference_shape_errors() -> None:
    raw = base()
    raw["nodes"]["a"]["input"] = {
        "obj": {"from": "somewhere", "x": 1},
        "val": {"from": "state", "value": 3},
        "ok": {"from": "literal", "value": {"from": "not a ref"}},
    }
    assert only(issues_of(raw), "ref_shape") == [
        "nodes.a.input.obj: unknown reference field(s) ['x']; wrap literal objects that have a 'from' key as "
        "{from: literal, value: ...}",
        "nodes.a.input.obj.from: must be one of ['input', 'item', 'literal', 'output', 'signal', 'state']",
        "nodes.a.input.val.value: only a literal reference has a value",
    ]


def test_budgets_above_server_ceilings_are_rejected_never_clamped() -> None:
    raw = base()
    raw["budgets"] = {"max_steps": 50, "max_tokens": 2_000_000, "max_nesting_depth": 9}
    ceilings = Ceilings(max_tokens=1_000_000)
    assert only(issues_of(raw, ceilings), "ceiling") == [
        "budgets.max_tokens: 2000000 exceeds the server ceiling 1000000",
        "budgets.max_nesting_depth: 9 exceeds the server ceiling 8",
    ]
    assert only(issues_of(raw, None), "ceiling") == []  # no ceilings given: not checked
    with pytest.raises(DefinitionError, match=re.escape("budgets.max_tokens: 2000000 exceeds")):
        load_definition(raw, ceilings)


def test_secret_literals_anywhere_are_rejected_but_handles_and_counts_pass() -> None:
    raw = base()
    raw["state"]["max_tokens"] = 100
    raw["state"]["tokens_used"] = 0
    raw["nodes"]["a"]["input"] = {"api_key": "abc123", "auth": {"$secret": "github"}, "h": "Bearer xyz"}
    raw["description"] = "uses ghp_abcdef"  # not a prefix: fine
    raw["state"]["seed"] = "sk-live-123"
    assert only(issues_of(raw), "secret_literal") == [
        "state.seed: looks like a secret literal; use a {$secret: <name>} handle",
        "nodes.a.input.api_key: looks like a secret literal; use a {$secret: <name>} handle",
        "nodes.a.input.h: looks like a secret literal; use a {$secret: <name>} handle",
    ]


def test_secret_handles_are_refused_in_prompts() -> None:
    raw = base()
    raw["nodes"]["p"] = {"kind": "agent", "agent": "x", "prompt": {"system": ["hi", {"$secret": "k"}]}}
    raw["routes"]["b"] = ["a", "p"]
    assert only(issues_of(raw), "secret_in_prompt") == [
        "nodes.p.prompt.system[1]: secret handles are not allowed in a prompt"
    ]


def test_json_schemas_must_be_valid() -> None:
    raw = base()
    raw["input_schema"] = {"type": "objekt"}
    raw["nodes"]["a"]["output_schema"] = {"type": "object", "required": "yes"}
    paths = [i.path for i in issues_of(raw) if i.rule == "json_schema"]
    assert paths == ["input_schema", "nodes.a.output_schema"]


def test_structured_output_attempts_without_schema_is_a_warning() -> None:
    raw = base()
    raw["nodes"]["p"] = {"kind": "agent", "agent": "x", "structured_output_attempts": 3}
    raw["routes"]["b"] = ["a", "p"]
    [issue] = [i for i in issues_of(raw) if i.rule == "no_effect"]
    assert issue.severity == "warning"


def test_load_definition_reports_all_errors_at_once() -> None:
    raw = base()
    raw["entry"] = ["ghost"]
    raw["nodes"]["a"]["writes"]["zzz"] = {"from": "output"}
    with pytest.raises(DefinitionError) as info:
        load_definition(raw)
    assert {i.rule for i in info.value.errors} >= {"unknown_node", "undeclared_state_key"}
    assert all(i.severity == "error" for i in info.value.errors)


@pytest.mark.parametrize(
    "value", [2**64, -(2**63) - 1, "\ud800"], ids=["2**64", "-2**63-1", "lone surrogate"]
)
def test_a_definition_the_processor_could_not_store_is_a_definition_error(value: object) -> None:
    """From the SDK (a dict: a file's reader already turns such integers into floats): the
    catalog hashes the definition's JSON and the definitions topic carries it, so a value orjson
    cannot write is an issue of the definition, not a TypeError out of `register`."""
    raw = {
        "schema": "runfold.workflow/v1",
        "id": "big",
        "revision": 1,
        "entry": ["a"],
        "nodes": {"a": {"kind": "action", "action": "a"}},
        "state": {"x": value},
    }
    with pytest.raises(DefinitionError) as caught:
        Catalog().register(raw)
    [issue] = caught.value.errors
    assert issue.rule == "not_json" and "is not JSON the processor can store" in issue.message
