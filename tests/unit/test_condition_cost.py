"""The evaluation budget of route conditions (`condition_limits.estimate_ns`) is a tight upper
bound: realistic conditions on realistic data are accepted and evaluate fast, hostile ones are
refused before they run or stay under the budget, and (generated) whenever the estimate accepts,
the real evaluation with the `cel` binding stays under the budget."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from processors.engine.condition_limits import MAX_COST_NS, ConditionLimit, estimate_ns, narrow
from processors.engine.conditions import compile_condition
from processors.engine.errors import ConditionError

CEILING = 256 * 1024  # the engine's input / payload ceiling
# Times are the evaluation's CPU time (`time.thread_time`: the binding runs on the calling
# thread holding the GIL), the fastest of a few runs, so a loaded shared host's scheduling does
# not count. Generous: an accepted evaluation is bounded by the budget (40 ms of estimate).
FAST_S = 0.05


def order(i: int) -> dict[str, Any]:
    return {
        "id": f"ord-{i:06d}",
        "customer": {"id": f"cust-{i % 97:04d}", "email": f"user{i % 97}@example.com"},
        "status": "paid",
        "total": 129.95 + i,
        "currency": "EUR",
        "created": "2026-11-30T12:00:00Z",
        "lines": [{"sku": f"SKU-{(i * 7 + j) % 500:04d}", "qty": 1 + j, "price": 19.99} for j in range(3)],
    }


def orders_input() -> dict[str, Any]:
    """A realistic input at the engine's ceiling (256 KB): orders with customers and lines."""
    orders: list[dict[str, Any]] = []
    while len(orjson.dumps({"orders": orders, "kind": "a"})) + 300 < CEILING:
        orders.append(order(len(orders)))
    return {"orders": orders, "kind": "a"}


def items(n: int) -> list[dict[str, Any]]:
    return [{"sku": f"B{i}", "qty": i % 7, "price": 9.99 + i} for i in range(n)]


def best_of(
    cond_expr: str, *, state: Any, input: Any, output: Any = None, runs: int = 3
) -> tuple[bool, float]:
    """The result and the fastest of `runs` evaluations (CPU seconds)."""
    cond = compile_condition(cond_expr)
    times: list[float] = []
    result = False
    for _ in range(runs):
        t0 = time.thread_time()
        result = cond.evaluate(state=state, input=input, output=output)
        times.append(time.thread_time() - t0)
    return result, min(times)


REALISTIC: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    (
        "exists over 2,000 small objects",
        'input.items.exists(x, x.sku == "A1")',
        {},
        {"items": items(2000)},
        False,
    ),
    # 400, not 1,000: filter copies its accumulator at every step and the estimate cannot know
    # how many strings match. 1,000 strings that all match take ~47 ms of CPU on this host at a
    # load of 8 (~120 ms at 15), over the budget, so the bound refuses 1,000 strings whatever
    # they hold; it accepts up to ~490
    (
        "filter over 400 strings",
        'input.tags.filter(t, t.startsWith("p")).size() > 0',
        {},
        {"tags": [f"{'p' if i % 10 == 0 else 't'}ag{i}" for i in range(400)]},
        True,
    ),
    ("size over a 256 KB input", "size(input.orders) > 10", {}, orders_input(), True),
    (
        "scalars and a small in",
        'state.score > 0.5 && input.kind in ["a","b"]',
        {"score": 0.7, "history": [{"turn": i, "text": "x" * 200} for i in range(200)]},
        orders_input(),
        True,
    ),
    ("map over 300 ints", "input.n.map(x, x * 2).exists(y, y == 598)", {}, {"n": list(range(300))}, True),
    ("all over 5,000 ints", "input.n.all(x, x >= 0)", {}, {"n": list(range(5000))}, True),
    (
        "exists over orders' fields",
        'input.orders.exists(o, o.status == "refunded" || o.total > 1e9)',
        {},
        orders_input(),
        False,
    ),
    (
        "nested exists over order lines",
        'input.orders.exists(o, o.lines.exists(l, l.sku == "SKU-9999"))',
        {},
        {"orders": [order(i) for i in range(300)]},
        False,
    ),
    (
        "has and a field",
        'has(input.customer) && input.customer.tier == "gold"',
        {},
        {"customer": {"tier": "gold", "name": "x" * 100}, "blob": "y" * 200_000},
        True,
    ),
]


