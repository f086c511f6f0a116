"""docs/definitions.md says what the code does: every field of every table is a field of the
model (and every model field is in its table), with the default the model has; the per-kind
table is the validator's; the ceilings are `Ceilings`'; every CEL example is true and every
function said to be missing is; a few run-time claims, run in the test harness."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from processors.engine import Catalog, Ceilings, DefinitionError
from processors.engine.conditions import compile_condition
from processors.engine.definition import Budgets, Definition, Mutation, Node, Ref, RetryPolicy, Route, Tool
from processors.engine.errors import ConditionError
from processors.engine.validation import ALLOWED_FIELDS, REQUIRED_FIELDS
from processors.testing import WorkflowEnvironment

DOC = (Path(__file__).resolve().parents[2] / "docs" / "definitions.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, flags=re.S | re.M)
    assert match, f"no section {title!r}"
    return match.group(1)


def table(text: str, first: int = 0) -> list[list[str]]:
    """The rows (cells) of the `first`-th table of a section, header and rule dropped."""
    tables: list[list[list[str]]] = [[]]
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            tables[-1].append(cells)
        elif tables[-1]:
            tables.append([])
    rows = [t for t in tables if t][first]
    return rows[2:]


def _name(cell: str) -> str:
    return cell.strip("`")


def _doc_default(cell: str) -> Any:
    if cell == "required":
        return "required"
    if cell == "none":
        return None
    literal = re.fullmatch(r"`([^`]*)`", cell)
    assert literal, f"default cell {cell!r} is neither required, none nor a `literal`"
    text = literal.group(1)
    return {"[]": [], "{}": {}, '""': ""}.get(text, text)


def _model_default(model: type[BaseModel], name: str) -> Any:
    info = next(f for key, f in model.model_fields.items() if (f.alias or key) == name)
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):  # budgets: {} in the doc
        return {}
    return value


TABLES = [
    ("Top level", Definition, 0),
    ("Nodes", Node, 0),
    ("Tools", Tool, 0),
    ("References and templates", Ref, 0),
    ("Retry", RetryPolicy, 0),
    ("Routes", Route, 0),
    ("Budgets", Budgets, 0),
]


@pytest.mark.parametrize(("title", "model", "index"), TABLES, ids=[t[0] for t in TABLES])
def test_every_field_is_documented_with_its_default(title: str, model: type[BaseModel], index: int) -> None:
    rows = table(section(title), index)
    documented = {_name(row[0]): row for row in rows}
    fields = {(f.alias or key) for key, f in model.model_fields.items()}
    assert set(documented) == fields
    for name, row in documented.items():
        want = _model_default(model, name)
        if model is Node and name == "queue":
            assert "`default` for actions, `agents` for agents" in row[2]
            continue
        got = _doc_default(row[2])
        assert str(got) == str(want), f"{title}: {name} documented {got!r}, the model has {want!r}"


def test_the_mutation_ops_and_reducers_are_the_models() -> None:
    ops = {_name(row[0]) for row in table(section("Mutations (`state` nodes)"))}
    assert ops == set(Mutation.model_fields["op"].annotation.__args__)  # type: ignore[union-attr]
    reducers = {_name(row[0]) for row in table(section("Reducers"))}
    assert reducers == set(Definition.model_fields["reducers"].annotation.__args__[1].__args__)  # type: ignore[union-attr]


def test_the_kind_table_is_the_validators() -> None:
    common = {"kind", "description", "on_failure"}
    for row in table(section("Nodes"), 1):
        kind = _name(row[0])
        fields = {f.strip("*` ") for f in row[1].split(",")}
        required = {m for m in re.findall(r"\*\*`(\w+)`\*\*", row[1])}
        assert fields | common == ALLOWED_FIELDS[kind], kind
        assert required == set(REQUIRED_FIELDS[kind]), kind


def test_the_budget_ceilings_are_the_servers() -> None:
    ceilings = Ceilings()
    for row in table(section("Budgets")):
        name, ceiling = _name(row[0]), row[3]
        if ceiling:
            assert int(ceiling) == getattr(ceilings, name), name


SAMPLE = {
    "n": 3,
    "name": "Ada Lovelace",
    "items": [1, 2, 3],
    "m": {"k": 1},
    "s": "42",
    "ts": "2026-01-01T00:00:00Z",
}


def test_every_cel_example_is_true_on_the_sample_state() -> None:
    rows = table(section("Conditions (CEL)"))
    assert len(rows) >= 12
    for row in rows:
        expr = row[1].strip("`").replace("\\|", "|")
        assert compile_condition(expr).evaluate(state=SAMPLE, input={}, output=None) is True, expr


@pytest.mark.parametrize(
    "expr", ["max(state.items) == 3", "min(1, 2) == 1", 'state.name.lowerAscii() == "x"']
)
def test_the_functions_said_to_be_missing_are(expr: str) -> None:
    with pytest.raises(ConditionError):
        compile_condition(expr).evaluate(state=SAMPLE, input={}, output=None)


def _wf(nodes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": "d",
        "revision": 1,
        "entry": [next(iter(nodes))],
        "nodes": nodes,
        **extra,
    }


def test_registration_claims() -> None:
    catalog = Catalog()
    with pytest.raises(DefinitionError, match="not allowed for kind action"):
        catalog.register(_wf({"a": {"kind": "action", "action": "x", "duration_ms": 1}}))
    with pytest.raises(DefinitionError, match="reserved"):
        catalog.register(_wf({"end": {"kind": "sleep", "duration_ms": 1}}))
    with pytest.raises(DefinitionError, match="must be less than lease_ms"):
        catalog.register(_wf({"a": {"kind": "action", "action": "x", "lease_ms": 100, "heartbeat_ms": 100}}))
    with pytest.raises(DefinitionError, match="max_steps"):
        catalog.register(_wf({"a": {"kind": "sleep", "duration_ms": 1}}, budgets={"max_steps": 10_001}))


def test_run_time_claims_in_the_harness() -> None:
    nodes = {
        "a": {"kind": "action", "action": "echo", "input": {"x": {"from": "input", "pointer": "/missing"}}},
    }
    mutations = {
        "m": {
            "kind": "state",
            "mutations": [
                {"op": "increment", "target": "n"},
                {"op": "append", "target": "items", "value": [4, 5]},
                {"op": "remove", "target": "items", "value": 1},
                {"op": "remove", "target": "obj", "value": "k"},
                {"op": "set", "target": "flag", "value": {"from": "input", "pointer": "/f"}},
            ],
        }
    }
    with WorkflowEnvironment(
        _wf(nodes),
        _wf(mutations, id="muts", state={"n": None, "items": [1, 2], "obj": {"k": 1, "j": 2}, "flag": None}),
    ) as env:
        env.run("d").assert_step_failed("a", code="UnknownReference")
        state = env.run("muts", {"f": True}).assert_succeeded().state
    assert state == {"n": 1, "items": [2, 4, 5], "obj": {"j": 2}, "flag": True}
