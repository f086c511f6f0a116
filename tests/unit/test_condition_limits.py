"""Route conditions are bounded: registration limits (length, depth, comprehension nesting)
and an evaluation budget (the estimate of `condition_limits.estimate_ns`), over which the run
fails with code Evaluation naming the condition. The review's cases took 7.9 s and 4.9 s."""

from __future__ import annotations

import time
from typing import Any

import cel
import pytest
from engine_harness import RunHarness
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine import Catalog, DefinitionError
from processors.engine.condition_limits import MAX_CHARS, MAX_DEPTH, ConditionLimit, analyze, narrow
from processors.engine.conditions import compile_condition
from processors.engine.errors import ConditionError

WF = "runfold.workflow/v1"
LIST10 = "[1,2,3,4,5,6,7,8,9,10]"
SIX_NESTED_MAPS = LIST10 + f".map(a, {LIST10}" * 5 + ".map(b, b))" * 5 + ".size() > 0"


def definition(when: str) -> dict[str, Any]:
    return {
        "schema": WF,
        "id": "cond",
        "revision": 1,
        "entry": ["a"],
        "state": {},
        "nodes": {"a": {"kind": "action", "action": "a"}, "b": {"kind": "action", "action": "b"}},
        "routes": {"a": [{"to": "b", "when": when}]},
    }


@pytest.mark.parametrize(
    ("expr", "rule"),
    [
        ("state.a == 1 && " * 70 + "true", "condition_length"),
        ("(" * 40 + "true" + ")" * 40, "condition_depth"),
        (" || ".join(["state.a"] * 40), "condition_depth"),
        (SIX_NESTED_MAPS, "condition_nesting"),
        ("input.a.exists(x, input.b.exists(y, input.c.exists(z, x == y && y == z)))", "condition_nesting"),
        ("input.a.map(x, x).map(y, y).exists(z, z == 1)", "condition_nesting"),  # a range counts too
    ],
)
def test_registration_refuses_a_condition_over_a_limit_with_the_path_and_the_rule(
    expr: str, rule: str
) -> None:
    assert cel.compile(expr) is not None  # valid CEL, accepted before these limits
    with pytest.raises(ConditionLimit) as exc:
        compile_condition(expr)
    assert exc.value.rule == rule
    with pytest.raises(DefinitionError) as refused:
        Catalog().register(definition(expr))
    [issue] = [i for i in refused.value.errors if i.severity == "error"]
    assert issue.path == "routes.a[0].when" and issue.rule == rule, issue
    assert len(str(issue)) < 400  # the message does not quote a whole long condition


def test_conditions_at_the_limits_are_accepted() -> None:
    at_length = "state.a == 1 || " * 30
    at_length = (at_length + "state.b == 2")[:MAX_CHARS]
    compile_condition("input.a.exists(x, input.b.exists(y, x == y))")
    compile_condition("(" * (MAX_DEPTH - 3) + "state.a" + ")" * (MAX_DEPTH - 3) + " == 1")
    assert analyze("input.a.exists(x, input.b.exists(y, x == y))").nesting == 2
    assert len(" || ".join(["state.a"] * 20)) < MAX_CHARS
    compile_condition(" || ".join(["state.a"] * 20))


def test_the_reviews_nested_exists_over_35_kb_fails_fast_instead_of_taking_seconds() -> None:
    cond = compile_condition("input.a.exists(x, input.b.exists(y, x == y))")
    data = {"a": list(range(3500)), "b": [-1] * 3500}  # ~35 KB: 12 million comparisons
    t0 = time.perf_counter()
    with pytest.raises(ConditionLimit) as exc:
        cond.evaluate(state={}, input=data, output=None)
    assert time.perf_counter() - t0 < 0.5
    assert exc.value.rule == "condition_cost" and "input.a.exists" in exc.value.message
    assert "exceeds the limit" in exc.value.message
    # the same condition on small lists runs
    assert cond.evaluate(state={}, input={"a": [1, 2, 3], "b": [3, 4]}, output=None) is True