@pytest.mark.parametrize(
    ("name", "expr", "state", "data", "expected"), REALISTIC, ids=[r[0] for r in REALISTIC]
)
def test_realistic_conditions_on_realistic_data_are_accepted_and_fast(
    name: str, expr: str, state: dict[str, Any], data: dict[str, Any], expected: bool
) -> None:
    assert len(orjson.dumps(data)) <= CEILING
    result, seconds = best_of(expr, state=state, input=data)
    assert result is expected, name
    assert seconds < FAST_S, f"{name}: {seconds * 1000:.1f} ms"


def _cost(expr: str, data: dict[str, Any], state: Any = None) -> int:
    analysis = compile_condition(expr)._analysis
    values = {"state": state, "input": data, "output": None}
    variables = {k: narrow(values[k], paths) for k, paths in analysis.reads.items()}
    return estimate_ns(analysis.tree, variables)


_REFERENCE = (
    "input.a.exists(x, x.matches('^(ab|cd)+e$') && false) || input.b.exists(y, y == -1)",
    {"a": ["abcdabcd"] * 300, "b": list(range(3000))},
)
_slowdown: list[float] = []


def _host_slowdown() -> float:
    """How much slower than the estimate's calibration this host runs right now (>= 1, at most 3).

    The per-operation costs were measured on this 2-core host at a load of 15-25
    (condition_limits.py); with more work beside the tests (CI next to other jobs) CPU time
    per operation grows further. The promise is measured in those units: a reference condition
    mixing regex calls and comprehensions is timed against its own estimate, and the bounds
    below are scaled by that ratio. Capped at 3, so an estimate wrong by more still fails."""
    if not _slowdown:
        expr, data = _REFERENCE
        cond = compile_condition(expr)
        variables = {k: narrow({"input": data}[k], p) for k, p in cond._analysis.reads.items()}
        times = []
        for _ in range(5):
            t0 = time.thread_time_ns()
            cond._program.execute(variables)
            times.append(time.thread_time_ns() - t0)
        _slowdown.append(min(3.0, max(1.0, min(times) / _cost(expr, data))))
    return _slowdown[0]


def _largest(expr: str, make: Any, limit: int = 1 << 17) -> int:
    """The largest n whose data `make(n)` the estimate accepts (within the input ceiling)."""
    lo, hi = 0, 1
    while hi <= limit and len(orjson.dumps(make(hi))) <= CEILING and _cost(expr, make(hi)) <= MAX_COST_NS:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(orjson.dumps(make(mid))) <= CEILING and _cost(expr, make(mid)) <= MAX_COST_NS:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize(
    ("expr", "make", "at_least"),
    [
        ('input.items.exists(x, x.sku == "A1")', lambda n: {"items": items(n)}, 2000),
        (
            'input.tags.filter(t, t.startsWith("p")).size() > 0',
            lambda n: {"tags": [f"p{i}" for i in range(n)]},
            450,
        ),
        ("input.n.map(x, x * 2).size() > 0", lambda n: {"n": list(range(n))}, 300),
        ("input.n.all(x, x >= 0)", lambda n: {"n": list(range(n))}, 5000),
    ],
)
def test_the_estimate_accepts_realistic_list_sizes(expr: str, make: Any, at_least: int) -> None:
    """Before the tight model these were refused from 998, 159, 262 and 8,999 items."""
    assert _largest(expr, make) >= at_least


