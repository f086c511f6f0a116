"""What registration checks beyond a definition on its own (issue 24, point 2): served queues,
CEL variables and state keys, child workflows and budgets against every definition nesting
them. Pure: `registration_issues` over a Catalog, and `check_sources` over files (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_harness import definition
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.client.definitions import check_sources
from processors.engine import Catalog
from processors.engine.errors import Issue
from processors.engine.registration import registration_issues

QUEUES = frozenset({"default", "agents"})


def act(**extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": "do", **extra}


def issues_of(
    raw: dict[str, Any], *others: dict[str, Any], queues: frozenset[str] | None = QUEUES
) -> list[Issue]:
    catalog = Catalog()
    for other in others:
        catalog.register(other)
    defn = catalog.register(raw)
    return registration_issues(defn, catalog, queues)


def found(issues: list[Issue]) -> list[tuple[str, str, str]]:
    return sorted((i.path, i.rule, i.severity) for i in issues)


def test_a_node_on_a_queue_the_topology_does_not_serve_says_how_to_add_it() -> None:
    issues = issues_of(definition({"search": act(queue="tools")}))
    assert found(issues) == [("nodes.search.queue", "unknown_queue", "error")]
    message = issues[0].message
    assert "unknown queue 'tools'" in message and "serves agents, default" in message
    assert "RUNFOLD_ACTIVATION_QUEUES=agents,default,tools" in message
    assert "runfold worker --queue tools" in message
    assert issues_of(definition({"search": act(queue="tools")}), queues=QUEUES | {"tools"}) == []
    assert issues_of(definition({"search": act(queue="tools")}), queues=None) == []


def test_a_condition_on_an_unknown_root_is_an_error() -> None:
    raw = definition(
        {"a": act(), "b": act()},
        routes={"a": [{"to": "b", "when": "stat.approved"}]},
        state={"approved": False},
    )
    issues = issues_of(raw)
    assert found(issues) == [("routes.a[0].when", "condition_scope", "error")]
    assert "unknown variable 'stat'" in issues[0].message and "state, input, output" in issues[0].message


@pytest.mark.parametrize(
    "when",
    [
        "state.approved",
        "state.items.exists(i, i > 1) && output.ok == true",
        "type(state.count) == int && input.x == null",
        "state.items.all(x, x.tags.exists(t, t == x.name))",
        "size(state) > 1 || has(output.ok)",
    ],
)
def test_conditions_on_the_variables_that_exist_pass(when: str) -> None:
    raw = definition(
        {"a": act(), "b": act()},
        routes={"a": [{"to": "b", "when": when}]},
        state={"approved": False, "items": [], "count": 0},
    )
    assert issues_of(raw) == []


def test_a_condition_reading_an_undeclared_state_key_is_an_error_a_test_of_it_a_warning() -> None:
    raw = definition(
        {"a": act(), "b": act()},
        routes={"a": [{"to": "b", "when": "state.aproved"}, {"to": "end", "when": "has(state.gone)"}]},
        state={"approved": False},
    )
    assert found(issues_of(raw)) == [
        ("routes.a[0].when", "undeclared_state_key", "error"),
        ("routes.a[1].when", "undeclared_state_key", "warning"),
    ]


def test_a_reference_into_an_undeclared_state_key_is_an_error() -> None:
    raw = definition(
        {"a": act(input={"q": {"from": "state", "pointer": "/plan/queries"}})},
        state={"brief": None},
        output={"from": "state", "pointer": "/breif"},
    )
    assert found(issues_of(raw)) == [
        ("nodes.a.input.q.pointer", "undeclared_state_key", "error"),
        ("output.pointer", "undeclared_state_key", "error"),
    ]


def child_node(workflow: str, revision: int = 1) -> dict[str, Any]:
    return {"kind": "workflow", "workflow": workflow, "revision": revision}


def test_a_child_not_registered_yet_is_a_warning() -> None:
    issues = issues_of(definition({"w": child_node("later")}, id="parent"))
    assert found(issues) == [("nodes.w.workflow", "missing_child", "warning")]


def test_child_budgets_are_checked_against_every_definition_nesting_them() -> None:
    """root (max_steps 100) nests mid (50) nests leaf (80): leaf is within the root's budget
    (what a run's start checks) but over mid's, its parent."""
    root = definition({"w": child_node("mid")}, id="root", budgets={"max_steps": 100})
    mid = definition({"w": child_node("leaf")}, id="mid", budgets={"max_steps": 50})
    leaf = definition({"a": act()}, id="leaf", budgets={"max_steps": 80})
    # leaf registered last: it is the child over its parent's budget
    issues = issues_of(leaf, root, mid)
    assert found(issues) == [("budgets.max_steps", "nested_budget", "error")]
    assert "80 exceeds the max_steps 50 of mid@1, which nests leaf@1" in issues[0].message
    # mid registered last: it nests a child over its own budget
    issues = issues_of(mid, root, leaf)
    assert found(issues) == [("nodes.w.workflow", "nested_budget", "error")]
    assert "nests leaf@1, whose max_steps 80 exceeds this definition's 50" in issues[0].message
    # and a grandchild over the root's budget, through a parent that sets none
    big = definition({"a": act()}, id="big", budgets={"max_steps": 500})
    plain = definition({"w": child_node("big")}, id="plain")
    top = definition({"w": child_node("plain")}, id="top", budgets={"max_steps": 100})
    assert found(issues_of(big, top, plain)) == [("budgets.max_steps", "nested_budget", "error")]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 40)), min_size=2, max_size=5), st.data())
def test_a_chain_of_children_is_refused_exactly_when_one_exceeds_an_ancestor(
    limits: list[int | None], data: st.DataObject
) -> None:
    """d0 nests d1 nests ... ; each sets max_steps or not. Whichever one is registered last, it
    is refused iff it exceeds the limit of a definition above it, or one below it exceeds its own."""
    raws = []
    for index, limit in enumerate(limits):
        nodes = {"w": child_node(f"d{index + 1}")} if index + 1 < len(limits) else {"a": act()}
        raws.append(definition(nodes, id=f"d{index}", **({"budgets": {"max_steps": limit}} if limit else {})))
    last = data.draw(st.integers(0, len(limits) - 1))
    issues = issues_of(raws[last], *(r for i, r in enumerate(raws) if i != last))
    mine = limits[last]
    above = [limit for limit in limits[:last] if limit is not None]
    below = [limit for limit in limits[last + 1 :] if limit is not None]
    expected = mine is not None and (any(mine > a for a in above) or any(b > mine for b in below))
    assert any(i.rule == "nested_budget" for i in issues) == expected
    assert all(i.severity == "error" for i in issues if i.rule == "nested_budget")


def test_check_sources_is_offline_and_checks_files_against_each_other(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text(
        "schema: runfold.workflow/v1\nid: parent\nrevision: 1\nentry: [w]\nbudgets: {max_steps: 10}\n"
        "nodes: {w: {kind: workflow, workflow: child, revision: 1}}\n"
    )
    (tmp_path / "child.yaml").write_text(
        "schema: runfold.workflow/v1\nid: child\nrevision: 1\nentry: [a]\nbudgets: {max_steps: 20}\n"
        "nodes: {a: {kind: action, action: do, queue: tools}}\n"
    )
    (tmp_path / "broken.yaml").write_text("schema: runfold.workflow/v1\nid: [\n")
    checks = check_sources(sorted(tmp_path.iterdir()), QUEUES)
    by_name = {Path(c.source).name: c for c in checks}
    assert by_name["broken.yaml"].definition is None and by_name["broken.yaml"].errors[0].rule == "syntax"
    assert found(by_name["child.yaml"].issues) == [
        ("budgets.max_steps", "nested_budget", "error"),
        ("nodes.a.queue", "unknown_queue", "error"),
    ]
    assert found(by_name["parent.yaml"].issues) == [("nodes.w.workflow", "nested_budget", "error")]


def test_two_files_with_one_id_at_revision_and_different_content_conflict(tmp_path: Path) -> None:
    body = "schema: runfold.workflow/v1\nid: same\nrevision: 1\nentry: [a]\nnodes: {{a: {{kind: action, action: {}}}}}\n"
    (tmp_path / "a.yaml").write_text(body.format("one"))
    (tmp_path / "b.yaml").write_text(body.format("two"))
    checks = check_sources(sorted(tmp_path.iterdir()), QUEUES)
    assert checks[0].errors == [] and [i.rule for i in checks[1].errors] == ["conflict"]


@pytest.mark.parametrize("path", sorted(Path("examples/definitions").glob("*.yaml")))
def test_the_examples_pass_with_the_queues_they_use(path: Path) -> None:
    (check,) = check_sources([path], QUEUES | {"tools"})
    assert check.errors == [], check.errors