@pytest.mark.parametrize(
    ("expr", "data"),
    [
        ("size(input.a.map(x, x)) > 0", {"a": list(range(5000))}),  # quadratic in cel-rust: ~1 s
        ("input.s.matches('((a|b){100}){100}c')", {"s": "ab" * 5000}),  # seconds of automaton
        ("input != {}", {"a": [{"": i} for i in range(30000)]}),  # converting it: ~0.2 s
        ("input.a.exists(x, x in input.a)", {"a": list(range(20000))}),
    ],
)
def test_an_evaluation_over_the_budget_is_refused_before_it_runs(expr: str, data: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ConditionLimit) as exc:
        compile_condition(expr).evaluate(state={}, input=data, output=None)
    assert exc.value.rule == "condition_cost"
    assert time.perf_counter() - t0 < 0.2


def test_a_run_whose_condition_is_over_the_budget_fails_with_evaluation_naming_it() -> None:
    h = RunHarness(definition("input.a.exists(x, input.b.exists(y, x == y))"))
    h.start({"a": list(range(3000)), "b": list(range(3000, 6000))})
    t0 = time.perf_counter()
    h.complete("a", output={})
    assert time.perf_counter() - t0 < 1.0
    [failed] = [e for e in h.last.events if e["type"] == "RunFailed"]
    failure = failed["failure"]
    assert failure["code"] == "Evaluation" and "routes of a" in failure["message"]
    assert "input.a.exists" in failure["message"] and "exceeds the limit" in failure["message"]


def test_narrowing_hands_a_program_only_the_fields_it_reads() -> None:
    state = {"a": {"b": 1, "big": list(range(1000))}, "c": [1], "d": "x"}
    reads = analyze("state.a.b == 1 && has(state.d) && size(state.c) == 1").reads
    # a value only sized is handed as as many nulls, one only tested with has() as null
    assert narrow(state, reads["state"]) == {"a": {"b": 1}, "c": [None], "d": None}
    assert analyze("state['a'] == 1").reads == {"state": None}  # an index: the whole value
    assert analyze("state.items.exists(state, state > 1)").reads == {
        "state": frozenset({("items", "#iter"), ("items", "*")})
    }
    # the same answers as the whole value, missing keys included
    for expr in (
        "state.a.b == 1",
        "has(state.a.zz)",
        "has(state.zz)",
        "state.a.big[3] == 3",
        "size(state.a) == 2",
    ):
        assert compile_condition(expr).evaluate(state=state, input={}, output=None) is cel.evaluate(
            expr, {"state": state}
        )
    with pytest.raises(ConditionError, match="no such key"):
        compile_condition("state.a.zz == 1").evaluate(state=state, input={}, output=None)


# generated CEL: whatever cel compiles, the bound's parser reads (it never refuses valid CEL
# for another reason than a limit)
_atoms = st.sampled_from(
    [
        "state.a",
        "input.b.c",
        "output",
        "1",
        "2.5",
        "'s'",
        "r'x'",
        "true",
        "null",
        "[1, 2]",
        "{'k': 1}",
        "x",
        "3u",
        "0x1F",
        "b'by'",
        '"q"',
    ]
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    bin_ops = st.sampled_from(["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "in"])
    return st.one_of(
        st.tuples(children, bin_ops, children).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(st.sampled_from(["!", "-"]), children).map(lambda t: f"{t[0]}{t[1]}"),
        children.map(lambda c: f"({c})"),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.tuples(children, st.sampled_from(["all", "exists", "exists_one", "map", "filter"]), children).map(
            lambda t: f"{t[0]}.{t[1]}(x, {t[2]})"
        ),
        st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(st.sampled_from(["size", "has", "string", "int", "type", "dyn"]), children).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        st.tuples(children, st.sampled_from(["contains", "startsWith", "matches", "size"]), children).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"
        ),
        st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        children.map(lambda c: f"{c}.field"),
    )


@settings(max_examples=300, deadline=None)
@given(st.recursive(_atoms, _combine, max_leaves=12))
def test_the_parser_reads_whatever_cel_compiles(expr: str) -> None:
    try:
        cel.compile(expr)
    except ValueError:
        return
    try:
        analysis = analyze(expr)
    except ConditionLimit:
        return
    assert analysis.depth >= 1
