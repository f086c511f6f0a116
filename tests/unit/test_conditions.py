"""CEL route conditions: JSON → CEL mapping, errors as ConditionError, route selection."""

from __future__ import annotations

from typing import Any

import pytest

from processors.engine.conditions import compile_condition, select_routes
from processors.engine.definition import Route
from processors.engine.errors import ConditionError

STATE: dict[str, Any] = {
    "notes": [1, 2, 3, 4],
    "approved": True,
    "n": 3,
    "ratio": 0.5,
    "nothing": None,
    "meta": {"lang": "en", "tags": ["a", "b"]},
}


def holds(expr: str, state: Any = STATE, input: Any = None, output: Any = None) -> bool:
    return compile_condition(expr).evaluate(state=state, input=input or {"topic": "kafka"}, output=output)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("size(state.notes) > 3", True),
        ("size(state.notes) > 4", False),
        ("state.approved", True),
        ("state.n == 3 && state.ratio < 1.0", True),
        ("state.n > 2.5", True),  # int vs double comparison is allowed
        ("state.nothing == null", True),
        ("state.meta.lang == 'en' && 'b' in state.meta.tags", True),
        ("has(state.missing)", False),
        ("has(state.meta.lang)", True),
        ("state.notes.exists(x, x > 3)", True),
        ("state['n'] == 3", True),  # index syntax passes the whole state
        ("input.topic == 'kafka'", True),
        ("output.score >= 0.9", True),
        ("size(state) == 6", True),
    ],
)
def test_json_values_map_into_cel(expr: str, expected: bool) -> None:
    assert holds(expr, output={"score": 0.95}) is expected


def test_string_literal_mentioning_state_does_not_confuse_key_narrowing() -> None:
    assert holds("input.topic == 'state.n' || state.n == 3", input={"topic": "x"}) is True
    assert holds("state.meta.lang + 'state' == 'enstate'") is True


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("state.missing > 1", "no such key 'missing'"),
        ("state.n + 0.5 > 1.0", "No such overload"),
        ("state.n", "must yield a bool, got int"),
        ("state.meta", "must yield a bool, got map"),
        ("1 / (state.n - 3) > 0", "division by zero"),
        ("ghost > 1", "Undefined variable"),
        ("output.x", "failed"),  # output is null here
    ],
)
def test_runtime_errors_become_condition_errors(expr: str, fragment: str) -> None:
    with pytest.raises(ConditionError) as info:
        holds(expr)
    assert fragment in info.value.message
    assert info.value.code == "Evaluation"


def test_syntax_errors_are_condition_errors_and_compilation_is_cached() -> None:
    with pytest.raises(ConditionError, match="invalid CEL condition"):
        compile_condition("size(")
    with pytest.raises(ConditionError, match="non-empty"):
        compile_condition("  ")
    assert compile_condition("state.approved") is compile_condition("state.approved")


def test_condition_does_not_mutate_inputs() -> None:
    state = {"notes": [1], "other": {"a": 1}}
    holds("size(state.notes) == 1", state=state)
    assert state == {"notes": [1], "other": {"a": 1}}


def routes(*items: Any) -> list[Route]:
    return [Route.model_validate(item) for item in items]


def test_select_routes_unconditional_fan_out() -> None:
    assert select_routes(routes("a", "b", "a"), state={}, input={}) == ["a", "b"]


def test_select_routes_if_else_and_end() -> None:
    rs = routes({"to": "review", "when": "size(state.notes) > 3"}, {"to": "end"})
    assert select_routes(rs, state={"notes": [1, 2, 3, 4]}, input={}) == ["review"]
    assert select_routes(rs, state={"notes": []}, input={}) == []
    loop = routes({"to": "end", "when": "state.approved"}, {"to": "count"})
    assert select_routes(loop, state={"approved": True}, input={}) == []
    assert select_routes(loop, state={"approved": False}, input={}) == ["count"]


def test_select_routes_conditional_fan_out_uses_output() -> None:
    rs = routes({"to": "a", "when": "output.x > 1"}, {"to": "b", "when": "output.x > 2"}, {"to": "c"})
    assert select_routes(rs, state={}, input={}, output={"x": 3}) == ["a", "b"]
    assert select_routes(rs, state={}, input={}, output={"x": 0}) == ["c"]
    with pytest.raises(ConditionError):
        select_routes(rs, state={}, input={}, output=None)
