"""Definition models and the loader: shape, defaults, aliases, error paths, examples."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from processors.engine.catalog import Catalog
from processors.engine.definition import (
    Budgets,
    Ceilings,
    Definition,
    RetryPolicy,
    parse_definition,
)
from processors.engine.errors import DefinitionError
from processors.engine.validation import load_definition

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"


def minimal() -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": "demo",
        "revision": 1,
        "state": {"out": None},
        "entry": ["a"],
        "nodes": {"a": {"kind": "action", "action": "echo", "writes": {"out": {"from": "output"}}}},
    }


def error_strings(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(DefinitionError) as info:
        load_definition(raw)
    return [str(issue) for issue in info.value.errors]


def test_minimal_definition_gets_documented_defaults() -> None:
    defn = load_definition(minimal())
    node = defn.nodes["a"]
    assert defn.schema_ == "runfold.workflow/v1"
    assert defn.key == "demo@1"
    assert defn.output is None and defn.routes == {} and defn.reducers == {}
    assert defn.reducer("out") == "replace"
    assert (node.queue, node.lease_ms, node.heartbeat_ms, node.on_failure) == (
        "default",
        30000,
        5000,
        "fail_fast",
    )
    assert (node.structured_output_attempts, node.capabilities, node.mutations) == (1, [], [])
    assert node.input is None and node.map is None and node.retry is None and node.timeout_ms is None
    assert defn.budgets.max_nesting_depth == 4 and defn.budgets.warn_at_percent == 80


def test_agent_queue_defaults_to_agents_and_explicit_queue_wins() -> None:
    raw = minimal()
    raw["nodes"]["b"] = {"kind": "agent", "agent": "planner"}
    raw["nodes"]["a"]["queue"] = "tools"
    raw["routes"] = {"a": ["b"]}
    defn = load_definition(raw)
    assert defn.nodes["b"].queue == "agents"
    assert defn.nodes["a"].queue == "tools"


def test_route_string_shorthand_and_objects() -> None:
    raw = minimal()
    raw["nodes"]["b"] = {"kind": "state"}
    raw["routes"] = {"a": ["b", {"to": "end", "when": "state.out == null"}]}
    routes = load_definition(raw).routes["a"]
    assert [(r.to, r.when) for r in routes] == [("b", None), ("end", "state.out == null")]


def test_ref_alias_from_and_template() -> None:
    raw = minimal()
    raw["output"] = {"from": "state", "pointer": "/out"}
    defn = load_definition(raw)
    assert defn.output is not None and defn.output.from_ == "state"
    assert defn.output.to_template() == {"from": "state", "pointer": "/out"}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda r: r["nodes"]["a"].update(retry={"max_attempts": 0}),
            "nodes.a.retry.max_attempts: must be >= 1",
        ),
        (lambda r: r.update(schema="app-kit.workflow/v2"), "schema: must be one of 'runfold.workflow/v1'"),
        (lambda r: r.update(revision=0), "revision: must be >= 1"),
        (lambda r: r.update(revision="1"), "revision: must be an integer"),
        (lambda r: r.update(id="Bad Id"), "id: must match ^[a-z0-9][a-z0-9._-]{0,127}$"),
        (lambda r: r.update(colour="red"), "colour: unknown field"),
        (lambda r: r.pop("entry"), "entry: is required"),
        (lambda r: r.update(entry=[]), "entry: must not be empty"),
        (lambda r: r["nodes"]["a"].update(kind="robot"), "nodes.a.kind: must be one of"),
        (lambda r: r.update(routes={"a": [{"to": "a", "if": "x"}]}), "routes.a[0].if: unknown field"),
        (lambda r: r.update(output={"from": "elsewhere"}), "output.from: must be one of"),
        (lambda r: r.update(reducers={"out": "average"}), "reducers.out: must be one of"),
        (
            lambda r: r["nodes"]["a"].update(retry={"max_attempts": 2, "multiplier": 0.5}),
            "nodes.a.retry.multiplier: must be >= 1.0",
        ),
        (lambda r: r.update(budgets={"max_steps": -1}), "budgets.max_steps: must be >= 0"),
        (lambda r: r.update(budgets={"warn_at_percent": 101}), "budgets.warn_at_percent: must be <= 100"),
        (lambda r: r["nodes"]["a"].update(queue="Bad Queue"), "nodes.a.queue: must match"),
        # a queue is a topic-name suffix: the topology refuses ".", so definitions must too
        (lambda r: r["nodes"]["a"].update(queue="gpu.large"), "nodes.a.queue: must match"),
    ],
)
def test_shape_errors_name_the_dotted_path(mutate: Any, expected: str) -> None:
    raw = minimal()
    mutate(raw)
    assert any(message.startswith(expected) for message in error_strings(raw)), error_strings(raw)


def test_error_string_joins_every_issue() -> None:
    raw = minimal()
    raw["revision"] = 0
    raw["nodes"]["a"]["retry"] = {"max_attempts": 0}
    with pytest.raises(DefinitionError) as info:
        load_definition(raw)
    assert str(info.value) == "revision: must be >= 1; nodes.a.retry.max_attempts: must be >= 1"
    assert [i.rule for i in info.value.errors] == ["greater_than_equal", "greater_than_equal"]


def test_models_are_frozen() -> None:
    defn = load_definition(minimal())
    with pytest.raises(Exception, match="frozen"):
        defn.revision = 2  # type: ignore[misc]


def test_load_from_yaml_text_json_text_and_path(tmp_path: Path) -> None:
    raw = minimal()
    from_yaml = load_definition(yaml.safe_dump(raw))
    from_json = load_definition(orjson.dumps(raw).decode())
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert from_yaml == from_json == load_definition(path) == load_definition(raw)


def test_loader_rejects_bad_text_duplicate_keys_and_non_mappings(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="not valid YAML or JSON"):
        load_definition("a: [unclosed")
    with pytest.raises(DefinitionError, match="duplicate key 'id'"):
        load_definition("schema: runfold.workflow/v1\nid: a\nid: b\n")
    with pytest.raises(DefinitionError, match="must be a mapping"):
        load_definition("- just\n- a list\n")
    with pytest.raises(DefinitionError, match="cannot read"):
        load_definition(tmp_path / "missing.yaml")


def test_canonical_form_round_trips_and_omits_defaults() -> None:
    defn = load_definition(EXAMPLES / "research-brief.yaml")
    canonical = defn.canonical()
    assert parse_definition(copy.deepcopy(canonical)) == defn
    assert "lease_ms" not in canonical["nodes"]["search"]  # default
    assert canonical["routes"]["plan"] == [{"to": "search"}]  # shorthand normalised


def test_retry_delay_is_exponential_capped_and_deterministic() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_ms=200, multiplier=2.0, max_backoff_ms=1000)
    assert [policy.delay_ms(a) for a in range(1, 6)] == [200, 400, 800, 1000, 1000]
    assert RetryPolicy(max_attempts=2).delay_ms(1) == 0
    assert RetryPolicy(max_attempts=2, backoff_ms=10, multiplier=100.0).delay_ms(10_000) == 2**62


def test_budgets_count_only_positive_limits_and_ceilings_fill_the_rest() -> None:
    budgets = Budgets(max_steps=200, max_tokens=0)
    assert budgets.limits() == {"max_steps": 200, "max_nesting_depth": 4}
    effective = Ceilings(max_steps=500, max_tokens=9).effective(budgets)
    assert (
        effective["max_steps"] == 200 and effective["max_tokens"] == 9 and effective["warn_at_percent"] == 80
    )


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load_validate_and_register(path: Path) -> None:
    from processors.engine.validation import validate_definition

    defn = load_definition(path, Ceilings())
    assert isinstance(defn, Definition)
    assert validate_definition(defn, Ceilings()) == []


def test_research_brief_example_has_every_capability() -> None:
    catalog = Catalog()
    for path in sorted(EXAMPLES.glob("*.yaml")):
        catalog.register(load_definition(path))
    defn = catalog.get("research-brief")
    assert defn is not None and defn.revision == 4
    kinds = {node.kind for node in defn.nodes.values()}
    assert kinds == {"action", "agent", "workflow", "state", "wait", "sleep"}
    assert defn.nodes["search"].map is not None  # fan-out
    targets = {route.to for routes in defn.routes.values() for route in routes}
    assert "plan" in targets  # a loop back to the entry
    bundle = catalog.pin_bundle("research-brief", 4)
    assert set(bundle.definitions) == {"research-brief@4", "summarize@3"}
