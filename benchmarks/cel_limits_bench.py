"""The worst case of a route condition the limits accept (processors/engine/condition_limits.py).

    .venv/bin/python benchmarks/cel_limits_bench.py [--repeat 5] [--json]

For each family of hostile conditions (conversion-bound reads of small objects, floats and
strings; one comprehension; quadratic map/filter; two nested comprehensions; a linear
operation inside a comprehension; concatenation chains; regular expressions; a chain of
comprehensions up to the length limit; a map range), the data is grown (each element
shape) to the largest the cost estimate accepts, within the engine's ceilings (input and
output 256 KiB), and the evaluation (`Condition.evaluate`: narrowing, estimate, CEL) is
timed: the median of `--repeat`. Prints each case with its time, its estimate and their
ratio (< 1: the estimate is an upper bound), the worst accepted time, and the review's two
examples (six nested `map`s: refused at registration; `exists` in `exists` on 35 KB:
refused at evaluation). The target: the worst accepted evaluation under 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from processors.engine.condition_limits import MAX_COST_NS, ConditionLimit, estimate_ns, narrow
from processors.engine.conditions import compile_condition
from processors.engine.errors import ConditionError

CEILING = 256 * 1024  # max_input_bytes / max_payload_bytes

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
    items = [make(i) for i in range(n)]
    return {
        "a": items,
        "b": list(items),
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
    ("read everything", "size(input) >= 0", tuple(SHAPES)),
    ("one comprehension", "input.a.exists(x, x == 'zz')", tuple(SHAPES)),
    ("all with a field", "input.a.all(x, has(x.a) || true)", ("obj3",)),
    ("map", "size(input.a.map(x, x)) >= 0", ("int", "str", "obj")),
    ("filter", "size(input.a.filter(x, true)) >= 0", ("int", "obj")),
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
]


def _accepted(expr: str, data: dict[str, Any]) -> int | None:
    """The estimate when the evaluation would run, else None."""
    tree = compile_condition(expr)._analysis
    variables = {name: narrow(data if name == "input" else None, paths) for name, paths in tree.reads.items()}
    cost = estimate_ns(tree.tree, variables)
    return cost if cost <= MAX_COST_NS else None


def largest(expr: str, shape: str) -> tuple[int, dict[str, Any]] | None:
    """The largest element count whose data the estimate accepts (and fits the ceiling)."""
    lo, hi = 0, 1
    while hi < 1_000_000:
        data = _data(shape, hi)
        if len(orjson.dumps(data)) > CEILING or _accepted(expr, data) is None:
            break
        lo, hi = hi, hi * 2
    if lo == 0 and _accepted(expr, _data(shape, 0)) is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        data = _data(shape, mid)
        if len(orjson.dumps(data)) <= CEILING and _accepted(expr, data) is not None:
            lo = mid
        else:
            hi = mid
    return lo, _data(shape, lo)


def timed(expr: str, data: dict[str, Any], repeat: int) -> tuple[float, str]:
    cond = compile_condition(expr)
    times, outcome = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            outcome = str(cond.evaluate(state={}, input=data, output=None))
        except ConditionError as exc:
            outcome = f"error: {exc.message[:60]}"
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for family, expr, shapes in FAMILIES:
        for shape in shapes:
            found = largest(expr, shape)
            if found is None:
                rows.append(
                    {"family": family, "shape": shape, "n": 0, "ms": None, "note": "refused on any data"}
                )
                continue
            n, data = found
            ms, outcome = timed(expr, data, args.repeat)
            estimate = _accepted(expr, data) or 0
            rows.append(
                {
                    "family": family,
                    "shape": shape,
                    "n": n,
                    "bytes": len(orjson.dumps(data["a"])),
                    "ms": round(ms, 2),
                    "estimate_ms": round(estimate / 1e6, 2),
                    "ratio": round(ms * 1e6 / estimate, 3) if estimate else None,
                    "outcome": outcome,
                }
            )
    worst = max((r for r in rows if r["ms"] is not None), key=lambda r: r["ms"])
    six_maps = (
        "[1,2,3,4,5,6,7,8,9,10]" + ".map(a, [1,2,3,4,5,6,7,8,9,10]" * 5 + ".map(b, b))" * 5 + ".size() > 0"
    )
    review = {}
    try:
        compile_condition(
            "[1,2,3,4,5,6,7,8,9,10]" + "".join(f".map(x{i}, x{i})" for i in range(6)) + ".size() > 0"
        )
        review["six_chained_maps"] = "accepted (chained, not nested)"
    except ConditionLimit as exc:
        review["six_chained_maps"] = f"refused: {exc.rule}"
    try:
        compile_condition(six_maps)
        review["six_nested_maps"] = "accepted"
    except ConditionLimit as exc:
        review["six_nested_maps"] = f"refused at registration: {exc.rule}"
    pair = list(range(3500))
    try:
        compile_condition("input.a.exists(x, input.b.exists(y, x == y))").evaluate(
            state={}, input={"a": pair, "b": [-1] * 3500}, output=None
        )
        review["exists_in_exists_35kb"] = "evaluated"
    except ConditionLimit as exc:
        review["exists_in_exists_35kb"] = f"refused at evaluation: {exc.rule}"
    if args.json:
        print(orjson.dumps({"rows": rows, "worst": worst, "review": review}).decode())
        return
    for r in rows:
        if r["ms"] is None:
            print(f"{r['family']:40s} {r['shape']:9s} {r['note']}")
        else:
            print(
                f"{r['family']:40s} {r['shape']:9s} n={r['n']:7d} {r['bytes']:7d} B  {r['ms']:8.2f} ms"
                f"  estimate {r['estimate_ms']:7.2f} ms  ratio {r['ratio']}"
            )
    print(
        f"\nworst accepted evaluation: {worst['ms']} ms ({worst['family']}, {worst['shape']}, n={worst['n']}); "
        f"budget {MAX_COST_NS / 1e6:.0f} ms of estimate; target < 50 ms"
    )
    for k, v in review.items():
        print(f"review example {k}: {v}")


if __name__ == "__main__":
    main()