ADVERSARIAL: list[tuple[str, str, Any]] = [
    (
        "the review's exists in exists on 35 KB",
        "input.a.exists(x, input.b.exists(y, x == y))",
        lambda n: {"a": list(range(n)), "b": [-1] * n},
    ),
    (
        "exists in exists of objects",
        "input.a.exists(x, input.b.exists(y, x == y))",
        lambda n: {"a": items(n), "b": items(n)},
    ),
    ("nested map", "size(input.a.map(x, input.a.map(y, [x, y]))) > 0", lambda n: {"a": list(range(n))}),
    ("map of objects", "size(input.a.map(x, x)) > 0", lambda n: {"a": items(n)}),
    ("filter of lists", "size(input.a.filter(x, true)) > 0", lambda n: {"a": [list(range(20))] * n}),
    ("map accumulating the range", "size(input.a.map(x, input.a)) > 0", lambda n: {"a": list(range(n))}),
    ("string concatenation", "size(" + "+".join(["input.s"] * 20) + ") > 0", lambda n: {"s": "ab" * n}),
    ("regex", "input.s.matches('(a|b)*c')", lambda n: {"s": "ab" * n}),
    # cel-rust compiles the pattern at every call: many short subjects cost the compiles, not
    # the matching (found by the generated test below: 26 us a call, 5x the first estimate)
    ("regex per element", "input.a.exists(x, x.matches('a(b|a)*'))", lambda n: {"a": ["zz"] * n}),
    (
        "alternation per element",
        "input.a.exists(x, x.matches('(foo|bar|baz|qux)+end'))",
        lambda n: {"a": ["zz"] * n},
    ),
    ("contains of a concatenation", "input.s.contains(input.s + input.s + 'c')", lambda n: {"s": "ab" * n}),
    (
        "in over a big list in a comprehension",
        "input.a.exists(x, x in input.b && false)",
        lambda n: {"a": list(range(n)), "b": list(range(n))},
    ),
    (
        "equality of big lists in a comprehension",
        "input.a.exists(x, input.a == input.b && false)",
        lambda n: {"a": list(range(n)), "b": list(range(n))},
    ),
    (
        "read everything",
        "input.a.exists(x, false) || input == {}",
        lambda n: {"a": [{"k": i, "v": [i, 0.5, "s"]} for i in range(n)]},
    ),
    (
        "map keys",
        "input.m.exists(k, input.m[k] == 'zz')",
        lambda n: {"m": {f"k{i}": {"": i} for i in range(n)}},
    ),
]


@pytest.mark.parametrize(("name", "expr", "make"), ADVERSARIAL, ids=[a[0] for a in ADVERSARIAL])
def test_hostile_conditions_at_the_largest_accepted_data_stay_under_the_budget(
    name: str, expr: str, make: Any
) -> None:
    n = _largest(expr, make)
    data = make(n)
    cond = compile_condition(expr)
    times = []
    for _ in range(3):
        t0 = time.thread_time()
        try:
            cond.evaluate(state={}, input=data, output=None)
        except ConditionLimit:
            raise
        except ConditionError:
            pass  # an evaluation error is an outcome too: it ran
        times.append(time.thread_time() - t0)
    slow = _host_slowdown()
    assert min(times) < 0.05 * slow, f"{name}: n={n}, {min(times) * 1000:.1f} ms (host x{slow:.2f})"
    # and twice the data is refused before it runs (the estimate grows with the data)
    bigger = make(max(2 * n, 1))
    if len(orjson.dumps(bigger)) <= CEILING:
        t0 = time.thread_time()
        with pytest.raises(ConditionLimit):
            cond.evaluate(state={}, input=bigger, output=None)
        assert time.thread_time() - t0 < 0.1


