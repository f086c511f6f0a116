"""The cost model of route conditions (processors/engine/condition_limits.py) against the real
evaluation, on this machine.

    .venv/bin/python benchmarks/cel_limits_bench.py [--repeat 5] [--coefficients] [--json]

Three tables:

- `--coefficients`: the per-operation costs of the `cel` binding the model's constants bound
  (conversion, deep copy, a comprehension step, the map/filter accumulator, `in`), each the
  median of `--repeat` timings of a difference of two programs; compare with the constants.
- the realistic corpus: conditions a workflow writes, on realistic data (orders at the input
  ceiling, small objects, tags, ints): estimate, the evaluation's time and their ratio, and
  the largest list the estimate accepts for the condition (the list grown, the rest kept).
- the hostile corpus: families of conditions built to be slow (conversion-bound reads,
  quadratic map/filter, nested comprehensions, a linear operation inside one, concatenation
  chains, regular expressions, chains up to the length limit), the data grown (each element
  shape) to the largest the estimate accepts within the engine's ceilings (input 256 KiB),
  timed at that size. The estimate must stay above the time (ratio < 1) and the worst
  accepted evaluation under 50 ms.

Times are the evaluation's CPU time (`time.thread_time`: the binding runs on the calling
thread and holds the GIL), the fastest of `--repeat` (the least noisy on a shared host),
with the median wall time beside it. Ratios are CPU time / estimate.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import cel
import orjson

from processors.engine.condition_limits import MAX_COST_NS, ConditionLimit, estimate_ns, narrow
from processors.engine.conditions import compile_condition

CEILING = 256 * 1024  # max_input_bytes / max_payload_bytes


# ---- per-operation coefficients ------------------------------------------------------------------
def _cpu(program: Any, variables: dict[str, Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.thread_time_ns()
        program.execute(variables)
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times)


def _per(expr: str, make: Callable[[int], Any], n1: int, n2: int, repeat: int) -> float:
    program = cel.compile(expr)
    a, b = {"input": make(n1)}, {"input": make(n2)}
    return (_cpu(program, b, repeat) - _cpu(program, a, repeat)) / (n2 - n1)


ELEMENTS: dict[str, Callable[[int], Any]] = {
    "int": lambda i: i,
    "float": lambda i: i + 0.5,
    "null": lambda i: None,
    "str 1": lambda i: "s",
    "str 1000": lambda i: "s" * 1000,
    "{}": lambda i: {},
    "[]": lambda i: [],
    '{"k": 1}': lambda i: {"k": 1},
    "obj3": lambda i: {"sku": f"B{i}", "qty": i, "price": 9.5},
}
_FIFTY = "[" + ",".join(["1"] * 50) + "]"


def coefficients(repeat: int) -> list[dict[str, Any]]:
    """Per element: conversion, a comprehension step on top of it, a deep copy (a field selected
    50 times), and the map/filter accumulator per element held per step."""
    rows = []
    for name, make in ELEMENTS.items():

        def listed(n: int, make: Callable[[int], Any] = make) -> list[Any]:
            return [make(i) for i in range(n)]

        conv = _per("true", listed, 500, 3000, repeat)
        step = _per("input.exists(x, false)", listed, 500, 3000, repeat) - conv
        copy = (
            _per(_FIFTY + ".exists(y, size(input.a) < 0)", lambda n: {"a": listed(n)}, 50, 400, repeat) / 50
        )
        small, large = listed(300), listed(600)
        acc_prog, base_prog = (
            cel.compile("size(input.filter(x, true)) > 0"),
            cel.compile("input.exists(x, false)"),
        )
        extra = [
            _cpu(acc_prog, {"input": d}, repeat) - _cpu(base_prog, {"input": d}, repeat)
            for d in (small, large)
        ]
        accumulate = (extra[1] - extra[0]) / ((600 * 601 - 300 * 301) / 2)
        rows.append({"element": name, "convert": conv, "step": step, "copy": copy, "accumulate": accumulate})
    return rows


# ---- the realistic corpus -----------------------------------------------------------------------
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


def items(n: int) -> list[dict[str, Any]]:
    return [{"sku": f"B{i}", "qty": i % 7, "price": 9.99 + i} for i in range(n)]


def tags(n: int) -> list[str]:
    return [f"{'p' if i % 10 == 0 else 't'}ag{i}" for i in range(n)]


def _at_ceiling(make: Callable[[int], Any]) -> int:
    lo, hi = 0, 1
    while len(orjson.dumps(make(hi))) <= CEILING:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(orjson.dumps(make(mid))) <= CEILING else (lo, mid)
    return lo


STATE = {"score": 0.7, "history": [{"turn": i, "text": "x" * 200} for i in range(200)]}
# (name, condition, state, input of n list items, the n realistic for it)
REALISTIC: list[tuple[str, str, Any, Callable[[int], Any], int]] = [
    (
        "exists over small objects",
        'input.items.exists(x, x.sku == "A1")',
        {},
        lambda n: {"items": items(n)},
        2000,
    ),
    (
        "filter over strings",
        'input.tags.filter(t, t.startsWith("p")).size() > 0',
        {},
        lambda n: {"tags": tags(n)},
        400,
    ),
    (
        "size over orders",
        "size(input.orders) > 10",
        {},
        lambda n: {"orders": [order(i) for i in range(n)], "kind": "a"},
        -1,
    ),
    (
        "scalars and a small in",
        'state.score > 0.5 && input.kind in ["a","b"]',
        STATE,
        lambda n: {"orders": [order(i) for i in range(n)], "kind": "a"},
        -1,
    ),
    ("map over ints", "input.n.map(x, x * 2).exists(y, y == 598)", {}, lambda n: {"n": list(range(n))}, 300),
    ("all over ints", "input.n.all(x, x >= 0)", {}, lambda n: {"n": list(range(n))}, 5000),
    (
        "exists over orders' fields",
        'input.orders.exists(o, o.status == "refunded" || o.total > 1e9)',
        {},
        lambda n: {"orders": [order(i) for i in range(n)]},
        -1,
    ),
    (
        "nested exists over order lines",
        'input.orders.exists(o, o.lines.exists(l, l.sku == "SKU-9999"))',
        {},
        lambda n: {"orders": [order(i) for i in range(n)]},
        300,
    ),
    (
        "has and a field",
        'has(input.customer) && input.customer.tier == "gold"',
        {},
        lambda n: {"customer": {"tier": "gold", "name": "x" * 100}, "blob": "y" * n},
        200_000,
    ),
    (
        "filter of objects by a field",
        "size(input.items.filter(x, x.qty > 5)) < 100",
        {},
        lambda n: {"items": items(n)},
        200,
    ),
]


# ---- the hostile corpus -------------------------------------------------------------------------
SHAPES: dict[str, Callable[[int], Any]] = {
    "int": lambda i: i,
    "float": lambda i: i + 0.5,
    "str": lambda i: f"s{i}",
    "obj": lambda i: {"": i},
    "obj3": lambda i: {"a": i, "b": "x", "c": None},
    "list": lambda i: [i],
    "empty_obj": lambda i: {},
}


def _data(shape: str, n: int) -> dict[str, Any]:
    make = SHAPES[shape]
    elements = [make(i) for i in range(n)]
    return {
        "a": elements,
        "b": list(elements),
        "m": {f"k{i}": make(i) for i in range(n)},
        "s": "ab" * n,
        "p": "(a|b)*c",
    }


def _fill(template: str, join: str, wrap: str = "{}") -> str:
    """As many `template` terms (numbered) joined by `join` as the registration limits take."""
    terms: list[str] = []
    while True:
        expr = wrap.format(join.join([*terms, template.format(i=len(terms))]))
        try:
            compile_condition(expr)
        except ConditionLimit:
            return wrap.format(join.join(terms))
        terms.append(template.format(i=len(terms)))


FAMILIES: list[tuple[str, str, tuple[str, ...]]] = [
    ("read everything", "size(input) >= 0 && input != {}", tuple(SHAPES)),
    ("one comprehension", "input.a.exists(x, x == 'zz')", tuple(SHAPES)),
    ("all with a field", "input.a.all(x, has(x.a) || true)", ("obj3",)),
    ("map", "size(input.a.map(x, x)) >= 0", ("int", "str", "obj", "obj3")),
    ("filter", "size(input.a.filter(x, true)) >= 0", ("int", "obj", "list")),
    ("filter reading the element", "size(input.a.filter(x, x == x)) >= 0", ("int", "str", "obj3", "list")),
    ("map with predicate", "size(input.a.map(x, true, [x, x])) >= 0", ("int",)),
    ("nested exists", "input.a.exists(x, input.b.exists(y, x == y && x == 'zz'))", ("int", "str", "obj")),
    ("nested map", "size(input.a.map(x, input.b.map(y, y))) >= 0", ("int",)),
    ("in inside a comprehension", "input.a.exists(x, x in input.b && false)", ("int", "str", "obj")),
    ("equality inside a comprehension", "input.a.exists(x, input.a == input.b && false)", ("int", "obj")),
    ("map range of a map", "input.a.map(x, input.a).exists(l, l == input.b && false)", ("int",)),
    ("map keys", "input.m.exists(k, input.m[k] == 'zz')", ("int", "obj")),
    ("a large result that is not a bool", "input.a.map(x, input.a)", ("int", "obj")),
    ("index by a computed key in a comprehension", "input.a.exists(x, input.b[0] == x && false)", ("int",)),
    ("string concatenation chain", _fill("input.s", "+", "size({}) >= 0"), ("int",)),
    ("list concatenation chain", _fill("input.a", "+", "size({}) >= 0"), ("int", "obj")),
    ("regex on data", "input.s.matches('(a|b)*c')", ("int",)),
    ("regex from data", "input.s.matches(input.p)", ("int",)),
    ("contains", "input.s.contains(input.s + 'c')", ("int",)),
    ("comprehensions up to the length limit", _fill("input.a.exists(x,x=={i})", "||"), ("int", "obj")),
    ("nested, up to the length limit", _fill("input.a.exists(x,input.b.exists(y,x=={i}))", "||"), ("int",)),
    ("a field of each element", "input.a.exists(x, x.a == 'zz')", ("obj3",)),
    ("nested over elements", "input.a.exists(x, x.exists(y, y == -1))", ("list",)),
]


# ---- measuring ----------------------------------------------------------------------------------
def estimate(expr: str, state: Any, data: Any) -> int:
    analysis = compile_condition(expr)._analysis
    values = {"state": state, "input": data, "output": None}
    variables = {name: narrow(values[name], paths) for name, paths in analysis.reads.items()}
    return estimate_ns(analysis.tree, variables)


def _fits(expr: str, state: Any, data: Any) -> bool:
    return len(orjson.dumps(data)) <= CEILING and estimate(expr, state, data) <= MAX_COST_NS


def largest(expr: str, state: Any, make: Callable[[int], Any], limit: int = 1 << 20) -> int:
    """The largest n whose data `make(n)` the estimate accepts and the ceiling holds (-1: none)."""
    if not _fits(expr, state, make(0)):
        return -1
    lo, hi = 0, 1
    while hi <= limit and _fits(expr, state, make(hi)):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(expr, state, make(mid)) else (lo, mid)
    return lo


def timed(expr: str, state: Any, data: Any, repeat: int) -> tuple[float, float, str]:
    """(CPU ms: the fastest, wall ms: the median, outcome) of running the program on what
    `Condition.evaluate` hands it (the narrowed variables), whether the estimate accepts or not."""
    cond = compile_condition(expr)
    values = {"state": state, "input": data, "output": None}
    variables = {name: narrow(values[name], paths) for name, paths in cond._analysis.reads.items()}
    cpu, wall, outcome = [], [], ""
    for _ in range(repeat):
        t0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            outcome = str(cond._program.execute(variables))[:20]
        except Exception as exc:  # the binding raises several types
            outcome = f"error: {str(exc)[:40]}"
        cpu.append(time.thread_time_ns() - t0)
        wall.append(time.perf_counter_ns() - w0)
    return min(cpu) / 1e6, statistics.median(wall) / 1e6, outcome


def realistic(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name, expr, state, make, n in REALISTIC:
        n = n if n >= 0 else _at_ceiling(make)
        data = make(n)
        cost = estimate(expr, state, data)
        cpu, wall, outcome = timed(expr, state, data, repeat)
        rows.append(
            {
                "name": name,
                "expr": expr,
                "n": n,
                "bytes": len(orjson.dumps(data)),
                "estimate_ms": round(cost / 1e6, 3),
                "accepted": cost <= MAX_COST_NS,
                "cpu_ms": round(cpu, 3),
                "wall_ms": round(wall, 3),
                "ratio": round(cpu * 1e6 / cost, 3),
                "outcome": outcome,
                "largest_n": largest(expr, state, make),
            }
        )
    return rows


def hostile(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for family, expr, shapes in FAMILIES:
        for shape in shapes:
            n = largest(expr, {}, lambda n, shape=shape: _data(shape, n), limit=1 << 17)
            if n < 0:
                rows.append({"family": family, "shape": shape, "n": -1, "cpu_ms": None})
                continue
            data = _data(shape, n)
            cost = estimate(expr, {}, data)
            cpu, wall, outcome = timed(expr, {}, data, repeat)
            rows.append(
                {
                    "family": family,
                    "shape": shape,
                    "n": n,
                    "bytes": len(orjson.dumps(data)),
                    "estimate_ms": round(cost / 1e6, 3),
                    "cpu_ms": round(cpu, 3),
                    "wall_ms": round(wall, 3),
                    "ratio": round(cpu * 1e6 / cost, 3),
                    "outcome": outcome,
                }
            )
    return rows


def review() -> dict[str, str]:
    out = {}
    six_maps = (
        "[1,2,3,4,5,6,7,8,9,10]" + ".map(a, [1,2,3,4,5,6,7,8,9,10]" * 5 + ".map(b, b))" * 5 + ".size() > 0"
    )
    try:
        compile_condition(six_maps)
        out["six_nested_maps"] = "accepted"
    except ConditionLimit as exc:
        out["six_nested_maps"] = f"refused at registration: {exc.rule}"
    for label, n in (("35KB", 3500), ("256KB", 26000)):
        try:
            compile_condition("input.a.exists(x, input.b.exists(y, x == y))").evaluate(
                state={}, input={"a": list(range(n)), "b": [-1] * n}, output=None
            )
            out[f"exists_in_exists_{label}"] = "evaluated"
        except ConditionLimit as exc:
            out[f"exists_in_exists_{label}"] = f"refused at evaluation: {exc.rule}"
    return out


def estimating_cost(repeat: int) -> dict[str, float]:
    """The estimate's own time against the evaluation's, on the heaviest realistic data."""
    expr, data = 'input.items.exists(x, x.sku == "A1")', {"items": items(2000)}
    cond = compile_condition(expr)
    analysis = cond._analysis
    est, run = [], []
    for _ in range(repeat):
        t0 = time.thread_time_ns()
        variables = {k: narrow({"input": data}.get(k), p) for k, p in analysis.reads.items()}
        estimate_ns(analysis.tree, variables)
        est.append(time.thread_time_ns() - t0)
        t0 = time.thread_time_ns()
        cond._program.execute(variables)
        run.append(time.thread_time_ns() - t0)
    return {"narrow_and_estimate_ms": min(est) / 1e6, "execute_ms": min(run) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--coefficients", action="store_true", help="also measure the per-operation costs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    coefs = coefficients(args.repeat) if args.coefficients else []
    real, bad = realistic(args.repeat), hostile(args.repeat)
    accepted = [r for r in real + bad if r.get("cpu_ms") is not None and r.get("accepted", True)]
    worst = max(accepted, key=lambda r: r["cpu_ms"])
    result = {
        "coefficients": coefs,
        "realistic": real,
        "hostile": bad,
        "worst": worst,
        "review": review(),
        "estimating": estimating_cost(args.repeat),
    }
    if args.json:
        print(orjson.dumps(result).decode())
        return
    if coefs:
        print("per element (ns, CPU)        convert    step    copy  accumulate")
        for c in coefs:
            print(
                f"  {c['element']:24s} {c['convert']:8.0f} {c['step']:7.0f} {c['copy']:7.0f} {c['accumulate']:10.1f}"
            )
    print(
        "\nrealistic corpus                 n      bytes  estimate ms   cpu ms  wall ms  ratio  largest n accepted"
    )
    for r in real:
        mark = "" if r["accepted"] else "  REFUSED"
        print(
            f"  {r['name']:28s} {r['n']:7d} {r['bytes']:8d} {r['estimate_ms']:10.2f} {r['cpu_ms']:8.2f}"
            f" {r['wall_ms']:8.2f} {r['ratio']:6.3f}  {r['largest_n']:9d}{mark}"
        )
    print(
        "\nhostile corpus (data grown to the largest accepted)        n    bytes  estimate ms   cpu ms  wall ms  ratio"
    )
    for r in bad:
        if r["cpu_ms"] is None:
            print(f"  {r['family'][:40]:40s} {r['shape']:9s} refused on any data")
            continue
        flag = "  OVER" if r["ratio"] > 1 else ""
        print(
            f"  {r['family'][:40]:40s} {r['shape']:9s} {r['n']:7d} {r['bytes']:7d} {r['estimate_ms']:10.2f}"
            f" {r['cpu_ms']:8.2f} {r['wall_ms']:8.2f} {r['ratio']:6.3f}{flag}"
        )
    ratios = [r["ratio"] for r in bad if r["cpu_ms"] is not None]
    real_ratios = [r["ratio"] for r in real if r["accepted"]]
    print(
        f"\nhostile ratios: max {max(ratios):.3f}, median {statistics.median(ratios):.3f}; "
        f"realistic (accepted) ratios: min {min(real_ratios):.3f}, median {statistics.median(real_ratios):.3f}"
    )
    print(
        f"worst accepted evaluation: {worst['cpu_ms']:.2f} ms CPU, {worst['wall_ms']:.2f} ms wall "
        f"({worst.get('family', worst.get('name'))}, {worst.get('shape', '')} n={worst['n']}); "
        f"budget {MAX_COST_NS / 1e6:.0f} ms of estimate; target < 50 ms"
    )
    e = result["estimating"]
    print(
        f"estimating (narrow + estimate) {e['narrow_and_estimate_ms']:.2f} ms vs executing {e['execute_ms']:.2f} ms"
    )
    for k, v in result["review"].items():
        print(f"review example {k}: {v}")


if __name__ == "__main__":
    main()