def test_the_reviews_cases_stay_refused() -> None:
    pair = {"a": list(range(3500)), "b": [-1] * 3500}  # 35 KB: 4.9 s before issue 19
    with pytest.raises(ConditionLimit) as exc:
        compile_condition("input.a.exists(x, input.b.exists(y, x == y))").evaluate(
            state={}, input=pair, output=None
        )
    assert exc.value.rule == "condition_cost"
    big = {"a": list(range(26000)), "b": [-1] * 26000}  # 256 KB
    with pytest.raises(ConditionLimit):
        compile_condition("input.a.exists(x, input.b.exists(y, x == y))").evaluate(
            state={}, input=big, output=None
        )
    six = "[1,2,3,4,5,6,7,8,9,10]" + ".map(a, [1,2,3,4,5,6,7,8,9,10]" * 5 + ".map(b, b))" * 5 + ".size() > 0"
    with pytest.raises(ConditionLimit) as reg:
        compile_condition(six)
    assert reg.value.rule == "condition_nesting"


def test_estimating_costs_far_less_than_evaluating() -> None:
    data = {"items": items(2000)}
    cond = compile_condition('input.items.exists(x, x.sku == "A1")')
    analysis = cond._analysis
    variables = {k: narrow({"input": data}[k], p) for k, p in analysis.reads.items()}
    est, run = [], []
    for _ in range(5):
        t0 = time.thread_time()
        estimate_ns(analysis.tree, variables)
        est.append(time.thread_time() - t0)
        t0 = time.thread_time()
        cond._program.execute(variables)
        run.append(time.thread_time() - t0)
    assert statistics.median(est) < statistics.median(run) / 4


def test_size_and_has_hand_the_program_placeholders_with_the_same_answers() -> None:
    data = orders_input()
    for expr in (
        "size(input.orders) > 10",
        f"input.orders.size() == {len(data['orders'])}",
        "has(input.orders) && has(input.kind)",
        "has(input.zz)",
        "size(input) == 2",
        "size(input.kind) == 1",
        "size(input.orders) > 1 && has(input.orders)",
    ):
        expected = compile_condition(expr)._program.execute({"input": data})
        result, _ = best_of(expr, state={}, input=data)
        assert result is expected, expr
    small = {"orders": data["orders"][:5], "kind": "a"}
    for expr in ("size(input.orders) > 1 && input.orders[0].status == 'paid'", "size(input.kind) == 1"):
        assert compile_condition(expr).evaluate(state={}, input=small) is True
    with pytest.raises(ConditionError):  # size of an int stays an error
        compile_condition("size(input.n) > 0").evaluate(state={}, input={"n": 3}, output=None)


# ---- generated: whenever the estimate accepts, the evaluation stays under the budget -------------
_ELEMENTS = {
    "int": st.integers(-5, 5),
    "float": st.floats(-10, 10, allow_nan=False),
    "str": st.text("abp", max_size=12),
    "obj": st.fixed_dictionaries({"k": st.integers(0, 3), "s": st.text("ab", max_size=6)}),
    "list": st.lists(st.integers(0, 3), max_size=12),
}
_PREDICATES = {
    "int": ["x > 0", "x == 3", "x in input.b", "x * 2 < 7"],
    "float": ["x > 0.5", "x == 1.0"],
    "str": ["x.startsWith('p')", "x.contains('ab')", "size(x) > 3", "x + x == 'aa'", "x.matches('a(b|a)*')"],
    "obj": ["x.k == 1", "has(x.s) && x.s == 'ab'", "x == input.a[0]", "size(x.s) > 2"],
    "list": ["size(x) > 3", "1 in x", "x.exists(y, y == 2)", "x == []"],
}


@st.composite
def _case(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(sorted(_ELEMENTS)))
    n = draw(st.sampled_from([0, 1, 10, 100, 300, 1000, 3000, 10000]))
    element = draw(_ELEMENTS[kind])
    a = [element] * n
    b = draw(st.sampled_from([[], list(range(10)), list(range(1000))]))
    pred = draw(st.sampled_from(_PREDICATES[kind]))
    other = draw(st.sampled_from(_PREDICATES[kind]))
    form = draw(
        st.sampled_from(
            [
                "input.a.{m}(x, {p})",
                "size(input.a.filter(x, {p})) >= 0",
                "size(input.a.map(x, {p})) >= 0",
                "input.a.map(x, x).exists(x, {p})",
                "input.a.exists(x, input.a.exists(y, {p} && {q}))",
                "input.a.filter(x, {p}).exists(x, {q})",
                "size(input.a) > 2 && input.a.{m}(x, {p})",
                "input.a.{m}(x, {p}) || input.a == input.a",
                "size(input.a + input.a) > 0",
                "input.a.exists(x, input.b.exists(y, y == 0 && {p}))",
            ]
        )
    )
    macro = draw(st.sampled_from(["all", "exists", "exists_one"]))
    expr = form.format(m=macro, p=pred, q=other.replace("x", "y") if "exists(y" in form else other)
    return expr, {"a": a, "b": b}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_whenever_the_estimate_accepts_the_evaluation_stays_under_the_budget(
    case: tuple[str, dict[str, Any]],
) -> None:
    expr, data = case
    if len(orjson.dumps(data)) > CEILING:
        return
    try:
        cond = compile_condition(expr)
    except ConditionError:
        return  # refused at registration (nesting) or not CEL for this element kind
    cost = _cost(expr, data)
    if cost > MAX_COST_NS:
        return
    variables = {k: narrow({"input": data}[k], p) for k, p in cond._analysis.reads.items()}
    times = []
    for _ in range(2):
        t0 = time.thread_time_ns()
        with contextlib.suppress(Exception):  # an evaluation error (no such overload, ...) ran too
            cond._program.execute(variables)
        times.append(time.thread_time_ns() - t0)
    # the budget is 40 ms of estimate; the promise is under 50 ms of CPU
    event(f"accepted, estimate {'>= 10' if cost >= 10_000_000 else '< 10'} ms")
    slow = _host_slowdown()
    assert min(times) < 50_000_000 * slow, (
        f"{expr} on n={len(data['a'])}: {min(times) / 1e6:.1f} ms, estimate {cost / 1e6:.1f} ms (host x{slow:.2f})"
    )
    assert min(times) <= max(cost, 200_000) * 1.5 * slow, (
        f"{expr}: {min(times) / 1e6:.2f} ms > estimate {cost / 1e6:.2f} ms (host x{slow:.2f})"
    )


# ---- generated: narrowing never changes an answer ----------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.5, -1.5]) | st.text("ab", max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)
    ),
    max_leaves=12,
)
_paths = st.sampled_from(["input", "input.a", "input.b", "input.a.b", "input.a.c", "input.c.a"])
_uses = st.sampled_from(
    [
        "size({p}) > 1",
        "{p}.size() == 2",
        "has({p}.a)",
        "{p} == {{'a': 1}}",
        "{p}.exists(x, x == 1)",
        "{p}.exists(x, x.a == 1)",
        "{p}.all(x, has(x.b))",
        "{p}.exists(x, size(x) == 1)",
        "{p}.exists(x, x.exists(y, y.a == 'a'))",
        "{p}.map(x, x.b).size() > 0",
        "{p}.filter(x, x.a == true).size() == 1",
        "{p}[0] == 1",
        "{p}.exists(x, has(x.a) && x.a.b == 1)",
        "1 in {p}",
    ]
)


@settings(max_examples=300, deadline=None)
@given(_json, st.lists(st.tuples(_uses, _paths), min_size=1, max_size=3), st.sampled_from(["&&", "||"]))
def test_narrowing_gives_the_same_answer_as_the_whole_value(
    data: Any, uses: list[tuple[str, str]], join: str
) -> None:
    expr = f" {join} ".join(u.format(p=p) for u, p in uses)
    cond = compile_condition(expr)
    variables = {k: narrow({"input": data}.get(k), p) for k, p in cond._analysis.reads.items()}

    def run(values: dict[str, Any]) -> Any:
        try:
            return ("ok", cond._program.execute(values))
        except Exception:  # the binding raises several types; an error must stay an error
            return ("error", None)

    assert run(variables) == run({"input": data, "state": None, "output": None}), (expr, variables)
